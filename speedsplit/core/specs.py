"""What a job runs, typed: one run (`JobSpec`) of one cell (`CellParams`) on one stack
(`StackSpec`), for one model and topology.

The config resolves a stack and a cell (planning/grid.stack_params and cell_params: dicts of
builtins, which Snakemake compares to rerun what changed); the job file (results/jobs/...) is
the JobSpec's JSON, and whoever runs the job reads it once (`read_job`) and uses attributes
from there on: bench, the coordination profile, the session daemon and the launcher. The
result embeds the job as it ran (core/record.RunResult.job: its warm-up count is what the run
sent, its timeouts the plan's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.core.quality import QualityProbe

# A request is a latency outlier when it took this many times what its length predicts, and at
# least this many seconds more (speedsplit/probes/loadgen.py: latency_outliers).
OUTLIER_FACTOR = 5.0
OUTLIER_MIN_S = 1.0


class StackSpec(BaseModel):
    """One stack resolved for one model, topology and platform, and how its server starts."""

    # a key the writer does not produce is refused: a job file of another version fails naming it
    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    model: str
    topology: str
    platform: Literal["cuda", "cpu"]
    variant: str = Field(description="weights served: fp16, gptq, awq, fp8, gguf ...")
    args: list[str] = Field(description="the server's command line, placeholders unrendered")
    env: dict[str, str] = Field(default_factory=dict, description="the server's environment, placeholders unrendered")
    dtype: str
    dialect: Literal["vllm", "llamacpp", "transformers"] = "vllm"
    ready_path: str = "/health"
    request_model: str = Field("{served_name}", description="the model name requests carry")
    expect_kernel: str = Field("", description="regex the engine's linear kernel must match ('' = none)")
    tensor_parallel: int = Field(1, ge=1)
    instances: int = Field(1, ge=1)
    max_model_len: int = Field(ge=1)
    cpu_isolation: bool = Field(False, description="each instance's server and client on its cards' cores")
    card_memory_gib: int | float | None = Field(None, description="the memory cap on each card (null: none)")
    memory_cap_args: list[str] = Field(default_factory=list, description="the server's own memory flag")
    kv_cache_gib: int | float | None = Field(None, description="the KV cache sized by hand (vLLM on a card)")
    host_cache_cap: bool = Field(False, description="a CPU server sizes its caches from its share of host memory")
    keep_alive: bool = Field(True, description="the client reuses a connection for the next request")
    # set by the session plan (planning/plan.SessionPlan.with_startup), not by the config's cell
    startup_timeout_s: float | None = Field(None, description="seconds the server may take to be ready")
    api_key: bool = Field(False, description="the server demands a key (benchmark.api_key)")
    api_key_env: str | None = Field(None, description="the variable its engine reads the key from")


class CellParams(ClosedLoopSettings):
    """The cell as measured: load shape, sampling and the run's time limits."""

    # unknown keys are refused: a reader never meets a shape the writer does not produce
    model_config = ConfigDict(extra="forbid")

    cell: str
    workload: str
    sampling: str
    users: int = Field(description="concurrent closed-loop users")
    prompt_tokens: int
    output_tokens: int
    requests_per_user: int
    warmup_requests: int = Field(description="warm-up requests per user, before the measured phase")
    telemetry_s: float = Field(0.5, description="seconds between telemetry readings")
    slo_ttft_p99_s: float = Field(2.0, description="latency objective: p99 TTFT at most this")
    slo_tpot_p99_s: float = Field(0.1, description="latency objective: p99 TPOT at most this")
    capacity_below: list[str] = Field(
        default_factory=list, description="capacity levels under this one, ascending (empty: not a level)"
    )
    capacity_stop_after: int = Field(2, description="consecutive failing levels below after which this one is skipped")
    warmup: Literal["every_cell", "session_start"] = Field(
        "every_cell", description="which cells warm up: every one, or only a session's first (later ones: 0 requests)"
    )
    temperature: float
    top_p: float
    seed: int
    request_timeout_s: float | None = Field(None, description="seconds one request may take (null: plan unreadable)")
    stall_timeout_s: float | None = Field(None, description="seconds without a token before a request stalls")
    outlier_factor: float = Field(
        OUTLIER_FACTOR, description="a request this many times slower than its length predicts is a latency outlier"
    )
    outlier_min_s: float = Field(OUTLIER_MIN_S, description="... and at least this many seconds slower")
    min_measured_s: float = Field(description="a shorter measured phase is flagged short_measurement")
    arrival: dict | None = Field(
        None, description="open loop: pattern, rate_rps, burstiness, requests or duration_s (null: closed loop)"
    )
    lengths: dict | None = Field(None, description="open loop: the length mix (null: every request the cell's lengths)")
    trace: dict | None = Field(
        None, description="trace replay: the trace, its window, speedup and fitting (null: none)"
    )
    max_client_lag_s: float | None = Field(None, description="open loop: a larger p99 send lag is flagged client_lag")


class JobSpec(BaseModel):
    """One job: one run of one cell on one stack (the stack names the model and topology)."""

    model_config = ConfigDict(extra="forbid")

    stack: StackSpec
    cell: CellParams
    run: int = Field(ge=0, description="the run's number in the grid, from 0")
    quality: QualityProbe | None = Field(
        None, description="after the cell's load, the quality probe (config quality: one job per stack carries it)"
    )

    @property
    def model(self) -> str:
        return self.stack.model

    @property
    def topology(self) -> str:
        return self.stack.topology


def parse_job(data: dict, run: int) -> tuple[JobSpec, list[str]]:
    """A job file's JSON as a JobSpec, less the keys its types do not know (a job file another
    version wrote), and those keys as 'stack: k' / 'cell: k' / 'quality: k' (the caller fails
    the run naming them). A job file written before the run was in it (only `stack` and
    `cell`) takes `run`."""
    unknown: list[str] = []
    parts = {}
    for name, model in (("stack", StackSpec), ("cell", CellParams), ("quality", QualityProbe)):
        entry = data.get(name)
        if entry is None:
            continue
        extra = sorted(set(entry) - set(model.model_fields))
        unknown += [f"{name}: {k}" for k in extra]
        parts[name] = model(**{k: v for k, v in entry.items() if k not in extra})
    return JobSpec(**parts, run=data.get("run", run)), unknown


def read_job(path: str | Path, run: int) -> tuple[JobSpec, list[str]]:
    """The job file at path (parse_job)."""
    return parse_job(json.loads(Path(path).read_text()), run)
