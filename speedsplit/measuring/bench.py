"""One benchmark cell run: get the session's server (reused or started), drive the load,
write the cell's result and per-request records. Always writes a result, whatever failed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from speedsplit.core import procs
from speedsplit.core.record import (
    Calibration,
    EngineFacts,
    ErrorInfo,
    ModelShape,
    ModelSource,
    Provenance,
    RecordedJob,
    ResultError,
    RunResult,
    ServerFacts,
    Timing,
    parse_result,
    read_result,
    to_json,
)
from speedsplit.core.specs import CellParams, JobSpec, parse_job, SessionPlan
from speedsplit.core.facts import HostSpeed, QuantConfig
from speedsplit.core.quality import QualityRecord
from speedsplit.core.trace_split import ProfileRecord
from speedsplit.core.requestlog import RequestRecord
from speedsplit.core.results import provenance, redact, write_json_atomic, write_lines_atomic
from speedsplit.measuring import checks, hostspeed
from speedsplit.probes.loadspec import cell_load
from speedsplit.models.checkpoint import ModelError, model_info, read_model_config
from speedsplit.core.errors import ConfigError
from speedsplit.probes import loadgen, slo, telemetry
from speedsplit.serving import lease as leases
from speedsplit.serving import session as sessions
from speedsplit.serving.session_state import READY, Launch, Session, SessionState, transition


def _model_shape(model_dir) -> ModelShape:
    """The served model's shape (what the roofline needs); empty if unreadable."""
    try:
        cfg = read_model_config(model_dir)
    except ModelError:
        return ModelShape()
    shape = {k: cfg[k] for k in ModelShape.model_fields if k in cfg and k != "quantization_config"}
    q = cfg.get("quantization_config") or {}
    if q:
        shape["quantization_config"] = QuantConfig(**{k: q.get(k) for k in QuantConfig.model_fields})
    return ModelShape(**shape)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def measure(
    *,
    job: dict,
    run: int,
    session: SessionPlan | Callable[[], SessionPlan],
    model_dir: str | Path,
    tokenizer_dir: str | Path,
    out_json: str | Path,
    out_requests: str | Path,
    owner: procs.Proc | None = None,
    workdir: str | Path = ".",
    progress: Callable[[str], None] | None = None,
    calibration: Calibration | None = None,
) -> RunResult:
    """Measure one cell run (`job`: its job file's JSON, a JobSpec's) on its session's server;
    writes out_json and out_requests atomically and returns the result. `session` may be a
    function that reads the plan.

    Whatever fails ends in a result file (status error with the exception's class and a
    redacted message when nothing more specific fits), so the lane after it goes on. Only a
    stop signal ends the job without one: the cell was not measured and reruns.
    """
    # The job file, typed. Keys its types do not know (a job file of another version) are left
    # out of the record, and the run fails naming them.
    job, unknown = parse_job(job, run)
    try:  # the plan is read here, where a failure is recorded like any other
        session, plan_error = (session() if callable(session) else session), None
        job = job.model_copy(update={"stack": session.with_startup(job.stack), "cell": session.with_limits(job.cell)})
    except Exception as exc:
        session, plan_error = None, exc
    stack, cell = job.stack, job.cell
    result = _new_result(job, session.key if session else "")
    result.calibration = calibration
    records: list[RequestRecord] = []
    # A file-size limit (RLIMIT_FSIZE) must surface as an error we can record, not kill us mid-write.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with procs.stop_on_signals():
        try:
            if plan_error is not None:
                raise plan_error
            if unknown:
                raise ConfigError(f"the job file has keys of another version ({'; '.join(unknown)})")
            result.weights = ModelSource(**model_info(model_dir))
            result.model_shape = _model_shape(model_dir)
            launch = Launch.of(stack, model_dir, session)
            skip = capacity_skip(out_json, job.run, cell)
            if skip:  # past the cliff: not measured, and a session this job would end is stopped
                result.status, result.error = "skipped", ErrorInfo(type="CapacitySkip", message=skip)
                if session.is_last(result):
                    sessions.retire(Session(session.key, workdir), wait_s=60.0)
            else:
                records = _measure_on_session(
                    result, launch, session, job, tokenizer_dir, owner or sessions.workflow_owner(), progress
                )
        except procs.Stop:
            raise
        except Exception as exc:  # anything unforeseen: recorded, and the lane goes on
            _record_error(result, exc, workdir)
        if job.cell.profile is not None and result.profile is None:  # its window says why there is none
            result.profile = ProfileRecord(
                status="error", window=job.cell.profile, error=f"not profiled: the cell is {result.status}"
            )
        if job.quality is not None and result.quality is None:  # its stack's quality says why there is none
            why = f"not probed: the cell is {result.status}" + (
                f" ({result.cause.splitlines()[0][:300]})" if result.cause else ""
            )
            result.quality = QualityRecord(status="error", probe=job.quality, error=why)
        result.finished = _now()
        result.timing.job_end = time.time()
        result.provenance = Provenance.model_validate(provenance(workdir))
        if result.provenance.hardware.platform != stack.platform:
            # planned on another machine (a cluster's submitting host) for a platform this node lacks
            result.flags.append("platform_mismatch")
        try:
            return _write(result, records, out_json, out_requests, workdir)
        except Exception as exc:  # a full disk, a result its own type refuses: a small error result still fits
            _record_error(result, exc, workdir, "writing the result failed: ")
            return _write(_stripped(result), [], out_json, out_requests, workdir)


def _new_result(job: JobSpec, session_key: str) -> RunResult:
    """The run's record before anything is measured."""
    return RunResult(
        model=job.model,
        stack=job.stack.stack,
        topology=job.topology,
        cell=job.cell.name,
        run=job.run,
        # a copy: its warm-up count becomes what the run really sent
        job=RecordedJob(stack=job.stack, cell=job.cell.model_copy(deep=True), run=job.run),
        session_key=session_key,
        started=_now(),
        timing=Timing(job_start=time.time()),
    )


def _stripped(result: RunResult) -> RunResult:
    """What is left of a result that could not be written: who, what, when and why."""
    keep = ("model", "stack", "topology", "cell", "run", "job", "session_key", "error")
    keep += ("started", "finished", "timing", "provenance", "flags", "calibration")
    return RunResult(**{k: getattr(result, k) for k in keep}, status="error")


def capacity_skip(out_json, run: int, cell: CellParams) -> str | None:
    """For a capacity level: the reason to skip it when the `capacity_stop_after` levels just
    under it (same model, stack, topology and run) all failed; None when any of them passed
    or is not measured yet (it is then measured)."""
    below, n = cell.capacity_below, cell.capacity_stop_after
    if len(below) < n:
        return None
    reasons = []
    for name in below[-n:]:
        path = Path(out_json).parent.parent / name / f"run{run}.json"
        try:
            res = read_result(path)
            violations = res.slo.violations if res.slo else []
            verdict = slo.level_failure(res.status, res.slo and res.slo.met, violations, res.flags)
        except ResultError:
            return None
        if verdict is None:
            return None
        reasons.append(f"{name}: {verdict}")
    return f"the {n} levels below failed ({' | '.join(reasons)})"


def _record_error(result: RunResult, exc: BaseException, workdir, prefix: str = "") -> None:
    result.status = "error"
    result.error = ErrorInfo(type=type(exc).__name__, message=redact(prefix + str(exc), workdir))


def _write(result: RunResult, records: list[RequestRecord], out_json, out_requests, workdir) -> RunResult:
    """Redact, check against the record type (a writer bug fails here, not in the analysis),
    and write requests then result, each atomically."""
    clean = parse_result(json.loads(redact(json.dumps(to_json(result)), workdir)), "the result being written")
    write_lines_atomic(out_requests, [json.loads(redact(r.model_dump_json(), workdir)) for r in records])
    write_json_atomic(out_json, to_json(clean))
    return clean


def _measure_on_session(
    result: RunResult,
    launch: Launch,
    plan: SessionPlan,
    job: JobSpec,
    tokenizer_dir,
    owner: procs.Proc,
    progress,
) -> list[RequestRecord]:
    """Hold the session's servers for this cell and run the load; returns the request records.
    The last cell of a session, or any interrupted cell, stops its servers."""
    try:
        with sessions.hold_ready(
            plan,
            launch,
            owner,
            ready_timeout_s=job.stack.startup_timeout_s + plan.lease_timeout_s,
            keep=not plan.is_last(result),
            progress=progress,
        ) as held:
            _server_facts(result, held.state, held.reused)
            records = _run_load(result, held.state, job, tokenizer_dir, progress, held.api_key)
            transition(
                held.sess,
                held.generation,
                READY,
                cells_measured=held.state.cells_measured + 1,
                last_used=time.time(),  # another workflow waits foreign_idle_s from here (evict_idle)
            )
            checks.check_servers(result, records, held.sess, held.generation, held.state, job.stack)
            # after the cell is judged: what a probe does to the server is the probe's alone
            if job.cell.profile is not None and result.status in (None, "ok"):
                result.profile = profile_decode(held, plan, job, tokenizer_dir, progress)
            if job.quality is not None and result.status in (None, "ok"):
                result.quality = probe_quality(held.state, job, tokenizer_dir, held.api_key, progress)
                why = checks.unhealthy(held.state, job.stack)
                if why is not None:  # a probe never spoils a later cell: the next one starts its own server
                    sessions.stop_daemon(held.sess, held.generation)
                    said = f"the server was unhealthy after the probe ({why}): stopped, its next cell starts its own"
                    q = result.quality
                    q.error = f"{q.error}; {said}" if q.error else said
    except sessions.NotReady as no:
        result.status = no.status
        if no.state is None:
            result.server = _no_server(no.error)
        else:
            _server_facts(result, no.state, no.reused)
            result.server.error = no.error
        return []
    result.flags = checks.honesty_flags(result, job.stack, job.cell)
    return records


def profile_decode(held, plan: SessionPlan, job: JobSpec, tokenizer_dir, progress) -> ProfileRecord:
    """A window of the cell's decode under the profiler its servers were armed with (one request
    per user, prompts no earlier request sent); its split in the record, never an exception."""
    from speedsplit.probes import profiler  # the jobs that profile alone

    window = job.cell.profile
    if plan.profiler_dir is None:
        return ProfileRecord(status="error", window=window, error="the session's servers were not armed (plan)")
    if progress:
        progress(f"profiling {window.iterations} decode steps")
    keep = Path(plan.profiler_dir) / f"{job.cell.name}-run{job.run}"

    def run_load() -> int:
        spec = cell_load(held.state.urls, held.state.model_id, job.stack, job.cell, 1000 + job.run, tokenizer_dir, 1, 0)
        spec.api_key = held.api_key
        summary, _ = loadgen.run(spec)
        return summary.completed

    ranks = job.stack.tensor_parallel * job.stack.instances
    return profiler.profile_window(held.state.urls, held.api_key, window, plan.profiler_dir, keep, ranks, run_load)


def probe_quality(state: SessionState, job: JobSpec, tokenizer_dir, api_key: str | None, progress) -> QualityRecord:
    """The job's quality probe on the session's (first) server, after its load; what fails is
    in the quality record, never in the cell's speed result."""
    from speedsplit.probes import quality  # the first job of a stack's run 0 alone probes it

    try:
        timeout = job.cell.request_timeout_s or 600.0
        return quality.run(
            state.urls[0],
            state.model_id,
            job.stack.dialect,
            job.quality,
            tokenizer_dir,
            api_key,
            timeout,
            progress=progress,
        )
    except procs.Stop:
        raise
    except Exception as exc:
        return QualityRecord(status="error", probe=job.quality, error=f"{type(exc).__name__}: {exc}"[:400])


def _no_server(error: str) -> ServerFacts:
    facts = dict.fromkeys(ServerFacts.model_fields)
    return ServerFacts(**{**facts, "error": error, "reused": False, "cells_before": 0})


def _server_facts(result: RunResult, state: SessionState, reused: bool) -> None:
    """What the session's state says of its servers, as the result's ServerFacts (the fields
    both hold) and EngineFacts."""
    copied = state.model_dump(include=set(ServerFacts.model_fields) & set(SessionState.model_fields))
    cells_before = state.cells_measured
    result.server = ServerFacts(**copied, reused=reused or bool(cells_before), cells_before=cells_before)
    result.engine = EngineFacts(**(state.facts or {}))


def _run_load(
    result: RunResult, state: SessionState, job: JobSpec, tokenizer_dir, progress, api_key: str | None
) -> list[RequestRecord]:
    cell = job.cell
    # the client on its servers' cores, off the other lanes' (cards), or on the core left to it (no cards)
    client = state.client_cpus or state.cpus
    if client:
        os.sched_setaffinity(0, leases.parse_cpu_ranges(client))
    warm = 0 if cell.warmup == "session_start" and state.cells_measured else None
    load = cell_load(state.urls, state.model_id, job.stack, cell, job.run, tokenizer_dir, warmup_requests=warm)
    result.job.cell.warmup_requests = load.warmup_requests
    load.api_key = api_key
    sampler = telemetry.Sampler(
        telemetry.ServerProbe(state.urls, api_key=api_key),
        telemetry.GpuProbe(state.devices or []),
        cell.telemetry_s,
    )
    shared = sessions.measuring_elsewhere()
    before_ms = hostspeed.work_ms()  # the host's own speed, on the client's core, before and after
    result.timing.load_start = time.time()
    with sampler:
        # the counters read once with nothing in flight, then poked as the measured phase starts
        result.summary, records = loadgen.run(
            load, progress=progress, on_measured=sampler.poke, before_measured=sampler.sample
        )
    result.timing.load_end = time.time()
    result.host_speed = HostSpeed(before_ms=before_ms, after_ms=hostspeed.work_ms())
    shared += [s for s in sessions.measuring_elsewhere() if s not in shared]
    result.server.shared_with = shared or None
    s = result.summary
    result.slo = slo.assess(records, s, cell.slo_ttft_p99_s, cell.slo_tpot_p99_s)
    result.telemetry = telemetry.summarize(
        sampler, s.measured_from, s.measured_from + s.wall_s, s.output_tokens, state.devices or []
    )
    checks.late_facts(result, state)
    return records


def finished_line(result: RunResult) -> str:
    """One line per finished cell run: what it measured, or why it did not."""
    where = f"{result.stack} {result.cell} run{result.run}"
    s = result.summary
    if result.status == "ok" and s is not None:
        ttft = s.ttft_s.p99
        flags = f" [{', '.join(result.flags)}]" if result.flags else ""
        rate = f"{s.output_tok_s:.1f} output tok/s" if s.output_tok_s is not None else "no throughput"
        line = f"{where}: ok, {rate}, p99 TTFT {ttft:.3f} s{flags}" if ttft is not None else f"{where}: ok, {rate}"
        return line + _host_shared(result)
    cause = (result.cause or "no cause recorded").splitlines()[0][:400]
    return f"{where}: {result.status.upper() if result.status else 'UNFINISHED'}: {cause}"


def _host_shared(result: RunResult) -> str:
    """What another workflow on the host did to this run, in words ('' when nothing)."""
    srv, said = result.server, []
    if srv and srv.lease_holders and srv.lease_wait_s and not srv.reused:
        said.append(f"waited {srv.lease_wait_s:.0f} s for {'; '.join(srv.lease_holders)}")
    if srv and srv.shared_with:
        said.append(f"measured beside {'; '.join(srv.shared_with)}")
    return "".join(f"; {s}" for s in said)


def log_progress(prefix: str) -> Callable[[str], None]:
    def emit(msg: str) -> None:
        line = f"[{prefix}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if sys.stderr is not sys.__stderr__:  # the job's log, and the terminal too
            print(line, file=sys.__stderr__, flush=True)

    return emit
