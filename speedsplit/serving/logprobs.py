"""Logprobs as the OpenAI completions API gives them, for speedsplit's own servers (hf_generate,
the reference server): a request's `logprobs`, `echo` and `return_tokens_as_token_ids`, and the
`logprobs` object of an answer (tokens, their logprobs, the top ones at each position).
"""

from __future__ import annotations

from dataclasses import dataclass

from speedsplit.core.errors import BadRequest
from speedsplit.core.quality import ID_PREFIX

MAX_LOGPROBS = 20  # as OpenAI's completions allow


@dataclass(frozen=True)
class Asked:
    """What a request asks for beyond its text."""

    top: int | None = None  # top logprobs per position (None: no logprobs)
    as_ids: bool = False  # tokens named "token_id:N"
    echo: bool = False  # the prompt's own logprobs, before any output


def asked(body: dict) -> Asked:
    """The request's logprob fields, or BadRequest naming what is wrong."""
    top = body.get("logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS):
        raise BadRequest(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, not {top!r}")
    for key in ("echo", "return_tokens_as_token_ids"):
        if not isinstance(body.get(key, False), bool):
            raise BadRequest(f"{key} must be true or false, not {body.get(key)!r}")
    if body.get("echo") and top is None:
        raise BadRequest("echo is served with logprobs only (the prompt's scores)")
    return Asked(top=top, as_ids=bool(body.get("return_tokens_as_token_ids")), echo=bool(body.get("echo")))


def logprobs_object(
    ids: list[int], logprobs: list[float | None], tops: list[dict[int, float] | None], decode, as_ids: bool
) -> dict:
    """The answer's `logprobs`: each token named (its text, or "token_id:N"), its logprob, the
    top ones at its position, and where its text starts."""

    def name(t: int) -> str:
        return f"{ID_PREFIX}{t}" if as_ids else decode([t])

    offsets, at = [], 0
    for t in ids:
        offsets.append(at)
        at += len(decode([t]))
    return {
        "tokens": [name(t) for t in ids],
        "token_logprobs": list(logprobs),
        "top_logprobs": [None if d is None else {name(t): lp for t, lp in d.items()} for d in tops],
        "text_offset": offsets,
    }


def top_of(row, k: int) -> dict[int, float]:
    """The k highest log-probabilities of a row of log-softmaxed logits (a torch tensor)."""
    values, index = row.topk(k)
    return {int(i): float(v) for i, v in zip(index.tolist(), values.tolist())}
