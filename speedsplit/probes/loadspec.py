"""What one cell asks of the servers (LoadSpec), each request's place in its run, and the body
each request dialect sends to force its output length (REQUEST_FORMATS); loadgen sends them.

`cell_load` makes a cell run's LoadSpec from its job spec: its prompts (the same on every
stack), and for an open-loop or trace cell its schedule (by its kind of load: _RUN_LOAD).
"""

from __future__ import annotations

import functools
import itertools
import json
import zlib
from dataclasses import dataclass, field
from typing import Callable, Literal

from speedsplit.core.loads import DueRequest, ClosedLoop, ClosedLoopSettings, OpenLoop, Sessions, TraceReplay
from speedsplit.core.specs import OUTLIER_FACTOR, OUTLIER_MIN_S, CellParams, StackSpec
from speedsplit.models.prompts import block_prompts, load_tokenizer, prompts_of, token_counter

# vLLM and transformers serve (uvicorn) close a connection idle 5 s; a request sent on one as
# it closes fails ('connection', 4 of 16 at a 16-user level of vLLM's CPU build whose first 8
# users' connections sat idle about 5 s while the other 8 finished their warm-ups). The client
# lets go of an idle connection first, and opens a new one.
IDLE_CLOSE_S = 4.0


@dataclass(frozen=True)
class SessionRun:
    """A sessions cell run's measured phase, the same on every stack: when each session begins,
    its first prompt, the new text of each of its later turns, what each turn asks and how long
    after its session's last answer it is sent (core/loads.SessionSchedule.plans)."""

    due_s: list[float]  # each session's first turn, seconds after the phase's start
    first: list[str]  # each session's first prompt
    first_tokens: list[int]  # its length
    more: list[list[str]]  # each session's new text, one for each turn after the first
    asked: list[list[int]]  # each session's turns' output tokens, its first turn's included
    think_s: list[list[float]]  # each later turn's wait from the last answer's end

    def turns(self, session: int) -> int:
        return 1 + len(self.more[session])

    @functools.cached_property
    def _starts(self) -> list[int]:
        """Each session's first turn's place among the phase's requests, and the phase's count."""
        return list(itertools.accumulate((self.turns(s) for s in range(len(self.first))), initial=0))

    @property
    def requests(self) -> int:
        return self._starts[-1]

    def start_index(self, session: int) -> int:
        """Its first turn's place among the phase's requests (sessions in order, turns in order)."""
        return self._starts[session]


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
    schedule: list[DueRequest] | None = None  # measured phase open loop: these requests, when due
    fitted: dict | None = None  # trace replay: {"skipped": n, "capped": n} (read_trace)
    sessions: SessionRun | None = None  # measured phase of multi-turn sessions
    api_key: str | None = field(default=None, repr=False)  # sent with every request (core/apikey.py)
    # the model's tokenizer as a count of a text's tokens (no special tokens): a stream's text
    # counted again where it carries no running count (loadgen.count_text)
    count_tokens: Callable[[str], int] | None = field(default=None, repr=False)
    # what the measured phase sends, where no schedule or sessions say it (a run summarised
    # from records alone: output/truth.py)
    load_kind: Literal["closed", "open", "sessions"] | None = None

    @property
    def kind(self) -> str:
        """closed (users in a loop), open (requests when due: arrivals or a trace) or sessions."""
        if self.load_kind is not None:
            return self.load_kind
        return "open" if self.schedule is not None else "sessions" if self.sessions is not None else "closed"


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
    if spec.sessions is not None:  # user: the session, i: its turn
        return spec.users * spec.warmup_requests + spec.sessions.start_index(user) + i
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


def prompt_seed(cell: CellParams, run: int) -> int:
    """Prompts differ between cells and runs (a server measures several, and a repeated prompt
    is served from its prefix cache) and are the same for every stack."""
    return cell.seed + zlib.crc32(f"{cell.name}/run{run}".encode())


def cell_load(
    urls: list[str],
    model_id: str,
    stack: StackSpec,
    cell: CellParams,
    run: int,
    tokenizer_dir,
    requests_per_user: int | None = None,
    warmup_requests: int | None = None,
) -> LoadSpec:
    """The load of one cell run on a ready session's servers (their URLs and model id), with the
    cell's own request counts unless others are given; prompts are the run's own."""
    per_user = cell.requests_per_user if requests_per_user is None else requests_per_user
    warmup = cell.warmup_requests if warmup_requests is None else warmup_requests
    load = cell.load
    run_load = _RUN_LOAD[type(load)]
    prompts, schedule, fitted = run_load(load, cell, stack, tokenizer_dir, per_user, warmup, prompt_seed(cell, run))
    sessions = None
    if isinstance(load, Sessions):  # the sessions' texts follow the warm-up's prompts
        sessions, prompts = prompts[warmup], prompts[:warmup]
    return LoadSpec(
        urls=urls,
        model=model_id,
        prompts=prompts,
        users=cell.users or 1,
        prompt_tokens=cell.prompt_tokens,
        output_tokens=cell.output_tokens,
        requests_per_user=per_user,
        warmup_requests=warmup,
        temperature=cell.temperature,
        top_p=cell.top_p,
        seed=cell.seed + 100003 * run,
        dialect=stack.dialect,
        keep_alive=stack.keep_alive,
        request_timeout_s=cell.request_timeout_s,
        stall_timeout_s=cell.stall_timeout_s,
        outlier_factor=cell.outlier_factor,
        outlier_min_s=cell.outlier_min_s,
        closed=cell.closed,
        schedule=schedule,
        fitted=fitted,
        sessions=sessions,
        count_tokens=token_counter(tokenizer_dir),
    )


def _closed_loop(
    load: ClosedLoop, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """Each user's warm-up and measured requests, a prompt of the cell's length and text each."""
    n = load.users * (per_user + warmup)
    return prompts_of(tokenizer_dir, [cell.prompt_tokens] * n, seed, cell.text, cell.output_tokens), None, None


def _open_loop(
    load: OpenLoop, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """The schedule, then one warm-up user; prompts of their own lengths (with a shared prefix:
    one system prompt, block 0, opens every measured prompt)."""
    from speedsplit.core import traffic

    mix = load.lengths or {}
    schedule = traffic.schedule(load.arrival, mix, cell.prompt_tokens, cell.output_tokens, seed, stack.max_model_len)
    if mix.get("shared_prefix_tokens"):
        prompts = _warmup_then_blocks(
            tokenizer_dir, cell, warmup, seed, [(a.prompt_tokens, (0,)) for a in schedule], mix["shared_prefix_tokens"]
        )
    else:
        lengths = [cell.prompt_tokens] * warmup + [a.prompt_tokens for a in schedule]
        prompts = prompts_of(tokenizer_dir, lengths, seed, cell.text, cell.output_tokens)
    return prompts, schedule, None


def _trace_replay(
    load: TraceReplay, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """A trace window: its arrivals, prompts made of its shared blocks."""
    from speedsplit.core import traffic

    window = traffic.TraceWindow(**load.trace)
    schedule, fitted = traffic.read_trace(window, stack.max_model_len)
    block = max(1, round(window.block_tokens * window.length_scale))
    prompts = _warmup_then_blocks(
        tokenizer_dir, cell, warmup, seed, [(a.prompt_tokens, a.blocks) for a in schedule], block
    )
    return prompts, schedule, fitted


def _warmup_then_blocks(tokenizer_dir, cell: CellParams, warmup: int, seed: int, pairs: list, block: int) -> list[str]:
    """The warm-up's prompts at the cell's length, then measured prompts made of shared blocks."""
    return prompts_of(tokenizer_dir, [cell.prompt_tokens] * warmup, seed) + block_prompts(
        load_tokenizer(tokenizer_dir), pairs, block, seed
    )


def _sessions(load: Sessions, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int):
    """The warm-up's prompts, then the sessions (SessionRun, in the prompts' last place): when
    each begins, its first prompt (its first shared_prefix_tokens shared: one system prompt)
    and its turns' new text, from the seed alone; their lengths, answers and waits as the
    schedule (or its trace) plans them."""
    import random

    from speedsplit.core import traffic

    s = load.sessions
    plans = s.plans(cell.prompt_tokens, cell.output_tokens)
    due = traffic.due_times(s.pattern, s.rate_rps, random.Random(seed), requests=len(plans), burstiness=s.burstiness)
    warm = prompts_of(tokenizer_dir, [cell.prompt_tokens] * warmup, seed)
    firsts = [turns[0][0] for turns in plans]
    if s.shared_prefix_tokens:
        tok = load_tokenizer(tokenizer_dir)
        first = block_prompts(tok, [(n, (0,)) for n in firsts], s.shared_prefix_tokens, seed)
    else:
        first = prompts_of(tokenizer_dir, firsts, seed + 1)
    texts = iter(prompts_of(tokenizer_dir, [new for turns in plans for new, _, _ in turns[1:]], seed + 2))
    more = [[next(texts) for _ in turns[1:]] for turns in plans]
    asked = [[n for _, n, _ in turns] for turns in plans]
    think = [[t for _, _, t in turns[1:]] for turns in plans]
    return [*warm, SessionRun(due, first, firsts, more, asked, think)], None, None


# A cell's prompts, schedule (open loop) and what a trace window fitted, by its kind of load.
_RUN_LOAD = {ClosedLoop: _closed_loop, OpenLoop: _open_loop, TraceReplay: _trace_replay, Sessions: _sessions}
