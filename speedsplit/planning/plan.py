"""The benchmark plan: every (model, stack, topology, cell, run) job, the server session it
belongs to, and the lane order that lets consecutive jobs reuse one running server.

Jobs of one session run back to back in one lane; lanes run in parallel up to the GPUs
available. Sessions are ordered run-major (run 0 of every stack, then run 1, ...) so slow
drift of the machine spreads over all stacks instead of biasing one.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Collection
from dataclasses import asdict, replace
from pathlib import Path

from speedsplit.core.specs import BenchJob, SessionPlan
from speedsplit.models.checkpoint import INT4_FORMATS
from speedsplit.core.errors import ConfigError
from speedsplit.planning import grid as gridmod
from speedsplit.planning.experiment import Experiment


def session_key(config: Experiment, job: BenchJob) -> str:
    sid = {"per_run": f"run{job.run}", "per_stack": "all", "per_cell": f"run{job.run}-{job.cell}"}
    return f"{job.model}/{job.stack}/{job.topology}/{sid[config.benchmark.server_reuse]}"


def bench_jobs(config: Experiment) -> list[BenchJob]:
    """Every benchmark job, in lane order (sessions run-major, cells in config order)."""
    cells = gridmod.cells(config)
    jobs = []

    def of(model: str, stack: str, topology: str, run: int) -> list[BenchJob]:
        return [
            BenchJob(model, stack, topology, c.name, run)
            for c in cells
            if c.measured_by(stack) and (c.runs is None or run < c.runs)
        ]

    bench = config.benchmark
    for topology in bench.topologies:
        for model in gridmod.bench_models(config):
            if bench.server_reuse == "per_stack":  # a session's jobs must be adjacent
                for stack in gridmod.bench_stacks(config, topology):
                    for run in range(config.grid.runs):
                        jobs += of(model, stack, topology, run)
                continue
            for run in range(config.grid.runs):
                for stack in gridmod.bench_stacks(config, topology):
                    jobs += of(model, stack, topology, run)
    return jobs


def quality_carriers(config: Experiment) -> set[BenchJob]:
    """The jobs that also run the quality probe (config quality): each (model, stack,
    topology)'s last job of run 0 in lane order, so that the probe follows every run-0 cell of
    its server (after a probe, the demo's vLLM CPU cells of the same server measured 5-17%
    slower than the same cells of run 1). Run 0's last job, not the session's: a grown grid
    (more runs) must not move it and rerun the old one."""
    if not config.quality.enabled:
        return set()
    last: dict[tuple[str, str, str], BenchJob] = {}
    for job in bench_jobs(config):
        if job.run == 0:
            last[(job.model, job.stack, job.topology)] = job
    return set(last.values())


def quality_probe(config: Experiment, job: BenchJob, carriers: Collection[BenchJob] | None = None) -> dict | None:
    """The quality probe a job runs after its load, as plain builtins (its job file's
    `quality`), or None. `carriers` (quality_carriers, computed once) saves re-planning."""
    if job not in (quality_carriers(config) if carriers is None else carriers):
        return None
    q = config.quality
    from speedsplit.core.quality import LmEval, QualityProbe

    # keys in the models' order, whatever the config file's: Snakemake compares params as text
    probe = {k: getattr(q, k) for k in QualityProbe.model_fields if k != "lm_eval"}
    if q.lm_eval.tasks:  # only then in the job file: a config without tasks keeps its cells
        probe["lm_eval"] = {k: getattr(q.lm_eval, k) for k in LmEval.model_fields}
    return probe


def profiled_stacks(config: Experiment) -> list[str]:
    """The stacks mechanism.profile profiles: those it names, else every vLLM stack benchmarked."""
    pr = config.mechanism.profile
    if pr.stacks is not None:
        return list(pr.stacks)
    return [s for s in gridmod.bench_stacks(config) if gridmod.family(config.stacks[s]) == "vllm"]


def profile_window(config: Experiment, job: BenchJob) -> dict | None:
    """The window of decode steps a job profiles after its load (mechanism.profile: run 0 of a
    named cell on a profiled stack), as plain builtins, or None."""
    pr = config.mechanism.profile
    if job.run != 0 or job.cell not in pr.cells or job.stack not in profiled_stacks(config):
        return None
    return {"delay_iterations": pr.delay_iterations, "iterations": pr.iterations}


def job_cell(config: Experiment, job: BenchJob) -> dict:
    """A job's cell as its job file holds it: the cell's params, and the window it profiles
    where it profiles one (only then: a cell without keeps the params it had)."""
    cell = gridmod.cell_params(config, gridmod.cell_by_name(config, job.cell))
    window = profile_window(config, job)
    return {**cell, "profile": window} if window else cell


def lane_count(config: Experiment, topology: str) -> int:
    if gridmod.platform_of(config) != "cuda":
        return config.benchmark.cpu_lanes  # one server at a time on a CPU, unless told
    return max(1, config.gpus_available // gridmod.topology_gpus(config, topology))


def predecessors(
    config: Experiment, finished: Callable[[BenchJob], bool] | None = None
) -> dict[BenchJob, BenchJob | None]:
    """For each job, the job that runs before it in its lane (None for a lane's first).

    Given `finished` (whether a job's result exists), a finished job has no predecessor and
    is no one's: the order only matters among jobs still to run, and a finished cell behind a
    new one in its lane (a grown grid) must not be measured again because its order-only
    input is made in this run (Snakemake reruns a job whose input another job updates, even
    an ancient() one)."""
    finished = finished or (lambda job: False)
    jobs = bench_jobs(config)
    sessions: dict[str, list[BenchJob]] = {}
    for job in jobs:
        sessions.setdefault(session_key(config, job), []).append(job)
    prev: dict[BenchJob, BenchJob | None] = {}
    lane_tail: dict[tuple[str, int], BenchJob | None] = {}
    index_in_topology: dict[str, int] = {}
    # On a CPU every topology's servers share the same cores: its lanes are one pool (lanes per
    # topology let a job of another topology run between two cells of a session, whose idle
    # server its lease then stopped: the session was launched twice for one run).
    cpu = gridmod.platform_of(config) != "cuda"
    for key, members in sessions.items():
        topo = "cpu" if cpu else members[0].topology
        i = index_in_topology.get(topo, 0)
        index_in_topology[topo] = i + 1
        lane = (topo, i % lane_count(config, members[0].topology))
        for job in members:
            if finished(job):
                prev[job] = None
                continue
            prev[job] = lane_tail.get(lane)
            lane_tail[lane] = job
    return prev


def session_groups(config: Experiment, finished: Callable[[BenchJob], bool]) -> dict[BenchJob, str | None]:
    """Each bench job's Snakemake group: one per stretch of a session's jobs still to run.

    On a cluster a group is one submission, so a session's server serves all its cells
    there. A finished job (its result exists) splits its session's stretch and has no group of
    its own: Snakemake refuses a group whose jobs connect through a job outside it, which an
    order-only lane input through a finished cell would be."""
    groups: dict[BenchJob, str | None] = {}
    stretch: dict[str, int] = {}
    for job in bench_jobs(config):
        key = session_key(config, job)
        if finished(job):
            stretch[key] = stretch.get(key, 0) + 1
            groups[job] = None
        else:
            groups[job] = f"{key.replace('/', '__')}__{stretch.get(key, 0)}"
    return groups


def session_plans(config: Experiment, finished: Callable[[BenchJob], bool] | None = None) -> dict[str, SessionPlan]:
    """Every session of the grid, keyed by session key (what results/plan.json holds). Its
    last job, which stops its servers, is its last one still to run (given `finished`)."""
    finished = finished or (lambda job: False)
    members: dict[str, list[BenchJob]] = {}
    for job in bench_jobs(config):
        members.setdefault(session_key(config, job), []).append(job)
    in_flight = {c.name: _in_flight(config, c) for c in gridmod.cells(config)}
    plans = {}
    for key, jobs in members.items():
        plan = _session_plan(
            config, key, ([j for j in jobs if not finished(j)] or jobs)[-1].result, max(in_flight[j.cell] for j in jobs)
        )
        window = next((w for j in jobs if (w := profile_window(config, j))), None)
        if window:  # its servers are armed for the profiled cells' window (its traces go here)
            plan = replace(plan, profiler_dir=f"results/traces/{key.replace('/', '__')}", profiler_window=window)
        plans[key] = plan
    return plans


def _in_flight(config: Experiment, cell: gridmod.Cell) -> int:
    """Tokens a cell keeps in flight at most: every user's prompt and output at once."""
    w = config.workloads[cell.workload]
    return cell.users * (w.prompt_tokens + w.output_tokens)


def _session_plan(config: Experiment, key: str, last_job: str, kv_tokens: int = 0) -> SessionPlan:
    b, stack = config.benchmark, config.stacks[key.split("/")[1]]
    return SessionPlan(
        key=key,
        log=f"results/logs/sessions/{key.replace('/', '__')}.log",
        cache_dir=f"results/cache/{key.replace('/', '__')}",
        last_job=last_job,
        idle_timeout_s=float(b.idle_timeout_s),
        lease_timeout_s=float(b.lease_timeout_s),
        startup_timeout_s=float(stack.startup_timeout_s),
        request_timeout_s=float(b.request_timeout_s),
        stall_timeout_s=float(b.stall_timeout_s),
        kv_tokens=kv_tokens,
        cpu_slots=int(b.cpu_lanes),
        foreign_idle_s=float(b.foreign_idle_s),
        api_key=bool(b.api_key),
        api_key_env=stack.api_key_env,
    )


def profile_session(config: Experiment, model: str, stack: str, topology: str) -> dict:
    """The server session of a coordination profile: its own server, stopped when it ends."""
    return asdict(_session_plan(config, f"{model}/{stack}/{topology}/profile", last_job=""))


def plan_json(config: Experiment, finished: Callable[[BenchJob], bool] | None = None) -> dict:
    """results/plan.json: every session, and the session of every job (by result path)."""
    return {
        "sessions": {key: asdict(p) for key, p in session_plans(config, finished).items()},
        "jobs": {job.result: session_key(config, job) for job in bench_jobs(config)},
    }


def job_params(config: Experiment, job: BenchJob, carriers: Collection[BenchJob] | None = None) -> dict:
    """A job as rule job_file's params: its stack, cell and quality probe as the plain builtins
    its job file holds. Snakemake compares each param as text to rerun a changed cell, so their
    shape is kept as it was (a setting at its default is left out): a finished cell does not
    rerun when the workflow changes around it. `job_spec` is the same job, typed."""
    return {
        "stack": gridmod.stack_params(config, job.model, job.stack, job.topology),
        "cell": job_cell(config, job),
        "quality": quality_probe(config, job, carriers),
    }


def job_spec(config: Experiment, job: BenchJob, carriers: Collection[BenchJob] | None = None):
    """What the job measures as the config plans it now: the JobSpec rule job_file writes."""
    from speedsplit.core.specs import JobSpec

    return JobSpec(**job_params(config, job, carriers), run=job.run)


def snakemake_command_line(argv: list[str] | None = None) -> list[str] | None:
    """This Snakemake process's own arguments, where it was started as Snakemake (the command,
    or python -m snakemake: a cluster job's own process too, whose --force and target are the
    job it runs); None otherwise (the API, any other program)."""
    argv = sys.argv if argv is None else argv
    if not argv or "snakemake" not in Path(argv[0]).name and not argv[0].endswith("__main__.py"):
        return None
    return argv[1:]


def command_line_forcing(argv: list[str] | None = None) -> dict:
    """What this Snakemake process's command line forces (-F, -R, -f and its targets), as
    forced_reruns takes it: nothing where it was not started from the command line. (The
    Snakefile has no other view of it: Snakemake sets its DAG settings only after reading the
    Snakefile.)"""
    args = snakemake_command_line(argv)
    if not args:
        return {}
    from snakemake.cli import get_argument_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # its usage text is Snakemake's own to print
            parsed = get_argument_parser().parse_args(args)
    except SystemExit:  # not Snakemake's command line after all: Snakemake itself says so
        return {}
    return {
        "forceall": bool(parsed.forceall),
        "forcerun": set(parsed.forcerun or ()),
        "targets": set(parsed.targets or ()),
        "forcetargets": bool(parsed.force),
    }


def forced_reruns(
    config: Experiment,
    forceall: bool = False,
    forcerun: Collection[str] = (),
    targets: Collection[str] = (),
    forcetargets: bool = False,
) -> Callable[[BenchJob], bool]:
    """Which bench jobs Snakemake reruns this run though their results are there, as its
    command line forces them: every one (--forceall, -F); with --forcerun (-R), those of a rule
    named (bench, or one whose outputs are their inputs: job_file, model, and quantize or gguf
    for the stacks served on the weights it makes) or of a file named (a job's result, request
    records, job file or weights); with --force (-f), those whose results are the targets."""
    named = {str(r) for r in forcerun}
    files = {_workflow_path(f) for f in (named | set(targets) if forcetargets else named)}

    def forced(job: BenchJob) -> bool:
        if forceall or named & {"bench", "job_file", "model"}:
            return True
        weights = variant_dir(config, job.stack)
        fmt = weights.split("-")[0]
        if named & ({"quantize"} if fmt in INT4_FORMATS else {"gguf"} if fmt == "gguf" else set()):
            return True
        mine = {job.result, job.requests, job.job_file}
        mine |= {f"resources/models/{job.model}/{weights}", f"resources/models/{job.model}/fp16"}
        draft = config.stacks[job.stack].draft_model
        if draft:
            mine.add(f"resources/models/{draft}/fp16")
        return bool(files & mine)

    return forced


def _workflow_path(path: str) -> str:
    """A path as the workflow names it: relative to its folder (the current one), no ./ before."""
    p = Path(path)
    if p.is_absolute() and p.is_relative_to(Path.cwd()):
        p = p.relative_to(Path.cwd())
    return p.as_posix()


def finished_as_planned(
    config: Experiment, forced: Callable[[BenchJob], bool] | None = None
) -> Callable[[BenchJob], bool]:
    """Whether a job is finished and stays so this run: its result is there and its job file
    holds what the config plans now (read as a JobSpec: a file an older version wrote, of
    another shape but the same content, is the same job), and the command line does not force
    it (forced_reruns). A cell whose params changed, or one forced, is rerun by Snakemake, so
    the sessions and lanes plan it with the jobs still to run: such cells share a server as a
    fresh run's do (each once started its own, in scrambled order: `snakemake -R bench` on the
    demo's finished grid took 11 min 14 s, its fresh run 4 min 52 s)."""
    from speedsplit.core.specs import parse_job

    carriers = quality_carriers(config)

    def finished(job: BenchJob) -> bool:
        if (forced is not None and forced(job)) or not Path(job.result).exists():
            return False
        try:
            written, _ = parse_job(json.loads(Path(job.job_file).read_text()), job.run)
        except (OSError, ValueError):
            return False
        return written == job_spec(config, job, carriers)

    return finished


def write_plan(config: Experiment, path: str | Path, finished: Callable[[BenchJob], bool] | None = None) -> None:
    """Write results/plan.json if its content changed (a cluster job that re-reads the
    workflow never rewrites it)."""
    from speedsplit.core.results import write_json_atomic

    data = plan_json(config, finished)
    path = Path(path)
    if not path.exists() or json.loads(path.read_text()) != data:
        write_json_atomic(path, data)


def variant_dir(config: Experiment, stack: str) -> str:
    """Folder name under resources/models/{model}/ holding the weights a stack serves."""
    entry = config.stacks[stack]
    variant = entry.variant
    if variant in ("fp16", "fp8"):  # vLLM makes FP8 from the FP16 weights as it loads them
        return "fp16"
    if variant == "gguf":  # llama.cpp's file, converted from the FP16 weights
        return f"gguf-{entry.gguf_type}"
    q = config.quantization
    group = "pc" if q.group_size == -1 else q.group_size
    return f"{variant}-w{q.bits}g{group}"


# The quantize rule's report of one model's checkpoint folder (its output; the tables read it).
QUANTIZE_REPORT = "results/quantize/{model}/{variant}.json"
# The load generator's offsets on the host that measures (rule calibrate, read by every bench job).
CALIBRATION = "results/hardware/calibration.json"


def quantize_reports(config: Experiment) -> list[str]:
    """The quantize rule's reports behind the benchmarked stacks (one per model and INT4 folder)."""
    dirs = {variant_dir(config, s) for s in gridmod.bench_stacks(config)}
    dirs = {d for d in dirs if d.split("-")[0] in INT4_FORMATS}
    return [QUANTIZE_REPORT.format(model=m, variant=d) for m in gridmod.bench_models(config) for d in sorted(dirs)]


def find_job(
    config: Experiment,
    model: str,
    stack: str,
    topology: str,
    cell: str,
    run: int,
    known: Collection[BenchJob] | None = None,
) -> BenchJob:
    """The job with these wildcards; `known` (e.g. the planned jobs, computed once) saves
    re-planning the whole grid on every lookup."""
    job = BenchJob(model, stack, topology, cell, int(run))
    if job not in (known if known is not None else set(bench_jobs(config))):
        raise ConfigError(f"no benchmark job {job} in this config")
    return job
