"""What a job runs, typed: one run (`JobSpec`) of one cell (`CellParams`) on one stack
(`StackSpec`), for one model and topology.

The config resolves a stack and a cell (planning/grid.stack_params and cell_params: dicts of
builtins, which Snakemake compares to rerun what changed); the job file (results/jobs/...) is
the JobSpec's JSON, and whoever runs the job reads it once (`read_job`) and uses attributes
from there on: bench, the coordination profile, the session daemon and the launcher. The
result embeds the job as it ran (core/record.RunResult.job: its warm-up count is what the run
sent, its timeouts the plan's).

Which job a bench job is and what it knows of its server session beyond its own cell:
`BenchJob` (model, stack, topology, cell, run: its result's path) and `SessionPlan` (the
session's key, log, caches, last job and timeouts), read from results/plan.json by
`session_of`. planning/plan.py makes them from the config; a bench job, the coordination
profile and the session daemon read them without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from speedsplit.core.errors import ConfigError
from speedsplit.core.loads import ClosedLoop, ClosedLoopSettings, OpenLoop, Sessions, TraceReplay
from speedsplit.core.quality import QualityProbe
from speedsplit.core.trace_split import ProfileWindow

# What a cell's measured prompts say (models/prompts.py): random words, held-out code, code edits.
PromptText = Literal["random", "code", "code-edit"]


class PassedOn(BaseModel):
    """Settings a config entry passes to its job file unchanged, declared once in a subclass that
    both the config's type and the job's type take: a setting added there is a config key with
    its default, bound and description, and a job-file key, at once (closed-loop settings have
    theirs in core/loads.ClosedLoopSettings). A job file names one only where it is not its
    default (`job_form`), so adding one changes no other stack's or cell's params: no finished
    cell reruns."""

    @classmethod
    def job_form(cls, entry) -> dict:
        """`entry`'s settings of this kind (a config entry or a job's part), each only where it is
        not its default, in the order declared."""
        return {k: getattr(entry, k) for k, f in cls.model_fields.items() if getattr(entry, k) != f.default}


class StackSettings(PassedOn):
    """A stack's settings passed on unchanged: planning/stack_config.StackConfig (the config's
    stacks.<name>) and StackSpec (a job's stack) take them."""

    keep_alive: bool = Field(
        True,
        description="Whether the load generator reuses a connection for the next request. llama.cpp's server "
        "(b1, in llama-cpp-python 0.3.36) closes a connection after a streamed answer while its headers say "
        "keep-alive, so every second request on it failed to send: its stacks set false (one connection per "
        "request, as loopback costs nothing).",
    )
    lossless: bool = Field(
        False,
        description="Its greedy answers must be token for token those of the stack before it in a chain "
        "(speculative decoding): a step to it whose quality probe's continuations differ fails its gate, "
        "and says so.",
    )
    draft_model: str | None = Field(
        None,
        description="A model of this config (models.*) that drafts for the server's speculative decoding: its "
        "FP16 folder, made by the model rule, is {draft_dir} in args (vLLM: --speculative-config with "
        '{"model": "{draft_dir}", ...}). It must share the served model\'s tokenizer; a model that only drafts '
        "is not benchmarked itself.",
    )


class CellSettings(PassedOn):
    """A cell's settings passed on unchanged from its workload: planning/workload_config.WorkloadConfig
    (the config's workloads.<name>) and CellParams (a job's cell) take them."""

    text: PromptText = Field(
        "random",
        description="What the measured prompts say: random words (distinct, nothing to repeat); code, windows of "
        "the Python library's held-out files (never trained on by a model the model rule trains); code-edit, such "
        "a window and its own start again, as a request to rewrite a file sends, output_tokens of it left to "
        "copy where prompt_tokens allows (what prompt-lookup speculative decoding drafts from). Closed loop and "
        "open loop without a shared prefix; every stack gets the same prompts.",
    )


# A request is a latency outlier when it took this many times what its length predicts, and at
# least this many seconds more (speedsplit/probes/loadgen.py: latency_outliers).
OUTLIER_FACTOR = 5.0
OUTLIER_MIN_S = 1.0


class StackSpec(StackSettings):
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
    # set by the session plan (core/specs.SessionPlan.with_startup), not by the config's cell
    startup_timeout_s: float | None = Field(None, description="seconds the server may take to be ready")
    api_key: bool = Field(False, description="the server demands a key (benchmark.api_key)")
    api_key_env: str | None = Field(None, description="the variable its engine reads the key from")


# A cell's load, told apart by its `kind` (core/loads.py).
Load = Annotated[ClosedLoop | OpenLoop | TraceReplay | Sessions, Field(discriminator="kind")]

# The keys a cell's load was written as before it was one field (job files and results of
# schema version 4 and older; and the config's resolved cell, planning/grid.cell_params, whose
# params Snakemake compares: they keep their shape so that no finished cell reruns).
FLAT_LOAD_KEYS = ("users", "ramp_s", "think_s", "arrival", "lengths", "trace", "sessions", "max_client_lag_s")


def load_from_flat(data: dict) -> dict:
    """A cell written with its load's keys at the top (FLAT_LOAD_KEYS) as one with `load`: a
    trace window if it has one, else sessions if it has them, else an arrival process if it has
    one, else a closed loop."""
    if "load" in data or not any(k in data for k in FLAT_LOAD_KEYS):
        return data
    flat = {k: data[k] for k in FLAT_LOAD_KEYS if data.get(k) is not None}
    lag = {"max_client_lag_s": flat["max_client_lag_s"]} if "max_client_lag_s" in flat else {}
    if flat.get("trace"):
        load = {"kind": "trace", "trace": flat["trace"], **lag}
    elif flat.get("sessions"):
        load = {"kind": "sessions", "sessions": flat["sessions"], **lag}
    elif flat.get("arrival"):
        load = {"kind": "open", "arrival": flat["arrival"], "lengths": flat.get("lengths"), **lag}
    else:
        load = {"kind": "closed", **{k: flat[k] for k in ("users", "ramp_s", "think_s") if k in flat}}
    return {**{k: v for k, v in data.items() if k not in FLAT_LOAD_KEYS}, "load": load}


class CellParams(CellSettings):
    """The cell as measured: its load, lengths, sampling and the run's time limits."""

    # unknown keys are refused: a reader never meets a shape the writer does not produce. Its
    # name is `cell` in every file (job files, records, Snakemake's params: finished cells keep
    # theirs) and `name` here, where `job.cell.cell` read as a stutter
    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    name: str = Field(alias="cell", description="the cell's name (u8-wide-greedy, r2-mix-greedy, ...)")
    workload: str
    sampling: str
    load: Load = Field(
        description="closed loop (users), open loop (an arrival process), a trace's replay or multi-turn sessions"
    )
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
    profile: ProfileWindow | None = Field(
        None, description="after the cell's load, a window of decode steps profiled (mechanism.profile; null: none)"
    )
    outlier_factor: float = Field(
        OUTLIER_FACTOR, description="a request this many times slower than its length predicts is a latency outlier"
    )
    outlier_min_s: float = Field(OUTLIER_MIN_S, description="... and at least this many seconds slower")
    min_measured_s: float = Field(description="a shorter measured phase is flagged short_measurement")

    @model_validator(mode="before")
    @classmethod
    def _load_from_flat_keys(cls, data):
        return load_from_flat(data) if isinstance(data, dict) else data

    @property
    def users(self) -> int:
        """Its closed loop's users (an open-loop or trace cell has none: 0)."""
        return self.load.users if isinstance(self.load, ClosedLoop) else 0

    @property
    def closed(self) -> ClosedLoopSettings:
        """How its closed loop's users behave (defaults for an open-loop or trace cell)."""
        return ClosedLoopSettings.of(self.load) if isinstance(self.load, ClosedLoop) else ClosedLoopSettings()

    def flat_load(self) -> dict:
        """Its load as the keys a cell held it in before it was one field (FLAT_LOAD_KEYS: those
        its kind has not are None, a closed loop's settings their defaults)."""
        load = self.load.model_dump(exclude={"kind"})
        if isinstance(self.load, Sessions):  # in the keys its params hold (no trace: none of a trace's)
            load["sessions"] = self.load.sessions.params()
        return {**dict.fromkeys(FLAT_LOAD_KEYS), "users": self.users, **self.closed.model_dump(), **load}


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
        entry = load_from_flat(entry) if model is CellParams else entry
        extra = sorted(set(entry) - {f.alias or k for k, f in model.model_fields.items()})  # as files name them
        unknown += [f"{name}: {k}" for k in extra]
        parts[name] = model(**{k: v for k, v in entry.items() if k not in extra})
    return JobSpec(**parts, run=data.get("run", run)), unknown


def read_job(path: str | Path, run: int) -> tuple[JobSpec, list[str]]:
    """The job file at path (parse_job)."""
    return parse_job(json.loads(Path(path).read_text()), run)


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

    @property
    def job_file(self) -> str:
        """What the job measures, as rule job_file writes it (its params: a change reruns it)."""
        return f"results/jobs/{self.model}/{self.stack}/{self.topology}/{self.cell}/run{self.run}.json"


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
    # mechanism.profile: where its servers write torch traces, and the window they are armed
    # for (None: not armed; only a session with a profiled cell is)
    profiler_dir: str | None = None
    profiler_window: dict | None = None

    # Timeouts change no measurement, so no job file holds them (a changed one reruns no
    # cell): a job's stack and cell get them here.
    def with_startup(self, stack: StackSpec) -> StackSpec:
        """The job's stack with its start-up timeout, with benchmark.api_key the variable its
        servers read their API key from (none: no key), and where a cell of the session is
        profiled, the profiler its servers are armed with."""
        armed = []
        if self.profiler_dir is not None:
            window = ProfileWindow.model_validate(self.profiler_window or {})
            armed = window.server_args(str(Path(self.profiler_dir).resolve()))
        return stack.model_copy(
            update={
                "startup_timeout_s": self.startup_timeout_s,
                "api_key": self.api_key,
                "api_key_env": self.api_key_env if self.api_key else None,
                "args": [*stack.args, *armed],
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
