"""The benchmark plan: every (model, stack, topology, cell, run) job, the server session it
belongs to, and the lane order that lets consecutive jobs reuse one running server.

Jobs of one session run back to back in one lane; lanes run in parallel up to the GPUs
available. Sessions are ordered run-major (run 0 of every stack, then run 1, ...) so slow
drift of the machine spreads over all stacks instead of biasing one.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from speedsplit import config as cfgmod


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


def session_key(config: dict, job: BenchJob) -> str:
    sid = {"per_run": f"run{job.run}", "per_stack": "all", "per_cell": f"run{job.run}-{job.cell}"}
    return f"{job.model}/{job.stack}/{job.topology}/{sid[config['benchmark']['server_reuse']]}"


def bench_jobs(config: dict) -> list[BenchJob]:
    """Every benchmark job, in lane order (sessions run-major, cells in config order)."""
    cells = [c.name for c in cfgmod.cells(config)]
    jobs = []
    for topology in config["benchmark"]["topologies"]:
        for model in cfgmod.bench_models(config):
            if config["benchmark"]["server_reuse"] == "per_stack":  # a session's jobs must be adjacent
                for stack in cfgmod.bench_stacks(config, topology):
                    for run in range(config["grid"]["runs"]):
                        jobs += [BenchJob(model, stack, topology, cell, run) for cell in cells]
                continue
            for run in range(config["grid"]["runs"]):
                for stack in cfgmod.bench_stacks(config, topology):
                    jobs += [BenchJob(model, stack, topology, cell, run) for cell in cells]
    return jobs


def lane_count(config: dict, topology: str) -> int:
    if cfgmod.platform_of(config) != "cuda":
        return 1  # one server at a time on a CPU
    return max(1, config["gpus_available"] // cfgmod.topology_gpus(config, topology))


def predecessors(config: dict) -> dict[BenchJob, BenchJob | None]:
    """For each job, the job that runs before it in its lane (None for a lane's first)."""
    jobs = bench_jobs(config)
    sessions: dict[str, list[BenchJob]] = {}
    for job in jobs:
        sessions.setdefault(session_key(config, job), []).append(job)
    prev: dict[BenchJob, BenchJob | None] = {}
    lane_tail: dict[tuple[str, int], BenchJob | None] = {}
    index_in_topology: dict[str, int] = {}
    for key, members in sessions.items():
        topo = members[0].topology
        i = index_in_topology.get(topo, 0)
        index_in_topology[topo] = i + 1
        lane = (topo, i % lane_count(config, topo))
        for job in members:
            prev[job] = lane_tail.get(lane)
            lane_tail[lane] = job
    return prev


def last_in_session(config: dict, job: BenchJob) -> bool:
    key = session_key(config, job)
    members = [j for j in bench_jobs(config) if session_key(config, j) == key]
    return members[-1] == job


def variant_dir(config: dict, stack: str) -> str:
    """Folder name under resources/models/{model}/ holding the weights a stack serves."""
    if config["stacks"][stack]["variant"] == "fp16":
        return "fp16"
    q = config["quantization"]
    group = "pc" if q["group_size"] == -1 else q["group_size"]
    return f"gptq-w{q['bits']}g{group}"


def find_job(
    config: dict, model: str, stack: str, topology: str, cell: str, run: int, known: Collection[BenchJob] | None = None
) -> BenchJob:
    """The job with these wildcards; `known` (e.g. the planned jobs, computed once) saves
    re-planning the whole grid on every lookup."""
    job = BenchJob(model, stack, topology, cell, int(run))
    if job not in (known if known is not None else set(bench_jobs(config))):
        raise cfgmod.ConfigError(f"no benchmark job {job} in this config")
    return job
