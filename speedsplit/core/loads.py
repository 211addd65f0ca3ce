"""The four kinds of load a cell puts on a stack, told apart by `kind`:

- `ClosedLoop`: N users, each sending its next request when its last one is answered (the
  study's load), all starting at once or joining over a ramp;
- `OpenLoop`: requests that arrive at a rate whatever is in flight (speedsplit/core/traffic.py:
  poisson, gamma or constant arrivals, a length mix);
- `TraceReplay`: a window of a recorded trace's arrivals at a speedup;
- `Sessions`: multi-turn sessions (an agent's or a chat's) that arrive at a rate; each turn
  sends the whole conversation so far (its earlier prompts and the answers the server gave)
  and new text, a think time after the last answer.

A cell's job spec holds its load as one of these (core/specs.CellParams.load, told apart by
`kind`; a config's workload says its own: planning/workload_config.WorkloadConfig.kind). Whoever
does something per kind keys a registry by the load's type (probes/loadspec.cell_load's prompts and
schedule) or asks the load (`schedule_s`, `client_lag_limit_s`) rather than testing keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speedsplit.core.numbers import NonNegative


class ClosedLoopSettings(BaseModel):
    """How a closed loop's users behave beyond their number: one definition that a workload's
    config (planning/workload_config.WorkloadConfig), a cell's job spec (core/specs.CellParams),
    its load (ClosedLoop) and the load generator (probes/loadspec.LoadSpec.closed) all take. A
    setting added here is a config key, a job-file key and a load setting at once; the load
    generator (probes/loadgen.py) is where it acts, and a server of known speed's rules
    (serving/reference_speed.expected) are where its truth is made."""

    ramp_s: NonNegative = Field(
        0,
        description="Users join the measured phase evenly over this many seconds (user u at u x ramp_s / users), "
        "then each sends its next request when the last one ends. 0 - all at once: a burst whose first requests "
        "wait for the prefill of every prompt together, so a TTFT objective then judges prefill speed as much as "
        "capacity.",
    )
    think_s: NonNegative = Field(
        0,
        description="Each user waits this many seconds after an answer ends before it sends its next measured "
        "request (a person reading the answer). 0 - at once, as the study's users do. The time waited is in the "
        "run's wall time, so its throughput is what such users offer, not the server's ceiling.",
    )

    def waiting_s(self, users: int, requests_per_user: int) -> float:
        """How long the last user spends not being served by these settings: its place in the
        ramp and its thinking between requests (what an estimate adds to the serving time)."""
        return self.ramp_s * (users - 1) / max(users, 1) + self.think_s * max(requests_per_user - 1, 0)

    @classmethod
    def of(cls, settings) -> ClosedLoopSettings:
        """The closed-loop settings of anything that has them (a workload, a cell, a load)."""
        return cls(**{k: getattr(settings, k) for k in cls.model_fields})

    def job_form(self) -> dict[str, float]:
        """The settings a job file holds: only those set (a cell measured before a setting existed
        keeps its params, and its results), each a float (as job files have always said them)."""
        return {k: float(v) for k, v in self if v != type(self).model_fields[k].default}


class _Load(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def schedule_s(self) -> float | None:
        """How long its arrivals span, where that is known before it runs."""
        return None

    @property
    def client_lag_limit_s(self) -> float | None:
        """A larger p99 lag of the client's sends behind their schedule is flagged (a closed loop
        has no schedule: None)."""
        return getattr(self, "max_client_lag_s", None)

    @property
    def rate_rps(self) -> float | None:
        """The rate its requests are offered at, where it is set (an open loop's)."""
        return None


class ClosedLoop(_Load, ClosedLoopSettings):
    kind: Literal["closed"] = "closed"
    users: int = Field(ge=1)


class OpenLoop(_Load):
    kind: Literal["open"] = "open"
    arrival: dict  # pattern, rate_rps, burstiness, and requests or duration_s
    lengths: dict | None = None  # the length mix (None: every request at the workload's lengths)
    max_client_lag_s: float | None = None  # a larger p99 send lag is flagged client_lag

    @property
    def rate_rps(self) -> float | None:
        return self.arrival["rate_rps"]

    def schedule_s(self) -> float | None:
        a = self.arrival
        return float(a["duration_s"]) if "duration_s" in a else a["requests"] / a["rate_rps"]


class Sessions(_Load):
    kind: Literal["sessions"] = "sessions"
    sessions: SessionSchedule
    max_client_lag_s: float | None = None  # a larger p99 send lag (a turn late after its think time) is flagged

    @property
    def rate_rps(self) -> float | None:
        return self.sessions.rate_rps

    def schedule_s(self) -> float | None:
        """At least: the sessions' arrivals, then the last one's think times (its serving is not
        known before it runs)."""
        s = self.sessions
        return s.count / s.rate_rps + max(sum(t for _, _, t in turns) for turns in s.plans(1, 1))


class TraceReplay(_Load):
    kind: Literal["trace"] = "trace"
    trace: dict  # core/traffic.TraceWindow's fields
    max_client_lag_s: float | None = None  # a larger p99 send lag is flagged client_lag

    def schedule_s(self) -> float | None:
        span = self.trace.get("duration_s")
        return span / self.trace["speedup"] if span else None


class SessionSchedule(BaseModel):
    """A sessions cell's sessions: when they arrive (open loop, at rate_rps) and how each goes
    on. Turn 0 is a prompt of the workload's prompt_tokens (its first shared_prefix_tokens the
    same in every session: a system prompt); turn k > 0 is turn k-1's prompt, the answer the
    server gave it, and turn_tokens of new text (a user's message or a tool's result), sent
    think_s after that answer ended. Every turn asks the workload's output_tokens. From a
    session trace (`trace`: core/traffic.read_session_trace), its first `count` sessions instead
    say each turn's new tokens, answer and delay."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pattern: Literal["poisson", "gamma", "constant"] = "poisson"
    rate_rps: float = Field(gt=0, description="sessions begun a second")
    burstiness: float = Field(1.0, gt=0)
    count: int = Field(ge=1, description="sessions in the measured phase")
    turns: int | None = Field(None, ge=1, description="requests each session sends (null: a trace's own)")
    turn_tokens: int | None = Field(None, ge=1, description="new tokens each returning turn adds (null: a trace's)")
    think_s: NonNegative = Field(description="seconds from an answer's end to the session's next turn")
    shared_prefix_tokens: int = Field(0, ge=0, description="the first tokens of every first prompt, shared")
    trace: str | None = Field(None, description="a session trace's file (null: sessions alike, as above)")
    length_scale: float = Field(1.0, gt=0, description="a session trace's lengths times this")

    @model_validator(mode="after")
    def _turns_from_one_place(self):
        if (self.trace is None) != (self.turns is not None and self.turn_tokens is not None):
            raise ValueError("sessions: turns and turn_tokens, or a trace that says them, not both")
        return self

    def plans(self, prompt_tokens: int, output_tokens: int) -> list[list[tuple[int, int, float]]]:
        """Each session's turns as (tokens it adds, tokens it asks, seconds after the last answer):
        a first turn adds its whole prompt and waits for nothing."""
        if self.trace is None:
            later = [(self.turn_tokens, output_tokens, float(self.think_s))] * (self.turns - 1)
            return [[(prompt_tokens, output_tokens, 0.0), *later] for _ in range(self.count)]
        from speedsplit.core import traffic

        sessions = traffic.read_session_trace(self.trace, self.length_scale)[: self.count]
        return [
            [(t.new_tokens, t.output_tokens or output_tokens, t.delay_s if k else 0.0) for k, t in enumerate(turns)]
            for turns in sessions
        ]

    def context_tokens(self, prompt_tokens: int, output_tokens: int) -> int:
        """The tokens the longest session's last turn holds, its answer included."""
        return max(sum(new + asked for new, asked, _ in turns) for turns in self.plans(prompt_tokens, output_tokens))

    def params(self) -> dict:
        """As a job's params hold it: a schedule without a trace in the keys it always had (a
        finished cell's params unchanged: it does not rerun)."""
        return self.model_dump(exclude_none=True, exclude=set() if self.trace else {"length_scale"})


@dataclass(frozen=True)
class DueRequest:
    """One request of an open loop's or a trace's measured phase and when it is due (made by
    core/traffic.py; the workload's arrival process is planning/workload_config.Arrival)."""

    due_s: float  # seconds after the phase's start
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # trace replay: its prompt's blocks (same id, same tokens)
