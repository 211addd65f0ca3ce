"""What one cell asks of the servers (LoadSpec), each request's place in its run, and the body
each request dialect sends to force its output length (REQUEST_FORMATS); loadgen sends them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from speedsplit.core.loads import Arrival, ClosedLoopSettings
from speedsplit.core.record import OUTLIER_FACTOR, OUTLIER_MIN_S

# vLLM and transformers serve (uvicorn) close a connection idle 5 s; a request sent on one as
# it closes fails ('connection', 4 of 16 at a 16-user level of vLLM's CPU build whose first 8
# users' connections sat idle about 5 s while the other 8 finished their warm-ups). The client
# lets go of an idle connection first, and opens a new one.
IDLE_CLOSE_S = 4.0


@dataclass
class LoadSpec:
    """What one cell asks of the servers."""

    urls: list[str]
    model: str
    prompts: list[str]
    users: int
    prompt_tokens: int
    output_tokens: int
    requests_per_user: int = 2
    warmup_requests: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    dialect: str = "vllm"
    keep_alive: bool = True  # reuse connections (False: one per request, for a server that drops them)
    idle_close_s: float = IDLE_CLOSE_S  # a kept connection idle this long is closed, not reused
    request_timeout_s: float = 600.0
    stall_timeout_s: float = 120.0
    outlier_factor: float = OUTLIER_FACTOR  # a latency outlier: see latency_outliers
    outlier_min_s: float = OUTLIER_MIN_S
    closed: ClosedLoopSettings = field(default_factory=ClosedLoopSettings)  # how the users behave (closed loop)
    schedule: list[Arrival] | None = None  # measured phase open loop: these requests, when due
    fitted: dict | None = None  # trace replay: {"skipped": n, "capped": n} (read_trace)
    api_key: str | None = field(default=None, repr=False)  # sent with every request (core/apikey.py)


def request_index(spec: LoadSpec, phase: str, user: int, i: int) -> int:
    """A request's place in its run, from its identity alone (warm-ups first, then each user's
    requests in order): the same on every stack whatever order requests are answered in.
    It picks the request's prompt (every request of a run gets its own: a repeated prompt
    would be served from the engine's prefix cache and inflate the measured throughput) and
    its sampling seed (seed + index)."""
    if phase == "warmup":
        return user * spec.warmup_requests + i
    if spec.schedule is not None:
        return spec.users * spec.warmup_requests + i
    return spec.users * spec.warmup_requests + user * spec.requests_per_user + i


def _vllm_body(body: dict, spec: LoadSpec, n: int, seed: int) -> None:
    """vLLM: exactly n tokens by ignore_eos and min_tokens, and the running usage in every
    chunk (continuous_usage_stats): the stream's own count, exact where a chunk holds no text
    (a partial character) or several tokens."""
    body.update(min_tokens=n, ignore_eos=True, temperature=spec.temperature, top_p=spec.top_p)
    body["stream_options"]["continuous_usage_stats"] = True
    if spec.temperature != 0:
        body["seed"] = seed


def _llamacpp_body(body: dict, spec: LoadSpec, n: int, seed: int) -> None:
    """llama.cpp's server: vLLM's fields (it ignores min_tokens; ignore_eos holds the length),
    and its running count in every chunk (timings_per_token: timings.predicted_n)."""
    _vllm_body(body, spec, n, seed)
    body["timings_per_token"] = True


def _transformers_body(body: dict, spec: LoadSpec, n: int, seed: int) -> None:
    """`transformers serve`: a per-request generation_config (min and max new tokens); its
    stream has no running count (one token a chunk)."""
    greedy = spec.temperature == 0
    gen = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": not greedy}
    if not greedy:
        gen.update(temperature=spec.temperature, top_p=spec.top_p)
        body["seed"] = seed
    body["generation_config"] = json.dumps(gen)


# How each request dialect (a stack's `dialect`) forces its output length and asks for a count
# of streamed tokens: the body of an OpenAI completion, completed in place. A new engine's
# dialect is one function here (and the schema's enum for stacks.*.dialect).
REQUEST_FORMATS: dict[str, Callable[[dict, LoadSpec, int, int], None]] = {
    "vllm": _vllm_body,
    "llamacpp": _llamacpp_body,
    "transformers": _transformers_body,
}


def request_body(spec: LoadSpec, prompt: str, seed: int, output_tokens: int | None = None) -> dict:
    """The JSON body that forces exactly output_tokens (the cell's, or this request's) tokens
    in the spec's dialect (REQUEST_FORMATS)."""
    if spec.dialect not in REQUEST_FORMATS:
        raise ValueError(f"unknown request dialect {spec.dialect!r} (known: {', '.join(REQUEST_FORMATS)})")
    n = spec.output_tokens if output_tokens is None else output_tokens
    body = {
        "model": spec.model,
        "prompt": prompt,
        "max_tokens": n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    REQUEST_FORMATS[spec.dialect](body, spec, n, seed)
    return body
