"""A /v1/completions request as speedsplit's `generate()` server takes it (hf_generate.py):
checked before anything is queued, each mistake one HTTP 400 naming it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from speedsplit.core.errors import BadRequest
from speedsplit.serving import logprobs

DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
SEED_LIMIT = 2**63


@dataclass
class Done:
    """The end of a row's stream: why it ended ("length" or "stop")."""

    finish: str


@dataclass
class Request:
    """One completion request waiting for, or in, a batch."""

    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    asked: logprobs.Asked = field(default_factory=logprobs.Asked)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)  # (token id, logprobs), then Done or an exception
    cancelled: bool = False  # its client left: its row stops at the next step
    sent: int = 0  # tokens handed to its stream (worker thread only)


def _int(body: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low} and {high}, not {value}")
    return value


def _number(body: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number, not {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise BadRequest(f"{key} must be in {'(' if low_open else '['}{low}, {high}], not {value}")
    return float(value)


def _prompt_ids(prompt, tokenizer) -> list[int]:
    """The prompt's token ids: a text, or token ids (as lm-evaluation-harness sends them), or a
    batch of one of either (a batch of more is refused: one request, one answer)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenizer(prompt)["input_ids"]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < len(tokenizer) for t in prompt):
            raise BadRequest(f"a prompt token id is outside the vocabulary (0 to {len(tokenizer) - 1})")
        return prompt
    raise BadRequest("prompt must be a non-empty string or a list of token ids (a batch of one at most)")


def parse_request(body, served_name: str, tokenizer, context: int) -> Request:
    """A /v1/completions body as a Request, or BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not a {type(body).__name__}")
    if body.get("model") not in (None, served_name):
        raise BadRequest(f"unknown model {body.get('model')!r} (this server serves {served_name!r})")
    asked = logprobs.asked(body)
    if asked.echo and body.get("stream"):
        raise BadRequest("echo scoring is answered whole (stream: false)")
    if body.get("stream") is not True and not asked.echo:
        raise BadRequest("only streaming requests are served (stream: true), and echo scoring")
    prompt_ids = _prompt_ids(body.get("prompt"), tokenizer)
    room = context - len(prompt_ids)
    if room < 1:
        raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model's context is {context}")
    max_tokens = _int(body, "max_tokens", min(DEFAULT_MAX_TOKENS, room), 1, room)
    if not isinstance(body.get("ignore_eos", False), bool):
        raise BadRequest(f"ignore_eos must be true or false, not {body.get('ignore_eos')!r}")
    min_tokens = max_tokens if body.get("ignore_eos") else _int(body, "min_tokens", 0, 0, max_tokens)
    return Request(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=_int(body, "seed", None, 0, SEED_LIMIT - 1),
        asked=asked,
    )
