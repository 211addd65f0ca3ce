"""Open-loop traffic: when each request of a measured phase is due and how long it is, fixed
before the run from a seed, so every stack of a chain meets the same requests at the same
times.

Arrivals follow a pattern at a rate (requests per second):
- `poisson`: exponential gaps, mean 1 / rate (what `vllm bench serve --request-rate` and
  MLPerf's server scenario send);
- `gamma`: gamma gaps of the same mean with shape `burstiness` (1 is Poisson, below 1
  burstier, above 1 steadier: `vllm bench serve --burstiness`);
- `constant`: one request every 1 / rate seconds.
The phase holds `requests` requests, or as many as arrive within `duration_s`.

A trace replays recorded arrivals instead (`read_trace`: the Mooncake format, with shared
prompt blocks); a session trace, recorded multi-turn sessions (`read_session_trace`: AIPerf's
mooncake rows with a session_id and a delay).

Lengths are per request: `fixed` (the workload's prompt_tokens and output_tokens),
`lognormal` (by mean and spread, the standard deviation of the log; rounded, at least 1,
capped to fit the model's context) or
an empirical list read from a file (one `prompt_tokens output_tokens` pair per line, drawn
with replacement). Every length is still enforced and verified per request.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path

from speedsplit.core.errors import UserError
from speedsplit.core.loads import DueRequest

PATTERNS = ("poisson", "gamma", "constant")


class TrafficError(UserError, ValueError):
    """A traffic setting is wrong; the message is one line naming it."""


def gaps(pattern: str, rate: float, n: int, rng: random.Random, burstiness: float = 1.0) -> list[float]:
    """n inter-arrival gaps (seconds) of the pattern at `rate` requests per second."""
    if not rate > 0:
        raise TrafficError(f"arrival rate must be above 0 requests/s, not {rate}")
    if pattern == "constant":
        return [1.0 / rate] * n
    if pattern == "poisson":
        return [rng.expovariate(rate) for _ in range(n)]
    if pattern == "gamma":
        if not burstiness > 0:
            raise TrafficError(f"burstiness must be above 0, not {burstiness}")
        return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]
    raise TrafficError(f"unknown arrival pattern {pattern!r} (known: {', '.join(PATTERNS)})")


def due_times(
    pattern: str,
    rate: float,
    rng: random.Random,
    requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
) -> list[float]:
    """When each request is due: the first at 0 s, then the pattern's gaps; `requests` of them,
    or every one due before `duration_s`."""
    if (requests is None) == (duration_s is None):
        raise TrafficError("an open-loop phase needs either a request count or a duration, not both")
    if requests is not None:
        out, t = [], 0.0
        for g in [0.0] + gaps(pattern, rate, max(requests - 1, 0), rng, burstiness):
            t += g
            out.append(t)
        return out[:requests]
    out, t = [], 0.0
    while t < duration_s:
        out.append(t)
        t += gaps(pattern, rate, 1, rng, burstiness)[0]
    return out


def read_length_pairs(path: str | Path) -> list[tuple[int, int]]:
    """An empirical length mix: one `prompt_tokens output_tokens` pair per line (# comments)."""
    path = Path(path)
    if not path.is_file():
        raise TrafficError(f"length file not found: {path}")
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise TrafficError(f"{path} line {n}: expected two positive token counts, got {line!r}")
        pairs.append((int(parts[0]), int(parts[1])))
    if not pairs:
        raise TrafficError(f"{path}: no length pairs")
    return pairs


def _lognormal(mean: float, spread: float, rng: random.Random) -> int:
    """A length of mean `mean` whose log has standard deviation `spread`, at least 1."""
    mu = math.log(mean) - spread**2 / 2
    return max(1, round(rng.lognormvariate(mu, spread)))


def lengths(mix: dict, prompt_tokens: int, output_tokens: int, n: int, rng: random.Random) -> list[tuple[int, int]]:
    """n (prompt, output) lengths of the mix (`{"kind": "fixed"}`, `{"kind": "lognormal",
    "prompt_spread": s, "output_spread": s}` around the workload's lengths as means, or
    `{"kind": "file", "path": p}`)."""
    kind = mix.get("kind", "fixed")
    if kind == "fixed":
        return [(prompt_tokens, output_tokens)] * n
    if kind == "lognormal":
        return [
            (_lognormal(prompt_tokens, mix["prompt_spread"], rng), _lognormal(output_tokens, mix["output_spread"], rng))
            for _ in range(n)
        ]
    if kind == "file":
        pairs = read_length_pairs(mix["path"])
        return [rng.choice(pairs) for _ in range(n)]
    raise TrafficError(f"unknown length mix {kind!r} (known: fixed, lognormal, file)")


def schedule(
    arrival: dict, mix: dict, prompt_tokens: int, output_tokens: int, seed: int, max_model_len: int
) -> list[DueRequest]:
    """The measured phase of an open-loop cell: every request's due time and lengths, from the
    seed alone. A lognormal draw is capped to fit the model's context; a fixed or listed
    length beyond it is an error naming it."""
    rng = random.Random(seed)
    due = due_times(
        arrival["pattern"],
        float(arrival["rate_rps"]),
        rng,
        arrival.get("requests"),
        arrival.get("duration_s"),
        float(arrival.get("burstiness", 1.0)),
    )
    sizes = lengths(mix, prompt_tokens, output_tokens, len(due), random.Random(seed + 1))
    if mix.get("kind") == "lognormal":  # a draw in the tail is capped to fit the context
        sizes = [(min(p, max_model_len - min(o, max_model_len - 1)), min(o, max_model_len - 1)) for p, o in sizes]
    for i, (p, o) in enumerate(sizes):
        if p + o > max_model_len:
            raise TrafficError(
                f"request {i} of the length mix needs {p} + {o} tokens, beyond the model's context ({max_model_len})"
            )
    return [DueRequest(t, p, o) for t, (p, o) in zip(due, sizes)]


# --- trace replay -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceWindow:
    """Which part of a trace to replay and how to fit it to the model."""

    path: str
    start_s: float = 0.0  # from the trace's first request
    duration_s: float | None = None  # the window's length (or requests)
    requests: int | None = None  # the window's first requests (or duration_s)
    speedup: float = 1.0  # arrival times divided by this (2: twice the trace's rate)
    length_scale: float = 1.0  # every length and the block size times this (shared blocks stay shared)
    over_context: str = "skip"  # a request beyond the context: skip it, or cap its prompt
    block_tokens: int = 512  # the trace's block size (Mooncake: 512)


def _trace_lines(path: Path):
    """(line number, line) of a plain or gzipped trace; TrafficError naming the file if it
    cannot be read as text (not gzip though named .gz, cut short, not UTF-8)."""
    import gzip
    import zlib

    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                yield n, line
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        what = "gzip stream" if path.suffix == ".gz" else "text"
        raise TrafficError(f"trace {path}: unreadable after line {n} ({what}: {exc})") from None


def read_trace(w: TraceWindow, max_model_len: int) -> tuple[list[DueRequest], dict[str, int]]:
    """A window of a Mooncake-format trace (JSON lines: timestamp ms, input_length,
    output_length, hash_ids of block_tokens-token prompt blocks; plain or gzipped) as a
    schedule, and what fitting it did: {"skipped": n, "capped": n} (requests beyond the
    model's context left out, or their prompts cut to fit, by whole blocks)."""
    import json

    path = Path(w.path)
    if not path.is_file():
        raise TrafficError(f"trace not found: {path}")
    if not w.speedup > 0 or not w.length_scale > 0:
        raise TrafficError(f"trace {path.name}: speedup and length_scale must be above 0")
    if (w.duration_s is None) == (w.requests is None):
        raise TrafficError(f"trace {path.name}: give a window duration_s or a request count, not both")
    if w.over_context not in ("skip", "cap"):
        raise TrafficError(f"trace {path.name}: over_context is skip or cap, not {w.over_context!r}")
    block = max(1, round(w.block_tokens * w.length_scale))
    out: list[DueRequest] = []
    counts = {"skipped": 0, "capped": 0}
    t_first = None
    for n, line in _trace_lines(path):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            t, size, answer, ids = float(r["timestamp"]), int(r["input_length"]), int(r["output_length"]), r["hash_ids"]
        except (ValueError, KeyError, TypeError):
            raise TrafficError(
                f"{path} line {n}: not a trace record (timestamp, input_length, output_length, hash_ids)"
            ) from None
        if len(ids) != math.ceil(size / w.block_tokens):
            raise TrafficError(
                f"{path} line {n}: {len(ids)} hash ids do not fit input_length {size} in {w.block_tokens}-token blocks"
            )
        t_first = t if t_first is None else t_first
        at = (t - t_first) / 1000.0 - w.start_s
        if at < 0:
            continue
        if (w.duration_s is not None and at >= w.duration_s) or (w.requests is not None and len(out) >= w.requests):
            break
        prompt, output = max(1, round(size * w.length_scale)), max(1, round(answer * w.length_scale))
        if prompt + output > max_model_len:
            if w.over_context == "skip" or output >= max_model_len:
                counts["skipped"] += 1
                continue
            prompt = max_model_len - output
            counts["capped"] += 1
        out.append(DueRequest(at / w.speedup, prompt, output, tuple(int(i) for i in ids[: math.ceil(prompt / block)])))
    if not out:
        raise TrafficError(f"trace {path.name}: no request in the window")
    t0 = out[0].due_s
    return [DueRequest(a.due_s - t0, a.prompt_tokens, a.output_tokens, a.blocks) for a in out], counts


@dataclass(frozen=True)
class SessionTurn:
    """One turn of a recorded session: the tokens it adds to the conversation (a first turn's:
    its whole prompt), its answer's (None: the workload's output_tokens), and how long after its
    session's last answer it is sent (a person reading, a tool running)."""

    new_tokens: int
    output_tokens: int | None
    delay_s: float


def _scaled(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def read_session_trace(path: str | Path, length_scale: float = 1.0) -> tuple[tuple[SessionTurn, ...], ...]:
    """Multi-turn sessions recorded as AIPerf's mooncake-trace rows (JSON lines, plain or gzipped:
    session_id, input_length the turn's new tokens, output_length, delay milliseconds after the
    session's last answer), each session's turns in the file's order, sessions in the order they
    first appear. A row's timestamp is not read (sessions begin at the cell's rate), nor a first
    turn's delay. Lengths times length_scale, at least 1 token. Read once a process while the
    file is unchanged (planning asks for it at every cell of its workload)."""
    path = Path(path)
    if not path.is_file():
        raise TrafficError(f"session trace not found: {path}")
    if not length_scale > 0:
        raise TrafficError(f"session trace {path.name}: length_scale must be above 0")
    st = path.stat()
    return _session_trace(path.resolve(), st.st_mtime_ns, st.st_size, length_scale)


@functools.lru_cache(maxsize=8)
def _session_trace(path: Path, _mtime_ns: int, _size: int, length_scale: float) -> tuple[tuple[SessionTurn, ...], ...]:
    import json

    sessions: dict[str, list[SessionTurn]] = {}
    for n, line in _trace_lines(path):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            sid, size = str(r["session_id"]), int(r["input_length"])
            answer = None if r.get("output_length") is None else int(r["output_length"])
            delay = float(r.get("delay") or 0.0) / 1000.0
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TrafficError(
                f"{path} line {n}: not a session trace row (session_id, input_length; output_length, delay ms)"
            ) from None
        if size < 1 or (answer is not None and answer < 1) or delay < 0:
            raise TrafficError(f"{path} line {n}: input_length and output_length at least 1, delay not negative")
        sessions.setdefault(sid, []).append(
            SessionTurn(_scaled(size, length_scale), None if answer is None else _scaled(answer, length_scale), delay)
        )
    if not sessions:
        raise TrafficError(f"session trace {path}: no rows")
    return tuple(tuple(turns) for turns in sessions.values())
