"""The rules of the server of known speed (speedsplit/serving/reference.py): its speed and
faults, and what a perfect client measures against them (expected).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
from collections.abc import Callable
from dataclasses import dataclass

from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.serving.reference_answers import Answers


@dataclass(frozen=True)
class Speed:
    """The server's timing, set by hand (seconds)."""

    ttft_s: float = 0.25
    itl_s: float = 0.01
    prefill_tok_s: float = 0.0  # prompt tokens a second before the first token (0: free)
    max_concurrency: int = 0  # requests served at once; the rest wait in line (0: no cap)
    # how it streams: the first token alone, then this many a chunk, each chunk written as its
    # last token is due (a speculative decoder or a proxy coalesces so); whether each chunk
    # carries the running usage where a client asks (vLLM's continuous_usage_stats; False: usage
    # in the last chunk only, as transformers serve, TGI and many proxies send it)
    tokens_per_chunk: int = 1
    no_running_count: bool = False
    # a speculative decoder: each step after the first token drafts this many tokens, and a
    # chunk's tokens beyond its last (the target model's own) are the drafts it accepted; its
    # counters are vLLM's spec-decode counters (0: not speculative)
    spec_draft_tokens: int = 0
    # a KV cache (serving/reference_cache.py): a prefix cache on the card of this many tokens (0:
    # none), a host tier behind it taking what the card evicts (0: none), and how fast the host
    # tier's hits load (prompt tokens a second; 0: free)
    prefix_cache_tokens: int = 0
    offload_cache_tokens: int = 0
    offload_tok_s: float = 0.0

    def chunk_ends(self, output_tokens: int) -> list[int]:
        """The index of each chunk's last token: 0, then every tokens_per_chunk-th (the last
        chunk holds what is left)."""
        k = max(1, self.tokens_per_chunk)
        return [0, *range(k, output_tokens - 1, k), output_tokens - 1] if output_tokens > 1 else [0]

    def chunk_gaps_s(self, output_tokens: int) -> list[float]:
        """The gaps between a request's chunks, as a client sees them."""
        ends = self.chunk_ends(output_tokens)
        return [self.itl_s * (b - a) for a, b in zip(ends, ends[1:])]

    def spec_counts(self, output_tokens: int) -> tuple[int, int, int]:
        """A request's (drafts, drafted tokens, accepted tokens): each chunk after the first is a
        step that drafted spec_draft_tokens and accepted all its tokens but the last."""
        if not self.spec_draft_tokens:
            return 0, 0, 0
        ends = self.chunk_ends(output_tokens)
        sizes = [b - a for a, b in zip(ends, ends[1:])]
        return len(sizes), len(sizes) * self.spec_draft_tokens, sum(n - 1 for n in sizes)

    def step_s(self) -> float:
        """Its engine's step: a chunk's gap (EngineClock)."""
        return self.itl_s * max(1, self.tokens_per_chunk)

    def first_token_s(self, prompt_tokens: int, cached: int = 0, offloaded: int = 0) -> float:
        """From a request's slot to its first token: its prompt read at the prefill rate but
        for the tokens its card's cache held (free) and those its host tier held (loaded at the
        offload rate)."""
        computed = prompt_tokens - cached - offloaded
        prefill = computed / self.prefill_tok_s if self.prefill_tok_s else 0.0
        return self.ttft_s + prefill + (offloaded / self.offload_tok_s if self.offload_tok_s else 0.0)

    def service_s(self, prompt_tokens: int, output_tokens: int, cached: int = 0, offloaded: int = 0) -> float:
        """From a request's slot to its last token."""
        return self.first_token_s(prompt_tokens, cached, offloaded) + self.itl_s * max(0, output_tokens - 1)


@dataclass
class EngineClock:
    """The reference server's engine, for its step counter (vLLM's vllm:iteration_tokens_total):
    while any request decodes (from its first token to its last), one step every `step_s` (a
    chunk's gap), each carrying one chunk of every decoding request. A stretch in which some
    request decodes makes length / step_s + 1 steps (a lone request of n chunks, n when its last
    chunk is a full one: its last gap is that chunk's share of a step)."""

    step_s: float
    decoding: int = 0
    start: float = 0.0
    busy_s: float = 0.0
    stretches: int = 0
    tokens: int = 0
    drafts: int = 0  # a speculative engine's (Speed.spec_counts)
    draft_tokens: int = 0
    accepted: int = 0

    def begin(self, t: float) -> None:
        """A request's first token, at t."""
        if self.decoding == 0:
            self.start = t
        self.decoding += 1

    def end(self, t: float) -> None:
        """A request's last token (or its end, where it ended early), at t."""
        self.decoding -= 1
        if self.decoding == 0:
            self.busy_s += max(0.0, t - self.start)
            self.stretches += 1

    def steps(self, now: float) -> float:
        """The steps made until now."""
        busy, stretches = self.busy_s, self.stretches
        if self.decoding:
            busy, stretches = busy + max(0.0, now - self.start), stretches + 1
        return busy / self.step_s + stretches


def engine_steps(decoding: list[tuple[float, float]], step_s: float) -> float:
    """The steps of an EngineClock that saw these (first token, last token) spans."""
    clock = EngineClock(step_s)
    events = sorted([(a, 0) for a, _ in decoding] + [(b, 1) for _, b in decoding])  # a begin before an end at t
    for t, kind in events:
        clock.begin(t) if kind == 0 else clock.end(t)
    return clock.steps(0.0)


@dataclass(frozen=True)
class Faults:
    """What goes wrong, on every N-th request received (0: never)."""

    error_every: int = 0
    drop_every: int = 0
    short_every: int = 0
    short_fraction: float = 0.5
    stall_every: int = 0
    stall_s: float = 0.0
    overclaim_every: int = 0  # stream only short_fraction of the tokens, claim them all in usage
    dead_after_probe: bool = False  # its engine dies at a quality probe's first request: HTTP 500 from then on
    usage_factor: float = 1.0

    def of(self, k: int) -> str | None:
        """The fault request number k (1-based) meets, if any (error before drop, short, stall,
        overclaim)."""
        for name, every in (
            ("error", self.error_every),
            ("drop", self.drop_every),
            ("short", self.short_every),
            ("stall", self.stall_every),
            ("overclaim", self.overclaim_every),
        ):
            if every and k % every == 0:
                return name
        return None


# --- what a client should measure -----------------------------------------------------------


@dataclass
class Expected:
    """One request as a perfect client would see it (seconds from the phase's start)."""

    sent: float
    first_token: float
    end: float
    prompt_tokens: int
    output_tokens: int
    user: int = 0  # closed loop: who sent it, and its place among that user's requests
    index: int = 0  # open loop: its place in the arrivals given
    cached: int = 0  # prompt tokens its card's cache held, and its host tier (a KV cache's server)
    offloaded: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.sent

    @property
    def e2e_s(self) -> float:
        return self.end - self.sent

    @property
    def tpot_s(self) -> float | None:
        n = self.output_tokens
        return (self.end - self.first_token) / (n - 1) if n > 1 else None


def expected(
    speed: Speed,
    *,
    users: int = 1,
    requests_per_user: int = 1,
    prompt_tokens: int = 0,
    output_tokens: int = 1,
    closed: ClosedLoopSettings = ClosedLoopSettings(),
    arrivals: list[tuple[float, ...]] | None = None,
    sessions: list[tuple[float, list[tuple[int, ...]]]] | None = None,
    think_s: float | Callable[[int, int], float] = 0.0,
) -> list[Expected]:
    """Every request of a measured phase on a fresh, idle server, as the server's rules make
    it: closed loop (`users` each sending `requests_per_user` back to back, as `closed` says:
    user u joining at u * ramp_s / users, each next request think_s after the last one's end);
    given `arrivals` (due time, prompt tokens, output tokens, and the cached and offloaded prompt
    tokens where its server has a KV cache), open loop (in the order given);
    given `sessions` (each one's start and its turns' prompt and output tokens, and the prompt
    tokens its KV cache held on the card and on the host where it has one), each session's next
    turn `think_s` after its last answer ended (or think_s(session, turn), a trace's own wait;
    user: the session, index: the turn). Slots
    go first come, first served, as the server gives them; the closed loop's and the sessions'
    requests come in the order they were sent."""
    cap = speed.max_concurrency or 10**9
    free = [0.0] * min(cap, max(users, len(arrivals or []), len(sessions or []), 1))  # when each slot frees up
    heapq.heapify(free)
    if sessions is not None:
        starts = [(due, s, 0) for s, (due, _) in enumerate(sessions)]
        return _in_turns(
            speed, free, starts, lambda s, k: sessions[s][1][k] if k < len(sessions[s][1]) else None, think_s
        )
    if arrivals is not None:
        served = {}
        for k in sorted(range(len(arrivals)), key=lambda k: arrivals[k][0]):
            due, p, n, *hits = arrivals[k]  # (cached, offloaded) where its server has a KV cache
            served[k] = _serve(speed, free, due, p, n, 0, k, *hits)
        return [served[k] for k in range(len(arrivals))]
    starts = [(u * closed.ramp_s / users if users else 0.0, u, 0) for u in range(users)]
    lengths = (prompt_tokens, output_tokens)
    return _in_turns(speed, free, starts, lambda u, i: lengths if i < requests_per_user else None, closed.think_s)


def _in_turns(speed: Speed, free: list[float], starts: list, lengths, think_s) -> list[Expected]:
    """A closed loop's users or sessions: each (start, who, 0) sends its first request then, each
    next one think_s (or think_s(who, i)) after its last one's end, as long as lengths(who, i)
    gives one's (prompt, output) tokens; whichever request is ready first goes next."""
    wait = think_s if callable(think_s) else lambda who, i: think_s
    out: list[Expected] = []
    ready = list(starts)
    heapq.heapify(ready)
    while ready:
        t, u, i = heapq.heappop(ready)
        r = _serve(speed, free, t, *lengths(u, i)[:2], u, i, *lengths(u, i)[2:])
        out.append(r)
        if lengths(u, i + 1) is not None:
            heapq.heappush(ready, (r.end + wait(u, i + 1), u, i + 1))
    return out


def _serve(
    speed: Speed,
    free: list[float],
    sent: float,
    p: int,
    n: int,
    user: int,
    index: int,
    cached: int = 0,
    offloaded: int = 0,
) -> Expected:
    start = max(sent, heapq.heappop(free))
    first = start + speed.first_token_s(p, cached, offloaded)
    end = start + speed.service_s(p, n, cached, offloaded)
    heapq.heappush(free, end)
    return Expected(sent, first, end, p, n, user, index, cached, offloaded)


# --- the server's command line ----------------------------------------------------------------


def argv(speed: Speed, faults: Faults = Faults(), answers: Answers = Answers()) -> list[str]:
    """The flags that start a server of this speed, faults and answers (defaults left out)."""
    out = []
    for obj in (speed, faults, answers):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value != f.default:
                flag = f"--{f.name.replace('_', '-')}"
                out += [flag] if isinstance(value, bool) else [flag, str(value)]
    return out


def parse_argv(args: list[str]) -> tuple[Speed, Faults] | None:
    """The speed and faults a server command line sets, if it starts this module."""
    if "speedsplit.serving.reference" not in args:
        return None
    p = argparse.ArgumentParser(add_help=False)
    add_speed_args(p)
    known, _ = p.parse_known_args(args[args.index("speedsplit.serving.reference") + 1 :])
    return speed_of(known)


def add_speed_args(p: argparse.ArgumentParser) -> None:
    """The timing and fault flags (shared with `speedsplit calibrate`)."""
    p.add_argument("--ttft-s", type=float, default=Speed.ttft_s, help="slot to first token, before prefill")
    p.add_argument("--itl-s", type=float, default=Speed.itl_s, help="between tokens")
    p.add_argument("--prefill-tok-s", type=float, default=0.0, help="prompt tokens a second before the first (0: free)")
    p.add_argument("--max-concurrency", type=int, default=0, help="requests served at once (0: no cap)")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens a chunk carries after the first")
    p.add_argument("--no-running-count", action="store_true", help="usage in the last chunk only, even where asked")
    p.add_argument(
        "--spec-draft-tokens", type=int, default=0, help="speculative: tokens drafted a step (0: not speculative)"
    )
    p.add_argument(
        "--prefix-cache-tokens", type=int, default=0, help="a prefix cache on the card of N tokens (0: none)"
    )
    p.add_argument(
        "--offload-cache-tokens", type=int, default=0, help="a host tier of N tokens behind the card's cache (0: none)"
    )
    p.add_argument("--offload-tok-s", type=float, default=0.0, help="host-tier hits load at this many tokens a second")
    for name in ("error", "drop", "short", "stall", "overclaim"):
        p.add_argument(f"--{name}-every", type=int, default=0, metavar="N", help=f"{name} on every N-th request")
    p.add_argument("--short-fraction", type=float, default=0.5, help="share of the tokens a short answer streams")
    p.add_argument("--stall-s", type=float, default=0.0, help="how long a stalled request is silent")
    p.add_argument("--usage-factor", type=float, default=1.0, help="usage reports this times the streamed tokens")
    p.add_argument(
        "--dead-after-probe", action="store_true", help="its engine dies at a quality probe's first request (HTTP 500)"
    )
    p.add_argument("--diverge-every", type=int, default=0, metavar="N", help="one prompt in N gets another answer")
    p.add_argument("--diverge-at", type=int, default=0, help="... from this output token on")
    p.add_argument("--nll", type=float, default=Answers.nll, help="every scored prompt token's -logprob")
    p.add_argument("--nll-wave", type=float, default=0.0, help="added to it times (position %% 3)")
    p.add_argument("--other-top-every", type=int, default=0, metavar="N", help="another token tops one in N")


def speed_of(args: argparse.Namespace) -> tuple[Speed, Faults]:
    for name in (
        "ttft_s",
        "itl_s",
        "prefill_tok_s",
        "stall_s",
        "offload_tok_s",
        "prefix_cache_tokens",
        "offload_cache_tokens",
        "max_concurrency",
    ):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must not be negative")
    if args.offload_cache_tokens and not args.prefix_cache_tokens:
        raise SystemExit(
            "--offload-cache-tokens needs --prefix-cache-tokens (the host tier takes what the card evicts)"
        )
    if args.tokens_per_chunk < 1:
        raise SystemExit("--tokens-per-chunk must be at least 1")
    if args.spec_draft_tokens and args.spec_draft_tokens < args.tokens_per_chunk - 1:
        raise SystemExit("--spec-draft-tokens must be at least --tokens-per-chunk - 1 (the drafts a chunk accepts)")
    speed = Speed(
        args.ttft_s,
        args.itl_s,
        args.prefill_tok_s,
        args.max_concurrency,
        args.tokens_per_chunk,
        args.no_running_count,
        args.spec_draft_tokens,
        args.prefix_cache_tokens,
        args.offload_cache_tokens,
        args.offload_tok_s,
    )
    faults = Faults(
        error_every=args.error_every,
        drop_every=args.drop_every,
        short_every=args.short_every,
        short_fraction=args.short_fraction,
        stall_every=args.stall_every,
        stall_s=args.stall_s,
        overclaim_every=args.overclaim_every,
        usage_factor=args.usage_factor,
        dead_after_probe=args.dead_after_probe,
    )
    return speed, faults


def answers_of(args: argparse.Namespace) -> Answers:
    if min(args.diverge_every, args.diverge_at, args.nll, args.nll_wave, args.other_top_every) < 0:
        raise SystemExit("--diverge-every, --diverge-at, --nll, --nll-wave and --other-top-every must not be negative")
    return Answers(args.diverge_every, args.diverge_at, args.nll, args.nll_wave, args.other_top_every)
