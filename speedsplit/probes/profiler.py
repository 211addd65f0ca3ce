"""A window of decode steps under vLLM's torch profiler, on a server that is already up: its
trace split into kernel classes (speedsplit.core.trace_split.py).

A server is armed at its start (`ProfileWindow.server_args`: where its traces go, how many engine steps to
skip and to record); /start_profile starts the profiler, which skips `delay_iterations` engine
steps (the prefill of the load's prompts), records `iterations` steps and stops itself;
/stop_profile flushes the traces (each worker writes its own, gzipped, late). A bench job
profiles this way after its cell is measured and judged (`profile_window`); the coordination
profile (speedsplit/measuring/coordination.py) on a server of its own.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import time
import urllib.request
from pathlib import Path

from speedsplit.core import apikey
from speedsplit.core.trace_split import ProfileRecord, ProfileWindow, split_trace


def post(url: str, timeout_s: float, api_key: str | None = None) -> None:
    req = urllib.request.Request(url, data=b"", method="POST", headers=apikey.headers(api_key))
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")


def read_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in Path(trace_dir).rglob("*") if p.is_file() and ".json" in p.name)


def wait_for_traces(trace_dir: Path, ranks: int, timeout_s: float, old: set[Path] = frozenset()) -> list[Path]:
    """Trace files not in `old`, once `ranks` of them exist and stopped growing (the profiler
    flushes late); what there is at the timeout otherwise."""
    deadline = time.monotonic() + timeout_s
    sizes: dict = {}
    while time.monotonic() < deadline:
        files = [p for p in trace_files(trace_dir) if p not in old]
        now = {p: p.stat().st_size for p in files}
        if len(files) >= ranks and now == sizes and all(now.values()):
            return files
        sizes = now
        time.sleep(1.0)
    return [p for p in trace_files(trace_dir) if p not in old]


def split_files(files: list[Path], iterations: int) -> list:
    """Each trace's split (those holding no event to split are left out)."""
    return [s for s in (split_trace(read_trace(p), iterations) for p in files) if s is not None]


def profile_window(
    urls: list[str],
    api_key: str | None,
    window: ProfileWindow,
    trace_dir: str | Path,
    keep_dir: str | Path,
    ranks: int,
    run_load,
) -> ProfileRecord:
    """Profile `run_load()` (a load of one request per user) on servers armed with
    `ProfileWindow.server_args(trace_dir)`; the new traces move to keep_dir. Whatever fails is in the
    record, never raised (but a stop signal)."""
    t0 = time.monotonic()
    trace_dir, keep_dir = Path(trace_dir), Path(keep_dir)
    record = ProfileRecord(status="error", window=window)
    started: list[str] = []
    try:
        old = set(trace_dir.rglob("*")) if trace_dir.exists() else set()
        for url in urls:
            post(url + "/start_profile", 60.0, api_key)
            started.append(url)
        done = run_load()
        for url in urls:
            post(url + "/stop_profile", 600.0, api_key)  # flushes; ignored if it stopped itself
        started.clear()
        files = wait_for_traces(trace_dir, ranks, 300.0, old)
        if keep_dir.exists():
            shutil.rmtree(keep_dir)
        keep_dir.mkdir(parents=True)
        # the traces and what else the profiler wrote for them (its table of the top ops)
        new = [p for p in trace_dir.rglob("*") if p.is_file() and p not in old]
        moved = {p: Path(shutil.move(p, keep_dir / p.name)) for p in new}
        kept = [moved[p] for p in files if p in moved]
        record.traces = sorted(p.name for p in moved.values())
        record.ranks = split_files(kept, window.iterations)
        if not done:
            record.error = "the profiled load completed no request"
        elif not kept:
            record.error = "the profiler wrote no trace"
        elif not record.ranks:
            record.error = "the traces hold no kernel and no op"
        else:
            record.status = "ok"
    except Exception as exc:  # noqa: BLE001 (recorded: the cell's own result stands)
        said = str(exc).splitlines()[0] if str(exc) else ""
        record.error = f"{type(exc).__name__}: {said}"[:400]
        # a profiler left armed would profile the server's next cell: stopped, as best it can be
        for url in started:
            with contextlib.suppress(Exception):
                post(url + "/stop_profile", 60.0, api_key)
    record.seconds = round(time.monotonic() - t0, 2)
    return record
