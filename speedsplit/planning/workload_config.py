"""A workload as a config gives it (`workloads.<name>`), typed: the request shape of a cell and
the load it puts on a stack, told apart by which of `arrival` (open loop), `trace` (trace
replay) and `sessions` (multi-turn sessions) it holds, none being closed loop (`kind`). A
validated experiment's is `experiment.workloads[name]` (planning/experiment.py, whose schema is
generated from these types).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from speedsplit.core.loads import ClosedLoopSettings, SessionSchedule
from speedsplit.core.specs import CellSettings
from speedsplit.planning.typed_config import Entry, absent
from speedsplit.core.numbers import NonNegative, Positive

# exactly one of the two says how long an open loop or a trace window lasts
_ONE_SPAN = {"oneOf": [{"required": ["requests"]}, {"required": ["duration_s"]}]}


class Arrival(Entry):
    model_config = ConfigDict(json_schema_extra=_ONE_SPAN)

    pattern: Literal["poisson", "gamma", "constant"] = Field(
        "poisson", description="Gaps between arrivals: exponential (poisson), gamma of shape burstiness, or equal."
    )
    rates: list[Positive] = Field(min_length=1, description="Requests per second, one cell each.")
    burstiness: Positive = Field(1.0, description="gamma's shape: 1 Poisson, below 1 burstier.")
    requests: int | None = absent("Requests in the measured phase (or duration_s).", ge=1)
    duration_s: Positive | None = absent("Seconds of arrivals in the measured phase (or requests).")


class Lengths(Entry):
    kind: Literal["fixed", "lognormal", "file"] = Field(
        "fixed",
        description="fixed: every request the workload's prompt_tokens and output_tokens; lognormal: drawn around "
        "them as means (spreads below); file: (prompt, output) pairs read from path.",
    )
    prompt_spread: NonNegative = Field(0.5, description="lognormal: the standard deviation of the log prompt length.")
    output_spread: NonNegative = Field(0.5, description="lognormal: the standard deviation of the log output length.")
    path: str | None = absent("kind file: the pairs' file.")
    shared_prefix_tokens: int = Field(
        0,
        ge=0,
        description="The first this many tokens of every measured prompt of a run are the same (a system "
        "prompt; a shorter prompt is a cut of it); the rest of each prompt is its own. 0: every prompt distinct. "
        "What a server's prefix cache can reuse.",
    )


class Trace(Entry):
    model_config = ConfigDict(json_schema_extra=_ONE_SPAN)

    path: str = Field(description="The trace file.")
    start_s: NonNegative = Field(0, description="The window starts this long after the trace's first request.")
    duration_s: Positive | None = absent("The window's length in trace time (or requests).")
    requests: int | None = absent("The window's first requests (or duration_s).", ge=1)
    speedups: list[Positive] = Field(
        min_length=1, description="Arrival times divided by each (2: twice the trace's rate)."
    )
    length_scale: Positive = Field(1.0, description="Every length and the block size times this.")
    over_context: Literal["skip", "cap"] = Field(
        "skip", description="A request longer than the model's context: skipped, or its prompt cut to fit (cap)."
    )
    block_tokens: int = Field(512, ge=1, description="The trace's prompt block size.")


class SessionsConfig(Entry):
    pattern: Literal["poisson", "gamma", "constant"] = Field(
        "poisson",
        description="Gaps between sessions' arrivals: exponential (poisson), gamma of shape burstiness, or equal.",
    )
    rates: list[Positive] = Field(min_length=1, description="Sessions begun a second, one cell each.")
    burstiness: Positive = Field(1.0, description="gamma's shape: 1 Poisson, below 1 burstier.")
    count: int | None = absent("Sessions in the measured phase (with a trace: its first this many; absent, all).", ge=1)
    turns: int | None = absent("Turns (requests) of each session (not with a trace).", ge=1)
    turn_tokens: int | None = absent(
        "New tokens each turn after the first adds to the conversation (a user's message, a tool's result; "
        "not with a trace).",
        ge=1,
    )
    think_s: NonNegative = Field(
        1.0, description="Seconds from an answer's end to its session's next turn (a person reading, a tool running)."
    )
    shared_prefix_tokens: int = Field(
        0,
        ge=0,
        description="The first this many tokens of every session's first prompt are the same (a system prompt).",
    )

    trace: str | None = absent(
        "Sessions recorded in a file instead (AIPerf's mooncake-trace rows, JSON lines, plain or gzipped: "
        "session_id; input_length, the turn's new tokens; output_length; delay, milliseconds after the session's "
        "last answer): each turn's new tokens, answer and delay are the trace's; the sessions begin at the cell's "
        "rate (a row's timestamp is not read)."
    )
    length_scale: Positive = Field(1.0, description="A trace's lengths times this (at least 1 token each).")

    def schedule(self, rate_rps: float) -> SessionSchedule:
        """Its cell's sessions at one of its rates (core/loads.SessionSchedule); a trace's first
        count sessions (all it holds, if fewer)."""
        fields = self.model_dump(exclude={"rates"}, exclude_none=True)
        if self.trace is not None:
            from speedsplit.core import traffic

            held = len(traffic.read_session_trace(self.trace, self.length_scale))
            fields["count"] = min(self.count or held, held)
        return SessionSchedule(**fields, rate_rps=rate_rps)


class WorkloadConfig(Entry, ClosedLoopSettings, CellSettings):
    """One request shape (prompt_tokens and output_tokens are required unless it replays a trace)."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"not": {"required": ["trace"]}},
            "then": {"required": ["prompt_tokens", "output_tokens"]},
        }
    )

    prompt_tokens: int = Field(512, ge=1, description="Exact prompt length in tokens.")
    output_tokens: int = Field(256, ge=1, description="Exact output length in tokens.")
    requests_per_user: int = Field(2, ge=1, description="Measured requests each user sends.")
    warmup_requests: int = Field(1, ge=0, description="Requests per user before the measured phase.")
    arrival: Arrival | None = absent(
        "Open loop (absent: closed loop): requests arrive at a rate, each sent when due whatever is in flight, "
        "the same schedule (from the sampling seed) on every stack. One cell per rate, named "
        "r{rate}-{workload}-{sampling}; grid.users does not apply. warmup_requests are sent one after another "
        "before it."
    )
    lengths: Lengths | None = absent(
        "Open loop: each request's own prompt and output length (absent: prompt_tokens and output_tokens for "
        "every request). lognormal: around prompt_tokens and output_tokens as means, the spreads the standard "
        'deviation of the log; file: one "prompt output" pair per line, drawn with replacement. Every length is '
        "enforced and verified per request."
    )
    trace: Trace | None = absent(
        "Open loop from a recorded trace (Mooncake JSON lines: timestamp ms, input_length, output_length, "
        "hash_ids of 512-token prompt blocks; plain or gzipped): a window of it replayed, one cell per speedup, "
        "named x{speedup}-{workload}-{sampling}. Requests that share hash ids share exactly those prompt tokens, "
        "so a prefix cache sees what the trace recorded. Lengths, block size and all, are scaled by "
        "length_scale; a request beyond the model's context is skipped or its prompt capped (over_context), "
        "counted in the result."
    )
    sessions: SessionsConfig | None = absent(
        "Multi-turn sessions (an agent's, a chat's), arriving open loop: one cell per rate, named "
        "s{rate}-{workload}-{sampling}. A session's first turn is a prompt of prompt_tokens; each later turn sends "
        "the conversation so far (every earlier prompt and the answer the server actually gave) and turn_tokens of "
        "new text, think_s after the last answer ended; every turn asks output_tokens. The same sessions, arrivals "
        "and new text on every stack. Factors on the TTFT of first and of returning turns, session time, "
        "throughput and goodput."
    )

    @property
    def kind(self) -> Literal["closed", "open", "trace", "sessions"]:
        """Its load's kind (core/loads.py): trace replay, sessions, open loop, else closed loop."""
        return "trace" if self.trace else "sessions" if self.sessions else "open" if self.arrival else "closed"
