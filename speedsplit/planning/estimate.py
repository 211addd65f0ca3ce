"""How long will a grid take? An estimate per bench job and for the whole grid, before it runs.

A job is its server's start (the first job of a session only) plus the rest of the job: its
load (every request of its cell, warm-up included) and the job's own overhead. That comes, in
this order, from
1. results already measured for the same model, stack, topology and cell on this platform:
   the median time their jobs took beyond their servers' start (and the sessions' median
   start-up, cold and on a warm compile cache apart),
2. the load at the decode roofline (cuda, a known model shape, the measured or configured
   copy bandwidth) times `estimate.roofline_efficiency`, plus `estimate.job_overhead_s`,
3. the load at the configured `estimate.output_tok_s` of the platform, plus the overhead.
Lanes run side by side and a lane's jobs one after another, so the grid takes its longest
lane (model preparation and aggregation not counted). Each bench job asks a cluster for its
estimate times `estimate.margin` (rule bench's `runtime`, minutes).

    speedsplit estimate --configfile config/h200-smoke.yaml [--results DIR]
"""

from __future__ import annotations

import glob
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from speedsplit.core.record import ResultError, read_result
from speedsplit.core.specs import CellParams
from speedsplit.models.checkpoint import ModelError, read_model_config, shape_config
from speedsplit.planning import grid as gridmod
from speedsplit.planning import plan as planmod
from speedsplit.planning import roofline
from speedsplit.planning.experiment import Experiment

DEFAULT_RESULTS = "results/bench/**/run*.json"
BANDWIDTH = "results/hardware/bandwidth.json"


@dataclass(frozen=True)
class JobEstimate:
    job: planmod.BenchJob
    lane: int
    start_s: float  # the server's start-up, on a session's first job; else 0
    load_s: float  # the rest of the job: its load and the job's own overhead
    rate_tok_s: float
    source: str  # where the time came from: measured, roofline, configured, schedule (open loop)

    @property
    def total_s(self) -> float:
        return self.start_s + self.load_s


@dataclass(frozen=True)
class Measured:
    """What earlier results say, per (model, stack, topology[, cell]) on one platform."""

    rate: dict[tuple[str, str, str, str], float]  # median output tok/s of ok runs
    job_s: dict[tuple[str, str, str, str], float]  # median job time beyond its server's start
    startup: dict[tuple[str, str, str], float]  # median start-up of their sessions (compiling, or no cache)
    startup_warm: dict[tuple[str, str, str], float]  # median start-up of sessions on a warm compile cache

    @classmethod
    def read(cls, pattern: str, platform: str) -> Measured:
        rates: dict[tuple, list[float]] = {}
        jobs: dict[tuple, list[float]] = {}
        starts: dict[tuple, list[float]] = {}
        warm: dict[tuple, list[float]] = {}
        for path in glob.glob(pattern, recursive=True):
            if path.endswith(".requests.jsonl"):
                continue
            try:
                r = read_result(path)
            except (ResultError, OSError, ValueError):
                continue
            if r.job.stack.platform != platform:
                continue
            key = (r.model, r.stack, r.topology)
            if r.server and r.server.startup_s and not r.server.reused:  # once per session
                (warm if r.engine.compile_cache == "warm" else starts).setdefault(key, []).append(r.server.startup_s)
            if r.status == "ok" and r.summary and r.summary.output_tok_s:
                rates.setdefault((*key, r.cell), []).append(r.summary.output_tok_s)
                t = r.timing
                if t and t.job_start is not None and t.job_end is not None:
                    started = 0.0 if r.server.reused else (r.server.startup_s or 0.0) + (r.server.lease_wait_s or 0.0)
                    jobs.setdefault((*key, r.cell), []).append(t.job_end - t.job_start - started)
        return cls(
            rate={k: statistics.median(v) for k, v in rates.items()},
            job_s={k: statistics.median(v) for k, v in jobs.items()},
            startup={k: statistics.median(v) for k, v in starts.items()},
            startup_warm={k: statistics.median(v) for k, v in warm.items()},
        )


def model_shape(config: Experiment, model: str) -> dict | None:
    """The model's config.json: a local model's own, a hub model's once downloaded, else the
    published one of its `shape` (a synthetic model's; a hub model's before it is downloaded).
    `shape` has a default (tiny), so a model's own config.json comes first."""
    entry = config.models[model]
    fetched = Path(f"resources/models/{model}/fp16")
    try:
        if entry.source == "local":
            return read_model_config(entry.path)
        if entry.source == "hub" and (fetched / "config.json").is_file():
            return read_model_config(fetched)
        return shape_config(entry.shape)
    except ModelError:
        return None


def _bandwidth(config: Experiment, path: str) -> float | None:
    if config.estimate.bandwidth_gb_s:
        return float(config.estimate.bandwidth_gb_s)
    try:
        measured = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if measured.get("platform") != gridmod.platform_of(config):
        return None
    return measured.get("gb_s_median")


def roofline_rate(
    config: Experiment, shape: dict | None, stack: str, topology: str, cell: CellParams, bandwidth: float | None
) -> float | None:
    """Output tok/s at the decode roofline times the configured efficiency (cuda only), for a
    model of this shape (config.json) on cards of this copy bandwidth (GB/s)."""
    if gridmod.platform_of(config) != "cuda" or not bandwidth or not shape:
        return None
    variant = config.stacks[stack].variant
    if variant in gridmod.INT4:
        q = config.quantization
        shape = {
            **shape,
            "quantization_config": {"quant_method": variant, "bits": q.bits, "group_size": q.group_size},
        }
    topo = config.topologies[topology]
    if not cell.users:  # open loop: no fixed batch to price
        return None
    batch = cell.users / topo.instances
    context = cell.prompt_tokens + cell.output_tokens / 2
    step_bytes = roofline.decode_step_bytes(shape, variant, batch, context) / topo.tensor_parallel
    step_s = step_bytes / (bandwidth * 1e9 * config.estimate.roofline_efficiency)
    return cell.users / step_s


def job_estimates(
    config: Experiment, results: str = DEFAULT_RESULTS, bandwidth_json: str = BANDWIDTH
) -> list[JobEstimate]:
    """Every bench job of the grid, in lane order, with its estimate."""
    platform = gridmod.platform_of(config)
    est = config.estimate
    measured = Measured.read(results, platform)
    bandwidth = _bandwidth(config, bandwidth_json)  # read once, not per job
    shapes = {model: model_shape(config, model) for model in gridmod.bench_models(config)}
    prev = planmod.predecessors(config)
    lanes: dict[planmod.BenchJob, int] = {}
    clock: dict[int, float] = {}  # each lane's time so far
    compiled: dict[tuple[str, str, str], float] = {}  # when a vLLM session first filled its compile cache
    out = []
    for job in planmod.bench_jobs(config):
        before = prev[job]
        lanes[job] = lanes[before] if before else len(set(lanes.values()))
        first = before is None or planmod.session_key(config, before) != planmod.session_key(config, job)
        cell = CellParams.model_validate(gridmod.cell_params(config, gridmod.cell_by_name(config, job.cell)))
        key = (job.model, job.stack, job.topology, job.cell)
        warmup = cell.warmup_requests if first or cell.warmup == "every_cell" else 0
        tokens = cell.users * (cell.requests_per_user + warmup) * cell.output_tokens
        rate, source = measured.rate.get(key), "measured"
        if rate is None:
            rate = roofline_rate(config, shapes[job.model], job.stack, job.topology, cell, bandwidth)
            source = "roofline"
        if rate is None:
            rate, source = float(getattr(est.output_tok_s, platform)), "configured"
        rest = measured.job_s.get(key) if source == "measured" else None
        # open loop: as long as its arrivals (a closed loop, or a trace window counted in requests: None)
        if rest is None and (due := cell.load.schedule_s()) is not None:
            rest, source = due + float(est.job_overhead_s), "schedule"
        if rest is None:  # a closed loop: its tokens at the rate, and its users' ramp and thinking
            waits = cell.closed.waiting_s(cell.users, cell.requests_per_user)
            rest = tokens / rate + waits + float(est.job_overhead_s)
        start = 0.0
        if first:
            start = _startup(config, measured, job, clock.get(lanes[job], 0.0), compiled)
        out.append(JobEstimate(job, lanes[job], start, rest, rate, source))
        clock[lanes[job]] = clock.get(lanes[job], 0.0) + start + rest
    return out


def _startup(config: Experiment, measured: Measured, job: planmod.BenchJob, at: float, compiled: dict) -> float:
    """A session's start-up: warm where a vLLM session of the same model, stack and topology
    had filled the shared compile cache before this one starts (results/cache/shared), else cold."""
    platform, est, key = gridmod.platform_of(config), config.estimate, (job.model, job.stack, job.topology)
    cold = measured.startup.get(key, float(getattr(est.startup_s, platform)))
    if gridmod.family(config.stacks[job.stack]) != "vllm":
        return cold  # no compile cache to reuse
    if key in compiled and compiled[key] <= at:
        return measured.startup_warm.get(key, min(cold, float(getattr(est.startup_warm_s, platform))))
    compiled[key] = min(compiled.get(key, math.inf), at + cold)
    return cold


def runtime_minutes(config: Experiment, estimate: JobEstimate) -> int:
    """A job's cluster runtime request: its estimate times the margin, in whole minutes."""
    est = config.estimate
    return max(int(est.min_runtime_min), math.ceil(estimate.total_s * est.margin / 60))


def grid_seconds(estimates: list[JobEstimate]) -> float:
    """The grid's bench time: its longest lane."""
    lanes: dict[int, float] = {}
    for e in estimates:
        lanes[e.lane] = lanes.get(e.lane, 0.0) + e.total_s
    return max(lanes.values(), default=0.0)


def report(config: Experiment, estimates: list[JobEstimate]) -> str:
    lines = [f"{'job':<64} {'lane':>4} {'start s':>8} {'load s':>8} {'tok/s':>9}  rate from"]
    for e in estimates:
        j = e.job
        name = f"{j.model}/{j.stack}/{j.topology}/{j.cell}/run{j.run}"
        lines.append(f"{name:<64} {e.lane:>4} {e.start_s:>8.0f} {e.load_s:>8.1f} {e.rate_tok_s:>9.1f}  {e.source}")
    total = grid_seconds(estimates)
    starts = sum(e.start_s for e in estimates)
    jobs = sum(e.total_s for e in estimates)
    lanes = len({e.lane for e in estimates})
    lines.append(
        f"grid: {len(estimates)} bench jobs in {lanes} lane(s), about {total / 60:.1f} min "
        f"({starts / max(jobs, 1e-9):.0%} of the job time starting servers; model preparation not counted)"
    )
    return "\n".join(lines)
