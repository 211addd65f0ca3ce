"""Where tensor parallelism loses time: profile a window of steady decode steps of a server
(vLLM's torch profiler, started and stopped through the server's /start_profile and
/stop_profile endpoints) and split the time per decode step on each GPU into compute
kernels, communication kernels (NCCL and vLLM's custom all-reduce), copies, and idle gaps.

The server is started for this job alone (session `{model}/{stack}/{topology}/profile`) with
`--profiler-config`: after a warm-up load, /start_profile arms the profiler, which skips
`delay_iterations` engine steps (the prefill of the cell's prompts) and records
`iterations` steps of decode, then stops itself; the cell's load runs meanwhile. The traces
are kept (gzip, as vLLM writes them) beside the breakdown.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from speedsplit.core import procs
from speedsplit.core.results import provenance, redact, write_json_atomic
from speedsplit.core.specs import CellParams, SessionPlan, StackSpec
from speedsplit.core.trace_split import ProfileWindow, split_trace
from speedsplit.probes import loadgen
from speedsplit.probes.loadspec import cell_load
from speedsplit.probes.profiler import post, read_trace, trace_files, wait_for_traces
from speedsplit.serving import session as sessions
from speedsplit.serving.session_state import Launch, SessionState


def profile_cell(
    *,
    stack: dict,
    cell: dict,
    model_dir: str | Path,
    tokenizer_dir: str | Path,
    session: SessionPlan,
    out_json: str | Path,
    trace_dir: str | Path,
    delay_iterations: int,
    iterations: int,
    owner: procs.Proc | None = None,
    workdir: str | Path = ".",
) -> dict:
    """Profile one cell's steady decode on a server of its own; always writes out_json."""
    stack = session.with_startup(StackSpec.model_validate(stack))
    cell = session.with_limits(CellParams.model_validate(cell))
    trace_dir = Path(trace_dir).resolve()
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_files(trace_dir):
        old.unlink()
    result: dict = {
        "model": stack.model,
        "stack": stack.stack,
        "topology": stack.topology,
        "cell": cell.name,
        "users": cell.users,
        "tensor_parallel": stack.tensor_parallel,
        "platform": stack.platform,
        "delay_iterations": delay_iterations,
        "iterations": iterations,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": "error",
    }
    profiled = stack.model_copy(
        update={
            "args": [
                *stack.args,
                *ProfileWindow(delay_iterations=delay_iterations, iterations=iterations).server_args(str(trace_dir)),
            ]
        }
    )
    launch = Launch.of(profiled, model_dir, session, serves_cells=False)
    with procs.stop_on_signals():
        try:
            with sessions.hold_ready(
                session,
                launch,
                owner or sessions.workflow_owner(),
                ready_timeout_s=session.startup_timeout_s + session.lease_timeout_s,
                keep=False,  # a profiled server serves nothing else
            ) as held:
                _profile_load(result, held.state, stack, cell, tokenizer_dir, held.api_key)
                # the workers write their traces late: the servers stay up until they are complete
                files = wait_for_traces(trace_dir, stack.tensor_parallel * stack.instances, 600.0)
            _breakdown(result, files, iterations)
        except sessions.NotReady as no:
            result.update(status=no.status, error=redact(no.error, workdir))
        except procs.Stop:
            raise
        except Exception as exc:  # recorded, never lost
            result.update(status="error", error=f"{type(exc).__name__}: {redact(str(exc), workdir)}")
    result["traces"] = [str(p.relative_to(trace_dir)) for p in trace_files(trace_dir)]
    result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["provenance"] = provenance(workdir)
    write_json_atomic(out_json, json.loads(redact(json.dumps(result, default=str), workdir)))
    return result


def _profile_load(
    result: dict, held: SessionState, stack: StackSpec, cell: CellParams, tokenizer_dir, api_key: str | None
) -> None:
    """Warm the server with the cell once, arm the profiler, run the cell again under it."""

    def load(run: int) -> loadgen.LoadSpec:  # one request per user: all decode together
        spec = cell_load(
            held.urls, held.model_id, stack, cell, run, tokenizer_dir, requests_per_user=1, warmup_requests=0
        )
        spec.api_key = api_key
        return spec

    warm, records = loadgen.run(load(1000))  # warm-up, not profiled (distinct prompts: no prefix-cache hits)
    if not warm.completed:  # a profile of a server that serves nothing would be "no trace", not why
        first = next((r for r in records if not r.ok), None)
        why = f"{first.error}: {first.detail}" if first and first.detail else (first.error if first else "none sent")
        raise RuntimeError(f"the profiled server answered none of the warm-up requests ({why})")
    for url in held.urls:
        post(url + "/start_profile", 60.0, api_key)
    summary, _ = loadgen.run(load(1001))
    for url in held.urls:
        post(url + "/stop_profile", 900.0, api_key)  # flushes the traces; ignored if already stopped
    result["load"] = {"output_tok_s": summary.output_tok_s, "completed": summary.completed, "failed": summary.failed}


def _breakdown(result: dict, files: list[Path], iterations: int) -> None:
    ranks = [
        {
            "trace": path.name,
            "step_ms": sp.step_ms,
            "communication_ms": sp.communication_ms,
            "compute_ms": sp.compute_ms,
            "copy_ms": sp.copy_ms,
            "gap_ms": sp.idle_ms,
            "kernels": sp.kernels,
        }
        for path in files
        if (sp := split_trace(read_trace(path), iterations)) is not None and sp.device == "gpu"
    ]
    result["ranks"] = ranks
    if not files:
        result.update(status="error", error="the profiler wrote no trace")
    elif not ranks:
        result.update(status="ok", breakdown=None, note="no GPU kernel events in the traces (no GPU: nothing to split)")
    else:
        keys = ("step_ms", "communication_ms", "compute_ms", "copy_ms", "gap_ms")
        result.update(status="ok", breakdown={k: sum(r[k] for r in ranks) / len(ranks) for k in keys})
