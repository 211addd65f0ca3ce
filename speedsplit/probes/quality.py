"""The quality probe: what a served stack says, beside how fast it says it (core/quality.py).

Against a ready server (its URL and model id), after a cell's measured phase: greedy
continuations of the starts of held-out windows, each forced to the same length in the stack's
request dialect (probes/loadspec.REQUEST_FORMATS, as the speed cells are), with token ids and top
logprobs where the server serves them; then the windows scored through their prompt logprobs
(`echo` with `logprobs`, the OpenAI completions way that lm-evaluation-harness scores with too).
A server that refuses the logprob fields is asked again without them, and the record says what
it answered: that stack then has agreement but no perplexity. Requests go one at a time: the
probe measures answers, not speed.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from speedsplit.core import apikey, procs
from speedsplit.core.quality import ID_PREFIX, QualityOutput, QualityProbe, QualityRecord, QualityWindow
from speedsplit.models.prompts import exact_prompt, load_tokenizer
from speedsplit.probes import quality_tasks
from speedsplit.probes.loadspec import LoadSpec, request_body


def _logprob_fields(k: int) -> list[dict]:
    """What a server is asked beyond a plain completion, most first: top logprobs with tokens as
    ids, top logprobs, nothing (a server that refuses one is asked the next)."""
    return [{"logprobs": k, "return_tokens_as_token_ids": True}, {"logprobs": k}, {}]


class Refused(RuntimeError):
    """The server answered a request with an HTTP error (its status and the start of its body)."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body.strip()[:200]}")
        self.status = status


def held_out_text(probe: QualityProbe, tokenizer_dir, workdir: str | Path = ".") -> tuple[str, str]:
    """The text the probe scores, and where it came from: the config's file, else the model's own
    held-out text (a trained model's, models/train.py), else the standard library's."""
    from speedsplit.models.corpus import stdlib_corpus
    from speedsplit.models.train import HELD_OUT_TEXT

    if probe.text:
        path = Path(probe.text) if Path(probe.text).is_absolute() else Path(workdir) / probe.text
        if not path.is_file():
            raise FileNotFoundError(f"quality.text {probe.text} does not exist")
        return path.read_text(errors="replace"), f"quality.text {probe.text}"
    own = Path(tokenizer_dir) / HELD_OUT_TEXT
    if own.is_file():
        return own.read_text(errors="replace"), f"the model's held-out text ({HELD_OUT_TEXT})"
    c = stdlib_corpus(train_bytes=0)
    return c.held_out, f"the Python {c.identity['python']} standard library's held-out sources"


def windows_of(text: str, tokenizer, probe: QualityProbe) -> tuple[list[list[int]], str]:
    """max(prompts, windows) windows of window_tokens tokens each, spread evenly over the text,
    and a note. A tokenizer that cannot spell the text (the synthetic word-level one: mostly
    unknown tokens) gets windows of its own words instead, seeded, and the note says so."""
    import random

    want = max(probe.prompts, probe.windows)
    ids = tokenizer.encode(text, add_special_tokens=False)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and ids and sum(i == unk for i in ids) > len(ids) / 2:
        rng = random.Random(0)
        texts = [exact_prompt(tokenizer, probe.window_tokens, rng) for _ in range(want)]
        return [
            tokenizer.encode(t, add_special_tokens=False) for t in texts
        ], " (the tokenizer cannot spell it: windows of its own words, seeded, instead)"
    n = probe.window_tokens
    chunks = [ids[i : i + n] for i in range(0, len(ids) - n + 1, n)]
    if len(chunks) < want:
        raise ValueError(f"the held-out text has {len(ids)} tokens: too few for {want} windows of {n}")
    step = len(chunks) / want
    return [chunks[int(i * step)] for i in range(want)], ""


def _post(url: str, body: dict, key: str | None, timeout_s: float):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **apikey.headers(key)},
    )
    try:
        return urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        raise Refused(exc.code, exc.read().decode(errors="replace")) from None


def _token_id(token: str) -> int | None:
    return int(token[len(ID_PREFIX) :]) if isinstance(token, str) and token.startswith(ID_PREFIX) else None


def _top(entry: dict | None) -> dict[str, float] | None:
    """A position's top logprobs keyed by token id ('17'), or None where the keys are no ids."""
    if not entry:
        return None
    out = {}
    for token, lp in entry.items():
        tid = _token_id(token)
        if tid is None or lp is None:
            return None
        out[str(tid)] = float(lp)
    return out


def continuation(url: str, spec: LoadSpec, prompt: str, extra: dict, key: str | None, timeout_s: float):
    """One streamed greedy continuation: (text, token ids or None, top logprobs or None)."""
    body = request_body(spec, prompt, seed=0) | extra
    text, ids, top = [], [], []
    streamed = False
    with _post(url, body, key, timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            streamed = True
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                raise RuntimeError(f"the stream ended in an error: {str(chunk['error'])[:200]}")
            for choice in chunk.get("choices") or []:
                text.append(choice.get("text") or "")
                lp = choice.get("logprobs") or {}
                ids += [_token_id(t) for t in lp.get("tokens") or []]
                top += [_top(e) for e in lp.get("top_logprobs") or []]
    if not streamed:  # a server that ignored `stream`: one body, no continuation read
        raise RuntimeError("the answer was not an event stream (no 'data:' line): the server ignored stream=true")
    served_ids = bool(ids) and None not in ids
    served_top = bool(top) and None not in top
    return "".join(text), (ids if served_ids else None), (top if served_top else None)


def score(url: str, model: str, text: str, fields: dict, key: str | None, timeout_s: float):
    """A window scored through its prompt logprobs: (token ids, logprobs from the second token
    on, top logprobs at those positions); None for what the answer lacks. NotServed where the
    answer holds no prompt logprobs at all."""
    body = {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True, "stream": False}
    with _post(url, body | fields, key, timeout_s) as resp:
        answer = json.loads(resp.read())
    n = (answer.get("usage") or {}).get("prompt_tokens")
    lp = (answer.get("choices") or [{}])[0].get("logprobs") or {}
    tokens, lps, tops = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    if not n or len(tokens) < n or len(lps) < n:
        raise NotServed("the answer holds no prompt logprobs (echo with logprobs)")
    ids = [_token_id(t) for t in tokens[:n]]
    logprobs = [float(x) for x in lps[1:n]]
    top = [_top(e) for e in tops[1:n]] if len(tops) >= n else []
    return (None if None in ids else ids), logprobs, (top if top and None not in top else None)


class NotServed(RuntimeError):
    """The server answered, without what was asked for."""


# What a refusal of the logprob fields looks like: 422 (unknown fields, FastAPI's), or a 400
# that names one of them. Any other refusal (a prompt too long, a wrong key) is the request's.
ASKED_FIELDS = ("logprobs", "return_tokens_as_token_ids", "echo")


def _refuses_fields(no: Refused) -> bool:
    return no.status == 422 or (no.status < 500 and any(f in str(no) for f in ASKED_FIELDS))


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def run(
    url: str,
    model: str,
    dialect: str,
    probe: QualityProbe,
    tokenizer_dir,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    workdir: str | Path = ".",
    progress=None,
) -> QualityRecord:
    """Run the probe against one ready server; every failure is in the record, never raised
    (but a stop signal). A server that stops answering (a connection refused, a timeout) is
    asked nothing more: the rest of the probe says so."""
    t0 = time.perf_counter()
    record = QualityRecord(status="ok", probe=probe)
    try:
        tok = load_tokenizer(tokenizer_dir)
        text, record.text = held_out_text(probe, tokenizer_dir, workdir)
        record.text_sha256 = hashlib.sha256(text.encode()).hexdigest()[:16]
        wins, note = windows_of(text, tok, probe)
        record.text += note
    except procs.Stop:
        raise
    except Exception as exc:  # no text to probe with: nothing was asked of the server
        record.status, record.error = "error", _said(exc)
        return record
    spec = LoadSpec(
        urls=[url],
        model=model,
        prompts=[],
        users=1,
        prompt_tokens=probe.prompt_tokens,
        output_tokens=probe.output_tokens,
        temperature=0.0,
        dialect=dialect,
        request_timeout_s=timeout_s,
    )
    ladder = _logprob_fields(probe.top_logprobs)
    down = None  # why the server stopped answering
    for i, w in enumerate(wins[: probe.prompts]):
        out = QualityOutput(prompt=i)
        record.outputs.append(out)
        if down:
            out.error = f"not asked: {down}"
            continue
        try:
            while True:
                try:
                    out.text, out.ids, out.top = continuation(
                        url, spec, tok.decode(w[: probe.prompt_tokens]), ladder[0], api_key, timeout_s
                    )
                    break
                except Refused as no:  # fewer fields, once for the whole probe
                    if len(ladder) == 1 or not _refuses_fields(no):
                        raise
                    ladder = ladder[1:]
                    for field, key in (("return_tokens_as_token_ids", "token_ids"), ("logprobs", "logprobs")):
                        if field not in ladder[0]:
                            record.serves.setdefault(key, f"no: {no}")
            out.text_ids = tok.encode(out.text, add_special_tokens=False)
        except procs.Stop:
            raise
        except OSError as exc:  # refused, reset or timed out: the server is not answering
            down = out.error = f"the server did not answer ({_said(exc)})"
        except Exception as exc:
            out.error = _said(exc)
    ok = [o for o in record.outputs if not o.error]
    for key, has in (("token_ids", lambda o: o.ids is not None), ("logprobs", lambda o: o.top is not None)):
        record.serves.setdefault(key, "yes" if ok and all(has(o) for o in ok) else "no: none in the stream")
    if progress:
        progress(f"quality: {len(ok)}/{len(record.outputs)} continuations")
    fields = ladder[0] or {"logprobs": probe.top_logprobs}  # echo is nothing without logprobs
    for i, w in enumerate(wins[: probe.windows]):
        win = QualityWindow(window=i)
        record.windows.append(win)
        if down or record.serves.get("prompt_logprobs", "yes") != "yes":
            win.error = f"not asked: {down}" if down else "not served"
            continue
        try:
            win.ids, win.logprobs, win.top = score(url, model, tok.decode(w), fields, api_key, timeout_s)
        except procs.Stop:
            raise
        except (Refused, NotServed) as exc:
            if isinstance(exc, Refused) and not _refuses_fields(exc):
                win.error = _said(exc)  # this window's, not the stack's
            else:  # this stack does not serve them: asked once
                record.serves["prompt_logprobs"] = f"no: {exc}"
                win.error = "not served"
        except OSError as exc:
            down = win.error = f"the server did not answer ({_said(exc)})"
        except Exception as exc:
            win.error = _said(exc)
    if probe.windows:  # served where a window was scored; else what the windows met
        scored = any(w.logprobs is not None for w in record.windows)
        met = record.windows[0].error if record.windows else "none asked"
        record.serves.setdefault("prompt_logprobs", "yes" if scored else f"no window scored ({met})")
    if probe.lm_eval is not None:
        if progress:
            progress(f"quality: lm-eval tasks {', '.join(probe.lm_eval.tasks)}")
        if down:
            record.tasks_error = f"not asked: {down}"
        else:
            record.tasks, record.tasks_error = quality_tasks.run(
                url, model, probe.lm_eval, tokenizer_dir, api_key, workdir
            )
            if record.tasks_error and record.serves.get("prompt_logprobs", "").startswith("no"):
                record.tasks_error += " (this stack serves no prompt logprobs: lm-eval's loglikelihood tasks need them)"
    if not ok:
        record.status, record.error = "error", record.outputs[0].error if record.outputs else "no continuation"
    record.seconds = time.perf_counter() - t0
    return record
