"""Which job a bench job is and what it knows of its server session: `BenchJob` (model, stack,
topology, cell, run: its result's path) and `SessionPlan` (the session's key, log, caches, last
job and timeouts), read from results/plan.json by `session_of`. planning/plan.py makes them from
the config; a bench job, the coordination profile and the session daemon read them without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from speedsplit.core.errors import ConfigError
from speedsplit.core.record import CellParams
from speedsplit.core.specs import StackSpec


@dataclass(frozen=True)
class BenchJob:
    model: str
    stack: str
    topology: str
    cell: str
    run: int

    @property
    def result(self) -> str:
        return f"results/bench/{self.model}/{self.stack}/{self.topology}/{self.cell}/run{self.run}.json"

    @property
    def requests(self) -> str:
        return self.result.removesuffix(".json") + ".requests.jsonl"


@dataclass(frozen=True)
class SessionPlan:
    """What a bench job needs to know about its server session beyond its own cell. It comes
    from results/plan.json, written when the workflow starts (no rule owns it): growing the
    grid or changing a timeout rewrites the plan but reruns no finished cell."""

    key: str  # {model}/{stack}/{topology}/{run|all}
    log: str  # the servers' output, appended to by every job of the session
    cache_dir: str  # the session's own compile caches, where the shared one is busy
    last_job: str  # the session's last job (its result path): it stops the servers
    idle_timeout_s: float  # servers with no cell for this long stop
    lease_timeout_s: float  # the longest wait for free cards and ports
    startup_timeout_s: float  # the stack's: the longest a server takes to get ready
    request_timeout_s: float  # the longest one request may take (benchmark.request_timeout_s)
    stall_timeout_s: float  # the longest a streaming request may go without a token
    kv_tokens: int = 0  # the most tokens its cells keep in flight at once (users x (prompt + output)); 0: unknown
    shared_cache_dir: str = "results/cache/shared"  # one cache per model, stack, topology and engine version
    cpu_slots: int = 1  # on a CPU: how many sessions' servers may run at once (benchmark.cpu_lanes)
    foreign_idle_s: float = 60.0  # another workflow's server idle this long may be stopped for our cards
    api_key: bool = False  # benchmark.api_key: its servers demand a key drawn for the session
    api_key_env: str | None = None  # the variable the stack's engine reads a key from (None: it has none)

    # Timeouts change no measurement, so no job file holds them (a changed one reruns no
    # cell): a job's stack and cell get them here.
    def with_startup(self, stack: StackSpec) -> StackSpec:
        """The job's stack with its start-up timeout and, with benchmark.api_key, the variable
        its servers read their API key from (none: no key)."""
        return stack.model_copy(
            update={
                "startup_timeout_s": self.startup_timeout_s,
                "api_key": self.api_key,
                "api_key_env": self.api_key_env if self.api_key else None,
            }
        )

    def with_limits(self, cell: CellParams) -> CellParams:
        """The job's cell with its request and stall timeouts."""
        return cell.model_copy(
            update={"request_timeout_s": self.request_timeout_s, "stall_timeout_s": self.stall_timeout_s}
        )

    def is_last(self, job) -> bool:
        """Whether `job` (anything with model, stack, topology, cell and run) ends the session."""
        return BenchJob(job.model, job.stack, job.topology, job.cell, job.run).result == self.last_job


def session_of(plan_path: str | Path, result_path: str) -> SessionPlan:
    """The session plan of the job that writes result_path, from results/plan.json."""
    plan = json.loads(Path(plan_path).read_text())
    if result_path not in plan["jobs"]:
        raise ConfigError(f"no job writes {result_path} in {plan_path}: rerun the plan rule")
    return SessionPlan(**plan["sessions"][plan["jobs"][result_path]])
