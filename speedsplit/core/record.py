"""The result record: what one benchmark run writes (whatever happened) and the analysis reads.

Defined once, here (what it observed of its server, engine, hardware and client are its parts in
speedsplit/core/facts.py; its quality probe's answers, speedsplit/core/quality.py). The bench
job builds a `RunResult`, `write_result` writes it as JSON, and
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
- 4: `quality`, what the stack answered to the job's quality probe (null where the job had
  none; a version 3 file has none).
- 5: the cell's load is one typed field, `job.cell.load` (a closed loop, an open loop or a
  trace's replay, told apart by `kind`: core/specs.Load), in place of the keys `users`,
  `ramp_s`, `think_s`, `arrival`, `lengths`, `trace` and `max_client_lag_s`. Added since, each
  null where absent: `profile` (a window of decode steps split by kernel class).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from speedsplit.core.errors import UserError
from speedsplit.core.facts import (
    StrictRecord,
    Calibration,
    EngineFacts,
    ErrorInfo,
    HostSpeed,
    ModelShape,
    ModelSource,
    Provenance,
    ServerFacts,
    Slo,
    Telemetry,
    Timing,
)
from speedsplit.core.quality import QualityRecord
from speedsplit.core.trace_split import ProfileRecord
from speedsplit.core.specs import (
    JobSpec,
    StackSpec,
    load_from_flat,
)

SCHEMA_VERSION = 5
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


class ResultError(UserError, ValueError):
    """A result file is missing, truncated or not a speedsplit result; one-line message."""


class Distribution(StrictRecord):
    """One latency over a run's completed requests, in seconds (null when none completed)."""

    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None


class InstanceLoad(StrictRecord):
    """What one server instance of the session served in the measured phase."""

    instance: int = Field(description="index of the instance (user u is served by instance u mod n)")
    requests: int
    completed: int
    output_tokens: int = Field(description="output tokens of its completed requests")


class Summary(StrictRecord):
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
    itl_s: Distribution = Field(
        description="gaps between streamed chunks that carry tokens: per chunk, not per token, where a chunk "
        "carries several (tokens_per_chunk)"
    )
    tpot_s: Distribution = Field(description="per request: (last token - first token) / (output tokens - 1)")
    e2e_s: Distribution = Field(description="send to last token")
    wrong_output_length: int = Field(description="completed requests whose output length was not the cell's")
    wrong_prompt_length: int = Field(description="completed requests whose prompt the server counted otherwise")
    tokens_per_chunk: float | None = Field(
        None,
        description="output tokens per chunk that carried any, over the completed requests: 1 where a server "
        "streams token by token; more where it coalesces them (speculative decoding, a proxy), and then the ITL "
        "is a chunk's gap (null: results from before it)",
    )
    client_wall_s: float | None = Field(
        None,
        description="seconds of wall_s its own records show the client held: before its first request went out "
        "(a closed loop: past each user's place in the ramp), after its last answer, and, along the user whose "
        "answer came last, between each answer and that user's next request (think time left out); an open "
        "loop's last-ending request's lag. A factor's value takes it out (null: results from before it)",
    )
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
        None,
        description="open loop: the rate the schedule asked for (sessions: sessions begun a second; null: closed loop)",
    )
    trace_skipped: int | None = Field(None, description="trace replay: requests left out, beyond the model's context")
    trace_capped: int | None = Field(None, description="trace replay: prompts cut (by whole blocks) to fit the context")
    lag_s: Distribution | None = Field(
        None,
        description="open loop: how late each request was sent after it was due (the client's lag; a session's "
        "later turn is due think_s after the answer before it)",
    )
    ttft_first_s: Distribution | None = Field(None, description="sessions: the TTFT of each session's first turn")
    ttft_return_s: Distribution | None = Field(
        None, description="sessions: the TTFT of returning turns (the whole conversation so far in their prompt)"
    )
    session_s: Distribution | None = Field(
        None, description="sessions: from a session's first send to its last answer (sessions answered in full)"
    )
    client_stall_s: float | None = Field(
        None,
        description="the longest the client's event loop went without running in the measured phase (its "
        "ticker woke that late: the process was off the CPUs or one callback held it); above CLIENT_STALL_S "
        "the run is flagged client_stalled (null: not recorded)",
    )


class StackDef(StrictRecord):
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


class RunResult(StrictRecord):
    """One benchmark run of one cell on one stack: always written, whatever happened."""

    schema_version: Literal[5] = SCHEMA_VERSION
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
    host_speed: HostSpeed | None = Field(
        default=None, description="the host's own speed just before and after the load (null: no load ran)"
    )
    profile: ProfileRecord | None = Field(
        default=None, description="a window of decode steps split by kernel class (null: the job profiled none)"
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
        version = 4
    if version == 4:
        job = data["job"]
        data = {**data, "job": {**job, "cell": load_from_flat(job["cell"])}, "schema_version": 5}
    return data


def parse_result(data: dict, where: str = "result") -> RunResult:
    """A result record from its JSON form (any known version); ResultError if it is not one."""
    if not isinstance(data, dict) or data.get("schema_version") not in (1, 2, 3, 4, SCHEMA_VERSION):
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
