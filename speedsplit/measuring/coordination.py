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
import re
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from speedsplit.core import apikey, procs
from speedsplit.core.intervals import length, overlap, union
from speedsplit.core.record import CellParams
from speedsplit.core.results import provenance, redact, write_json_atomic
from speedsplit.core.specs import StackSpec
from speedsplit.probes.loadspec import cell_load
from speedsplit.models.checkpoint import model_identity
from speedsplit.core.specs import SessionPlan
from speedsplit.probes import loadgen
from speedsplit.serving import session as sessions

# Kernels that move data between the cards: NCCL's, and vLLM's custom all-reduce (one- and
# two-shot, cross_device_reduce) and its quick/symmetric-memory variants.
COMMUNICATION = re.compile(r"nccl|all_?reduce|allreduce|cross_device_reduce|all_?gather|reduce_?scatter", re.I)
COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")


def profiler_args(trace_dir: Path, delay_iterations: int, iterations: int) -> list[str]:
    """Server arguments that arm vLLM's torch profiler (braces doubled: args are templates)."""
    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
        "delay_iterations": delay_iterations,
        "max_iterations": iterations,
    }
    return ["--profiler-config", json.dumps(cfg).replace("{", "{{").replace("}", "}}")]


def _post(url: str, timeout_s: float, api_key: str | None = None) -> None:
    req = urllib.request.Request(url, data=b"", method="POST", headers=apikey.headers(api_key))
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")


def split_trace(events: list[dict], steps: int) -> dict | None:
    """Per decode step on one GPU (ms): window, communication, compute, copies, idle gaps.

    The window runs from the first GPU event's start to the last one's end. Time when a
    communication kernel runs counts as communication (whatever else overlaps it), other busy
    time as compute or copies, the rest as gaps; the four add up to the window. None when
    the trace holds no GPU event (a CPU)."""
    comm, compute, copy = [], [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = e.get("cat", "")
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cat == "kernel":
            (comm if COMMUNICATION.search(e.get("name", "")) else compute).append(span)
        elif cat in COPY_CATEGORIES:
            copy.append(span)
    if not (comm or compute or copy):
        return None
    comm_u, compute_u, copy_u = union(comm), union(compute), union(copy)
    busy = union(comm_u + compute_u + copy_u)
    window = busy[-1][1] - busy[0][0]
    comm_t = length(comm_u)
    compute_t = length(compute_u) - overlap(compute_u, comm_u)
    copy_t = length(busy) - comm_t - compute_t
    per_step = 1e-3 / steps  # µs over the window -> ms per step
    return {
        "step_ms": window * per_step,
        "communication_ms": comm_t * per_step,
        "compute_ms": compute_t * per_step,
        "copy_ms": copy_t * per_step,
        "gap_ms": (window - length(busy)) * per_step,
        "kernels": len(comm) + len(compute),
        "communication_kernels": len(comm),
    }


def read_trace(path: Path) -> list[dict]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.rglob("*") if p.is_file() and ".json" in p.name)


def wait_for_traces(trace_dir: Path, ranks: int, timeout_s: float) -> list[Path]:
    """Trace files, once `ranks` of them exist and stopped growing (the profiler flushes late)."""
    deadline = time.monotonic() + timeout_s
    sizes: dict = {}
    while time.monotonic() < deadline:
        files = trace_files(trace_dir)
        now = {p: p.stat().st_size for p in files}
        if len(files) >= ranks and now == sizes and all(now.values()):
            return files
        sizes = now
        time.sleep(2.0)
    return trace_files(trace_dir)


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
        "cell": cell.cell,
        "users": cell.users,
        "tensor_parallel": stack.tensor_parallel,
        "platform": stack.platform,
        "delay_iterations": delay_iterations,
        "iterations": iterations,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": "error",
    }
    profiled = stack.model_copy(update={"args": [*stack.args, *profiler_args(trace_dir, delay_iterations, iterations)]})
    launch = {
        "stack": profiled.model_dump(),
        "model_dir": str(Path(model_dir).resolve()),
        "model": model_identity(model_dir),
        "cache_dir": str(Path(session.cache_dir).resolve()),
    }
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
    result: dict, held: dict, stack: StackSpec, cell: CellParams, tokenizer_dir, api_key: str | None
) -> None:
    """Warm the server with the cell once, arm the profiler, run the cell again under it."""

    def load(run: int) -> loadgen.LoadSpec:  # one request per user: all decode together
        spec = cell_load(held, stack, cell, run, tokenizer_dir, requests_per_user=1, warmup_requests=0)
        spec.api_key = api_key
        return spec

    warm, records = loadgen.run(load(1000))  # warm-up, not profiled (distinct prompts: no prefix-cache hits)
    if not warm.completed:  # a profile of a server that serves nothing would be "no trace", not why
        first = next((r for r in records if not r.ok), None)
        why = f"{first.error}: {first.detail}" if first and first.detail else (first.error if first else "none sent")
        raise RuntimeError(f"the profiled server answered none of the warm-up requests ({why})")
    for url in held["urls"]:
        _post(url + "/start_profile", 60.0, api_key)
    summary, _ = loadgen.run(load(1001))
    for url in held["urls"]:
        _post(url + "/stop_profile", 900.0, api_key)  # flushes the traces; ignored if already stopped
    result["load"] = {"output_tok_s": summary.output_tok_s, "completed": summary.completed, "failed": summary.failed}


def _breakdown(result: dict, files: list[Path], iterations: int) -> None:
    ranks = []
    for path in files:
        split = split_trace(read_trace(path), iterations)
        if split is not None:
            ranks.append({"trace": path.name, **split})
    result["ranks"] = ranks
    if not files:
        result.update(status="error", error="the profiler wrote no trace")
    elif not ranks:
        result.update(status="ok", breakdown=None, note="no GPU kernel events in the traces (no GPU: nothing to split)")
    else:
        keys = ("step_ms", "communication_ms", "compute_ms", "copy_ms", "gap_ms")
        result.update(status="ok", breakdown={k: sum(r[k] for r in ranks) / len(ranks) for k in keys})
