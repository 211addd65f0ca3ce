"""The result record: what one benchmark run writes (whatever happened) and the analysis reads.

Defined once, here. The bench job builds a `RunResult`, `write_result` writes it as JSON, and
`read_result` reads it back, upgrading files of an older schema version. Each request of a
run is one `RequestRecord` (speedsplit/core/requestlog.py). `docs/result-schema.json` is
generated from these models (`speedsplit schema > docs/result-schema.json`); a test
checks that the committed copy is current and that every committed result conforms to it.

Version history:
- 1: `summary` was `{}` and `server` absent when nothing was measured; `error` absent unless
  the job failed; the session key was `session`, the model's shape `model_config`.
- 2: absent parts are `null`; `session` is `session_key`, `model_config` is `model_shape`.
- 3: the job as it ran is embedded whole (`job`: the job file's JobSpec, core/specs.py), in place
  of `params` (now `job.cell`) and `stack_def` (now `job.stack`, which held only a few of the
  stack's fields: a version 2 file's `job.stack` is that `StackDef`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from speedsplit.core.errors import UserError
from speedsplit.core.quality import QualityRecord
from speedsplit.core.specs import (  # noqa: F401 (re-exported: the record's cell)
    OUTLIER_FACTOR,
    OUTLIER_MIN_S,
    CellParams,
    JobSpec,
    StackSpec,
)

SCHEMA_VERSION = 4
# A run whose client loop went this long without running in its measured phase is flagged
# client_stalled: its timestamps may be that late (speedsplit/core/awake.py: longest_stall).
CLIENT_STALL_S = 0.25

Status = Literal["ok", "startup_failed", "server_died", "server_hung", "server_error", "failed", "error", "skipped"]
Flag = Literal[
    "request_failures",
    "output_length_mismatch",
    "prompt_length_mismatch",
    "short_measurement",
    "kernel_mismatch",
    "platform_mismatch",
    "client_lag",
    "over_memory_cap",
    "usage_mismatch",
    "latency_outlier",
    "client_stalled",
    "implausible",  # numbers no measurement makes (speedsplit/core/plausible.py)
]


class _Record(BaseModel):
    # Unknown keys are refused: a reader never meets a shape the writer does not produce.
    model_config = ConfigDict(extra="forbid")


class ResultError(UserError, ValueError):
    """A result file is missing, truncated or not a speedsplit result; one-line message."""


class Distribution(_Record):
    """One latency over a run's completed requests, in seconds (null when none completed)."""

    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None


class InstanceLoad(_Record):
    """What one server instance of the session served in the measured phase."""

    instance: int = Field(description="index of the instance (user u is served by instance u mod n)")
    requests: int
    completed: int
    output_tokens: int = Field(description="output tokens of its completed requests")


class Summary(_Record):
    """The measured phase of a run, as the load generator saw it."""

    requests: int = Field(description="requests sent in the measured phase")
    completed: int = Field(description="requests answered in full")
    failed: int = Field(description="requests that ended in an error (see failures)")
    failures: dict[str, int] = Field(description="failed requests by cause (http_503, stall, connection, ...)")
    wall_s: float = Field(description="wall time of the measured phase, first send to last answer")
    output_tokens: int = Field(description="output tokens of the completed requests")
    output_tok_s: float | None = Field(description="output_tokens / wall_s: the throughput every factor divides")
    request_s: float | None = Field(description="completed requests per second of wall time")
    ttft_s: Distribution = Field(description="time to first token")
    itl_s: Distribution = Field(description="gaps between streamed chunks")
    tpot_s: Distribution = Field(description="per request: (last token - first token) / (output tokens - 1)")
    e2e_s: Distribution = Field(description="send to last token")
    wrong_output_length: int = Field(description="completed requests whose output length was not the cell's")
    wrong_prompt_length: int = Field(description="completed requests whose prompt the server counted otherwise")
    usage_mismatch: int = Field(
        0, description="completed requests whose usage the stream does not bear out (RequestRecord.usage_disagrees)"
    )
    latency_outliers: int = Field(
        0,
        description="completed requests slower than outlier_factor x what their length predicts from the run's "
        "median TTFT and TPOT (and outlier_min_s more): a stall below stall_timeout_s",
    )
    warmup_s: float = Field(description="wall time of the warm-up phase (not measured)")
    warmup_failed: int = Field(description="failed warm-up requests")
    measured_from: float | None = Field(
        None, description="Unix time the measured phase began (it ended wall_s later); telemetry is cut to it"
    )
    per_instance: list[InstanceLoad] = Field(
        default_factory=list, description="requests and tokens each instance served, so imbalance shows"
    )
    offered_rps: float | None = Field(
        None, description="open loop: the rate the schedule asked for (null: closed loop)"
    )
    trace_skipped: int | None = Field(None, description="trace replay: requests left out, beyond the model's context")
    trace_capped: int | None = Field(None, description="trace replay: prompts cut (by whole blocks) to fit the context")
    lag_s: Distribution | None = Field(
        None, description="open loop: how late each request was sent after it was due (the client's lag)"
    )
    client_stall_s: float | None = Field(
        None,
        description="the longest the client's event loop went without running in the measured phase (its "
        "ticker woke that late: the process was off the CPUs or one callback held it); above CLIENT_STALL_S "
        "the run is flagged client_stalled (null: not recorded)",
    )


class StackDef(_Record):
    """What a result of schema version 2 kept of the stack (a version 3 result keeps all of it)."""

    variant: str = Field(description="weights served: fp16 or gptq")
    dialect: str = Field(description="request dialect: vllm, llamacpp or transformers")
    dtype: str
    platform: str = Field(description="cuda or cpu")
    tensor_parallel: int
    instances: int
    expect_kernel: str = Field(description="regex the engine's linear kernel must match ('' = no expectation)")


class RecordedJob(JobSpec):
    """The job as it ran: the job file's JobSpec, its cell's warm-up count what the run sent."""

    stack: StackSpec | StackDef = Field(
        description="the stack as the job file gave it (a StackDef: a result of schema version 2, which kept no more)"
    )


class EngineFacts(_Record):
    """What the engine said about itself in this launch's log (null where it was silent)."""

    linear_kernel: str | None = None
    attention_backend: str | None = None
    weight_memory_gib: float | None = None
    kv_cache_tokens: int | None = None
    kv_cache_gib: float | None = Field(default=None, description="memory the engine gave its KV cache")
    kv_cache_fit_gib: float | None = Field(
        default=None,
        description="the KV cache that would have kept the engine inside its memory share (vLLM's own estimate)",
    )
    max_concurrency: float | None = None
    quantization: str | None = None
    dtype: str | None = None
    load_s: float | None = Field(default=None, description="start-up: seconds loading the weights (vLLM)")
    compile_s: float | None = Field(default=None, description="start-up: torch.compile in total (vLLM)")
    graphs_s: float | None = Field(default=None, description="start-up: capturing CUDA graphs (vLLM)")
    engine_init_s: float | None = Field(
        default=None, description="start-up: the engine's profile, KV cache and warm-up, compile and graphs included"
    )
    compile_cache: Literal["warm", "cold"] | None = Field(
        default=None, description="whether vLLM read its compiled graphs back from its cache or compiled them"
    )
    config_s: float | None = Field(
        default=None,
        description="start-up: the API server resolving the model's configuration (vLLM's model inspection; "
        "whole seconds off the log's clock)",
    )
    spawn_s: float | None = Field(
        default=None, description="start-up: the engine process starting, its imports (vLLM; log clock)"
    )
    warmup_s: float | None = Field(
        default=None, description="start-up: after the CUDA graphs, KV cache set-up and warm-up runs (vLLM; log clock)"
    )


class MemoryCap(_Record):
    """The stack's memory cap (card_memory_gib): a big card made to look like a smaller one."""

    card_memory_gib: float = Field(description="the emulated card's memory")
    applied: bool = Field(description="whether the cap was put on the server")
    card_total_gib: float | None = Field(description="the real card's memory (the smallest of the session's)")
    fraction: float | None = Field(description="card_memory_gib / card_total_gib, rounded down")
    how: str | None = Field(description="the server flag, or speedsplit.serving.memcap for a server without one")
    reason: str | None = Field(description="why it was not applied")


class ServerFacts(_Record):
    """The server session the run was measured on."""

    startup_s: float | None = Field(description="seconds from launch to ready (of the session, not this run)")
    lease_wait_s: float | None = Field(description="seconds waited for cards and ports")
    devices: list[str] | None = Field(description="cards the session held")
    cpus: str | None = Field(
        None, description="host cores its servers and this run's client were pinned to ('0-15'); None: not pinned"
    )
    argv: str | None = Field(description="the server command line (redacted)")
    model_id: str | None = Field(description="model name the server answers to")
    error: str | None = Field(description="why the session did not serve this run")
    log_tail: str | None = Field(description="end of the server log when it failed")
    exit_code: int | None
    wide_listeners: list[str] | None = Field(description="server sockets not bound to loopback (internal ports)")
    reused: bool = Field(description="the server had served an earlier cell")
    cells_before: int = Field(description="cells the session measured before this one")
    memory_cap: MemoryCap | None = Field(None, description="the memory cap the session ran under; None: none asked")
    host_memory: str | None = Field(
        None, description="a CPU server's host-memory cap (host_cache_cap), in words; None: none"
    )
    compile_cache_dir: str | None = Field(
        None,
        description="the compile cache its servers used: 'shared <key>' (one per model, stack, topology and "
        "engine version, reused across sessions) or 'private: <why>'; None: results from before it was shared",
    )
    lease_holders: list[str] | None = Field(
        None,
        description="who held the cards while the session waited for them (lease_wait_s), in words: another "
        "workflow's session, or a process; None: nobody, or results from before it was recorded",
    )
    shared_with: list[str] | None = Field(
        None,
        description="other workflows' sessions measuring on this host when this run's load started or ended "
        "(they share its cores, memory and buses); None: none seen",
    )
    api_key_required: bool | None = Field(
        None,
        description="benchmark.api_key: True when the server refused a request without the session's key (checked "
        "at its start), False when its engine has no key option (api_key_env null); None: no key asked",
    )


class ModelSource(_Record):
    """What speedsplit wrote about the served folder (speedsplit-model.json); empty if unreadable."""

    source: Literal["synthetic", "hub", "local"] | None = None
    shape: str | None = Field(default=None, description="synthetic: the published shape it copies")
    weights: str | None = Field(default=None, description="synthetic: random (seeded) or dummy (engine-initialised)")
    seed: int | None = None
    tokenizer: str | None = Field(
        default=None, description="synthetic: wordlevel, gpt2 (llama.cpp reads it), or bpe (trained with the weights)"
    )
    training: dict | None = Field(default=None, description="trained: its steps, losses and corpus (models/train.py)")
    repo: str | None = Field(default=None, description="hub: the repository")
    revision: str | None = Field(default=None, description="hub: the pinned revision")
    path: str | None = Field(default=None, description="local: the user's folder (its files are linked)")
    architecture: str | None = Field(default=None, description="local: config.json's architecture")
    dtype: str | None = Field(default=None, description="local: config.json's dtype")
    size_gib: float | None = Field(default=None, description="local: its weights; gguf: the GGUF file")
    quantization_config: dict | None = Field(default=None, description="local: config.json's, if any")
    variant: str | None = Field(default=None, description="gptq, awq or gguf for a converted folder")
    gguf_type: str | None = Field(default=None, description="gguf: the GGUF tensor type (f16, bf16, q8_0)")
    method: str | None = Field(default=None, description="gguf: what converted it")
    convert_s: float | None = Field(default=None, description="gguf: seconds the conversion took")
    converted_from: str | None = Field(default=None, description="gguf: the FP16 folder it was converted from")


class QuantConfig(_Record):
    quant_method: str | None
    bits: int | None
    group_size: int | None
    desc_act: bool | None
    sym: bool | None


class ModelShape(_Record):
    """The served model's shape from its config.json (what the roofline needs); empty if unreadable."""

    architectures: list[str] | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    quantization_config: QuantConfig | None = None


class Timing(_Record):
    """When the job and its load ran (Unix seconds), for packing: how busy each card was."""

    job_start: float
    load_start: float | None = Field(default=None, description="the load's first request (warm-up included)")
    load_end: float | None = None
    job_end: float | None = None


class ErrorInfo(_Record):
    """Why a run is not ok: the job's own exception, or what its servers did (ServerError: they
    answered requests with errors; ServerExit: one ended, with its exit code or signal;
    SessionLost: the session's daemon was killed; ServerHung; RequestsFailed; StartupFailed;
    CapacitySkip), with the failure their logs name."""

    type: str = Field(description="the exception's class, or the kind of server failure")
    message: str = Field(description="the cause in words, redacted")


class Gpu(_Record):
    index: str
    name: str
    driver: str
    memory: str


class Hardware(_Record):
    host_cpu: str
    cpu_count: int | None
    gpus: list[Gpu] | None = Field(default=None, description="absent on a host without nvidia-smi")
    platform: str | None = Field(
        default=None,
        description="the platform the job found where it ran: cuda where nvidia-smi lists a GPU, else cpu "
        "(absent in results written before it was recorded)",
    )


class Provenance(_Record):
    versions: dict[str, str] = Field(description="versions of the packages that matter")
    python: str
    workflow_commit: str = Field(description="git commit of the workflow ('-dirty' with local changes)")
    hardware: Hardware


class Slo(_Record):
    """The measured phase against the latency objectives (speedsplit/probes/slo.py)."""

    ttft_p99_s: float = Field(description="objective: p99 time to first token at most this")
    tpot_p99_s: float = Field(description="objective: p99 time per output token at most this")
    met: bool = Field(description="no request failed and both p99s held")
    violations: list[str] = Field(description="what did not hold, in words")
    good_requests: int = Field(description="completed requests whose own TTFT and TPOT met the objectives")
    goodput_rps: float | None = Field(description="good requests per second of the measured phase")


class ServerTelemetry(_Record):
    """The server's own counters (vLLM's /metrics) over the measured phase."""

    samples: int = Field(description="readings inside the measured phase")
    kv_cache_usage_peak: float | None = Field(description="highest KV-cache use, a fraction of the cache")
    kv_cache_usage_mean: float | None
    running_mean: float | None = Field(description="requests being decoded, mean over readings")
    waiting_mean: float | None = Field(description="requests queued, mean over readings")
    waiting_peak: float | None
    preemptions: float | None = Field(description="requests preempted during the phase (counter difference)")
    prefix_cache_hit_rate: float | None = Field(description="prefix-cache hits / queries during the phase")
    prefix_cache_hits: float | None = Field(None, description="prefix-cache hits during the phase (tokens, vLLM)")
    prefix_cache_queries: float | None = Field(
        None, description="prefix-cache queries during the phase (tokens looked up, vLLM)"
    )
    prefix_cache_hits_flagged: bool = Field(
        description="hit rate above 5%: with distinct prompts the server should be reusing almost nothing"
    )
    missed_readings: int = Field(0, description="readings the server did not answer during the phase")
    missed_why: list[str] = Field(default_factory=list, description="why they were missed")
    sparse: bool = Field(
        False, description="fewer than half the readings the phase should have had: peaks and means rest on few points"
    )
    series: dict[str, list[float | None]] = Field(
        description="the readings: t (s from the phase start), kv_cache, running, waiting"
    )


class GpuTelemetry(_Record):
    """NVML over the measured phase, summed (energy, power, memory) or averaged (utilisation)
    over the session's cards."""

    devices: list[str]
    samples: int
    energy_j: float = Field(description="total-energy counter difference over the phase (interpolated at both ends)")
    energy_per_output_token_j: float | None = Field(description="energy_j / the phase's output tokens")
    power_mean_w: float
    power_peak_w: float
    sm_util_mean_pct: float
    memory_peak_gib: float
    series: dict[str, list[float | None]] = Field(description="the readings: t, power_w, sm_util_pct")


class Telemetry(_Record):
    """What the servers and the GPUs were doing while the cell was measured; where a side
    could not be read, the reason instead."""

    interval_s: float = Field(description="seconds between readings")
    server: ServerTelemetry | None = None
    server_absent: str | None = Field(None, description="why there are no server counters")
    gpu: GpuTelemetry | None = None
    gpu_absent: str | None = Field(None, description="why there are no GPU readings")


class CalibrationLevel(_Record):
    """The load generator against the reference server at one number of users: what it saw
    minus what the server's known speed makes (medians over requests, seconds)."""

    users: int
    requests: int
    ttft_s: float = Field(description="measured TTFT less the true one")
    itl_s: float = Field(description="mean gap between chunks less the true one")
    tpot_s: float = Field(description="measured TPOT less the true one (the stream's end comes after its last token)")
    e2e_s: float = Field(description="measured end-to-end latency less the true one")
    e2e_p90_s: float = Field(description="its 90th percentile over requests")
    throughput_error: float = Field(description="measured / true output tok/s, less 1")


class Calibration(_Record):
    """The load generator's own offsets on the host that measured, against a server of known
    speed (speedsplit/serving/reference.py; `speedsplit calibrate`): the time it adds to what it
    measures, and the highest rate it can measure at all. Every factor's interval carries
    these offsets (speedsplit/analysis/chains.py: run_speeds)."""

    measured_at: str = Field(description="when (UTC, ISO 8601)")
    host_cpu: str
    reference: str = Field(description="the reference server's settings, its flags")
    levels: list[CalibrationLevel]
    ttft_s: float = Field(description="the offset carried: the largest level's TTFT offset (0 if negative)")
    itl_s: float = Field(description="the largest level's ITL offset (0 if negative)")
    tpot_s: float = Field(description="the largest level's TPOT offset (0 if negative)")
    e2e_s: float = Field(description="the largest level's end-to-end offset (0 if negative)")
    ceiling_tok_s: float | None = Field(description="output tok/s against a server that answers at once")
    ceiling_users: int = Field(description="users of the ceiling's load")


class RunResult(_Record):
    """One benchmark run of one cell on one stack: always written, whatever happened."""

    schema_version: Literal[4] = SCHEMA_VERSION
    model: str
    stack: str
    topology: str
    cell: str
    run: int
    status: Status | None = Field(
        default=None, description="ok, or why not (null only while the job runs; never written)"
    )
    job: RecordedJob
    session_key: str = Field(description="the server session: {model}/{stack}/{topology}/{run|all}")
    summary: Summary | None = Field(default=None, description="null when no load ran")
    flags: list[Flag] = Field(default_factory=list, description="reasons not to take the numbers at face value")
    kernel_ok: bool | None = Field(default=None, description="the engine's kernel matched expect_kernel")
    engine: EngineFacts = Field(default_factory=EngineFacts)
    server: ServerFacts | None = Field(default=None, description="null when the job failed before a session")
    error: ErrorInfo | None = None
    weights: ModelSource = Field(default_factory=ModelSource)
    model_shape: ModelShape = Field(default_factory=ModelShape)
    started: str
    finished: str | None = None
    timing: Timing | None = Field(default=None, description="absent in results written before it was recorded")
    slo: Slo | None = Field(default=None, description="the latency objectives, met or not, and goodput")
    telemetry: Telemetry | None = Field(
        default=None, description="server and GPU readings over the measured phase (absent: not sampled)"
    )
    provenance: Provenance | None = None
    quality: QualityRecord | None = Field(
        default=None, description="what the stack answered to the job's quality probe (null: the job had none)"
    )
    calibration: Calibration | None = Field(
        default=None, description="the client's offsets on this host, measured before the run (null: none)"
    )

    @property
    def cause(self) -> str | None:
        """Why the run is not ok, in words: the session's failure, else the run's own."""
        return (self.server and self.server.error) or (self.error and self.error.message) or None


# --- reading -------------------------------------------------------------------------------


def upgrade(data: dict) -> dict:
    """A record of an older schema version as the current version reads it."""
    version = data.get("schema_version")
    if version == 1:
        data = dict(data)
        data["session_key"] = data.pop("session")
        data["model_shape"] = data.pop("model_config", {})
        data["summary"] = data.get("summary") or None
        if data.get("server") is not None:
            # facts added during version 1 are absent from its older files
            data["server"] = {**dict.fromkeys(("wide_listeners", "exit_code", "log_tail")), **data["server"]}
        else:
            data["server"] = None
        data.setdefault("error", None)
        data["schema_version"] = version = 2
    if version == 2:
        data = dict(data)
        data["job"] = {"stack": data.pop("stack_def"), "cell": data.pop("params"), "run": data["run"]}
        data["schema_version"] = version = 3
    if version == 3:  # version 4 added `quality`, absent before
        data = {**data, "schema_version": 4}
    return data


def parse_result(data: dict, where: str = "result") -> RunResult:
    """A result record from its JSON form (any known version); ResultError if it is not one."""
    if not isinstance(data, dict) or data.get("schema_version") not in (1, 2, 3, SCHEMA_VERSION):
        raise ResultError(f"{where} is not a speedsplit result of schema version 1 to {SCHEMA_VERSION}")
    try:
        res = RunResult.model_validate(upgrade(data))
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        raise ResultError(f"{where} does not conform to the result schema at {loc}: {e['msg']}") from None
    if res.status is None or res.provenance is None:
        raise ResultError(f"{where} is unfinished (no status or provenance)")
    return res


def read_result(path: str | Path) -> RunResult:
    """Read one result file; refuse anything truncated, corrupt or not a result."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultError(f"result file missing: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultError(f"result file {path} is corrupt or truncated ({exc})") from None
    return parse_result(data, f"result file {path}")


def to_json(res: RunResult) -> dict:
    """The record's JSON form (what is written)."""
    return res.model_dump(mode="json", warnings="error")  # a writer bug fails here


def json_schema() -> dict:
    """The JSON Schema of a result file and of a request line (docs/result-schema.json)."""
    from speedsplit.core.requestlog import RequestRecord

    run = RunResult.model_json_schema(mode="serialization")
    req = RequestRecord.model_json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "speedsplit result records",
        "description": "RunResult: results/bench/.../run{N}.json; RequestRecord: each line of run{N}.requests.jsonl.",
        "$defs": {**run.pop("$defs", {}), **req.pop("$defs", {}), "RunResult": run, "RequestRecord": req},
        "oneOf": [{"$ref": "#/$defs/RunResult"}, {"$ref": "#/$defs/RequestRecord"}],
    }
