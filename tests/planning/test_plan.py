import re

import pytest
from conftest import REPO

from speedsplit.core import specs
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning import plan as P


@pytest.fixture()
def cfg():
    return C.load(REPO / "config" / "config.yaml")


def given(*paths, top: dict | None = None) -> dict:
    """What C.load(*paths) validates (the files merged over the default config), `top` over it."""
    data = C.read_yaml(C.DEFAULT_CONFIG)
    for path in paths:
        data = C.merge(data, C.read_yaml(path))
    return C.merge(data, top or {})


def test_every_job_once_in_run_major_lane_order(cfg):
    jobs = P.bench_jobs(cfg)
    assert len(jobs) == len(set(jobs)) == 1 * 3 * 4 * 2  # models x stacks x cells x runs
    assert [j.run for j in jobs[:12]] == [0] * 12  # run 0 of every stack first
    assert jobs[0].result == "results/bench/tiny/hf-fp16/tp1/u2-wide-greedy/run0.json"
    assert jobs[0].requests.endswith("run0.requests.jsonl")


def test_one_lane_on_cpu_chains_every_job(cfg):
    prev = P.predecessors(cfg)
    jobs = P.bench_jobs(cfg)
    assert prev[jobs[0]] is None
    assert all(prev[b] == a for a, b in zip(jobs, jobs[1:]))


def test_on_a_cpu_every_topology_shares_the_one_lane():
    """Lanes per topology let another topology's job run between two cells of a session on
    the one CPU; its lease stopped the idle server, and the session was launched twice."""
    cfg = C.validate(given(REPO / "config/study.yaml", top={"platform": "cpu"}))
    prev = P.predecessors(cfg)
    assert len({t.topology for t in prev}) == 3
    assert [j for j, p in prev.items() if p is None] == [P.bench_jobs(cfg)[0]]
    # servers that barely compute may share the cores
    cfg = C.validate(given(REPO / "config/study.yaml", top={"platform": "cpu", "benchmark": {"cpu_lanes": 3}}))
    assert len([j for j, p in P.predecessors(cfg).items() if p is None]) == 3


def test_lanes_on_gpus_follow_the_cards_available():
    cfg = C.validate(given(REPO / "config" / "config.yaml", top={"platform": "cuda", "gpus_available": 2}))
    prev = P.predecessors(cfg)
    firsts = [j for j, p in prev.items() if p is None]
    assert len(firsts) == 2  # two single-card lanes
    # sessions never split across lanes: within a session each job follows the previous one
    plans = P.session_plans(cfg)
    for job, p in prev.items():
        if p is not None and P.session_key(cfg, p) != P.session_key(cfg, job):
            assert plans[P.session_key(cfg, p)].is_last(p)


def test_sessions_and_their_last_cell(cfg):
    jobs = P.bench_jobs(cfg)
    key = P.session_key(cfg, jobs[0])
    assert key == "tiny/hf-fp16/tp1/run0"
    members = [j for j in jobs if P.session_key(cfg, j) == key]
    assert len(members) == 4
    plan = P.session_plans(cfg)[key]
    assert [plan.is_last(j) for j in members] == [False, False, False, True]
    assert plan.log == "results/logs/sessions/tiny__hf-fp16__tp1__run0.log"
    assert (
        plan.cache_dir == "results/cache/tiny__hf-fp16__tp1__run0"
        and plan.idle_timeout_s == cfg.filled()["benchmark"]["idle_timeout_s"]
    )
    cfg = C.validate(given(REPO / "config" / "config.yaml", top={"benchmark": {"server_reuse": "per_cell"}}))
    plans = P.session_plans(cfg)
    assert all(plans[P.session_key(cfg, j)].is_last(j) for j in members)
    cfg = C.validate(given(REPO / "config" / "config.yaml", top={"benchmark": {"server_reuse": "per_stack"}}))
    assert P.session_key(cfg, jobs[0]) == "tiny/hf-fp16/tp1/all"
    ordered = P.bench_jobs(cfg)
    assert [j.stack for j in ordered[:8]] == ["hf-fp16"] * 8  # both runs of a stack back to back


def test_variant_dirs(cfg):
    assert P.variant_dir(cfg, "hf-fp16") == "fp16"
    assert P.variant_dir(cfg, "vllm-marlin") == "gptq-w4g128"
    cfg = C.validate(given(REPO / "config" / "config.yaml", top={"quantization": {"group_size": -1}}))
    assert P.variant_dir(cfg, "vllm-marlin") == "gptq-w4gpc"


def test_topology_stack_lists_and_unknown_jobs():
    cfg = C.load(REPO / "config" / "study.yaml")
    stacks_by_topo = {t: {j.stack for j in P.bench_jobs(cfg) if j.topology == t} for t in cfg.topologies}
    assert stacks_by_topo == {
        "tp1": {"hf-fp16", "vllm-fp16", "vllm-marlin"},
        "tp4": {"vllm-fp16", "vllm-marlin"},
        "4x1": {"vllm-fp16", "vllm-marlin"},
    }
    with pytest.raises(ConfigError, match="no benchmark job"):
        P.find_job(cfg, "llama-3.1-8b", "hf-fp16", "tp4", "u8-study-wide-greedy", 0)


def test_a_job_finds_its_session_in_the_plan_file(cfg, tmp_path):
    from speedsplit.core.results import write_json_atomic

    write_json_atomic(tmp_path / "plan.json", P.plan_json(cfg))
    jobs = P.bench_jobs(cfg)
    plan = specs.session_of(tmp_path / "plan.json", jobs[1].result)
    assert plan == P.session_plans(cfg)[P.session_key(cfg, jobs[1])]
    with pytest.raises(ConfigError, match="no job writes results/bench/x.json"):
        specs.session_of(tmp_path / "plan.json", "results/bench/x.json")


def test_a_sessions_cells_to_run_share_a_group_that_a_finished_cell_splits(cfg):
    jobs = P.bench_jobs(cfg)
    first = [j for j in jobs if P.session_key(cfg, j) == P.session_key(cfg, jobs[0])]
    assert len(first) == 4  # per_run: one stack's four cells of one run
    fresh = P.session_groups(cfg, finished=lambda job: False)
    assert {fresh[j] for j in first} == {"tiny__hf-fp16__tp1__run0__0"}
    assert len(set(fresh.values())) == len({P.session_key(cfg, j) for j in jobs})  # one per session
    split = P.session_groups(cfg, finished=lambda job: job == first[1])
    assert [split[j] for j in first] == [
        "tiny__hf-fp16__tp1__run0__0",
        None,  # finished: in no group
        "tiny__hf-fp16__tp1__run0__1",
        "tiny__hf-fp16__tp1__run0__1",
    ]


def test_a_cell_with_a_stack_list_is_measured_by_those_stacks_only():
    raw = given(REPO / "config" / "config.yaml")
    raw["grid"]["cells"] = [
        {"users": 2, "workload": "wide", "sampling": "greedy"},
        {"users": 2, "workload": "wide", "sampling": "ancestral", "stacks": ["vllm-fp16"]},
    ]
    cfg = C.validate(raw)
    jobs = P.bench_jobs(cfg)
    ancestral = {j.stack for j in jobs if j.cell == "u2-wide-ancestral"}
    assert ancestral == {"vllm-fp16"} and len(jobs) == (3 + 1) * 2
    # the session's last job is its own last cell, whichever cells it measures
    plans = P.session_plans(cfg)
    assert plans[P.session_key(cfg, jobs[0])].last_job.endswith("u2-wide-greedy/run0.json")
    raw["grid"]["cells"][1]["stacks"] = ["vllm-fp17"]
    with pytest.raises(ConfigError, match=r"grid.cells\[1\].stacks\[0\]: unknown stack 'vllm-fp17'"):
        C.validate(raw)


@pytest.mark.parametrize(
    "files, bench",
    [
        (["tests/config/grid.yaml"], 2 * 4 * 2 * 7),  # 2 models x 4 cells x 2 runs x (3 tp1 + 2 tp2 + 2 2x1)
        (["config/h200-smoke.yaml", "config/h200x4-topologies.yaml"], 2 * 3 * 2 * 2),
        (["config/h200-smoke.yaml", "config/h200x4-70b.yaml"], 2 * 2 * 2 * 2),
        (["config/h200-smoke.yaml", "config/h200-factorial.yaml"], 3 * 2 * 2),
        (["config/h200-smoke.yaml", "config/h200-capacity.yaml"], 3 * 10),  # 9 levels, the 64-user one 2 runs
        (
            [
                "config/h200-smoke.yaml",
                "config/h200-capacity.yaml",
                "config/h200-capacity-steady.yaml",
                "docs/evidence/h200x2-2026-11-30-capacity-steady/two-cards.yaml",
            ],
            2 * 9,
        ),
        # the 24 req/s cell twice and five more ladder levels, per stack
        (["config/h200-smoke.yaml", "config/h200-traffic-capped.yaml"], 2 * (2 + 5)),
        (["config/h200-smoke.yaml", "config/h200-formats.yaml"], 5 * 2 * 2),  # 5 stacks x 2 cells x 2 runs
    ],
    ids=["grid", "x4-topologies", "x4-70b", "factorial", "capacity", "capacity-steady", "traffic-capped", "formats"],
)
def test_each_shipped_config_plans_its_bench_jobs(files, bench):
    """What the dry runs (tests/workflow/test_dry_runs.py) count, counted without Snakemake."""
    cfg = C.load(*[REPO / f for f in files])
    jobs = P.bench_jobs(cfg)
    assert len(jobs) == len(set(jobs)) == bench
    prev = P.predecessors(cfg)
    assert set(prev) == set(jobs) and all(p is None or p in prev for p in prev.values())


def test_a_cell_whose_params_changed_is_planned_with_the_jobs_still_to_run(tmp_path, monkeypatch):
    """Snakemake reruns a cell whose job file the config now writes otherwise: the lanes and
    sessions plan it as a fresh run's (its stack's changed cells one after the other on one
    server), not as finished (each once started a server of its own). A job file of another
    shape but the same content (an older version's) is the same job."""
    import json
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    cfg = C.load(REPO / "config/config.yaml")
    for job in P.bench_jobs(cfg):  # a finished run: every result and job file there
        for path, content in ((job.result, {}), (job.job_file, P.job_spec(cfg, job).model_dump(mode="json"))):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(content))
    assert all(P.finished_as_planned(cfg)(job) for job in P.bench_jobs(cfg))
    wide = next(iter(cfg.workloads))
    longer = {"workloads": {wide: {"output_tokens": cfg.workloads[wide].output_tokens + 8}}}
    edited = C.validate(given(REPO / "config/config.yaml", top=longer))
    finished = P.finished_as_planned(edited)
    todo = [job for job in P.bench_jobs(edited) if not finished(job)]
    assert todo and {job.cell.split("-")[1] for job in todo} == {wide}
    prev, sessions = P.predecessors(edited, finished), P.session_plans(edited, finished)
    for key in {P.session_key(edited, job) for job in todo}:
        mine = [job for job in todo if P.session_key(edited, job) == key]
        assert all(prev[b] == a for a, b in zip(mine, mine[1:])), key  # one after the other in a lane
        assert sessions[key].last_job == mine[-1].result  # the last changed cell stops the server
    older = json.loads(Path(todo[0].job_file).read_text())
    older["stack"] = dict(reversed(older["stack"].items()))  # the keys in another order
    Path(todo[0].job_file).write_text(json.dumps(older))
    assert P.finished_as_planned(cfg)(todo[0])


def test_a_forced_rerun_is_planned_as_a_fresh_run(tmp_path, monkeypatch):
    """`snakemake -R bench` (or -F, or a rule upstream of the cells) on a finished grid reruns
    cells whose results are there: the lanes and sessions plan them as a fresh run's (each once
    started a server of its own, in scrambled order: 11 min 14 s for the demo's grid, whose
    fresh run took 4 min 52 s)."""
    import json
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    cfg = C.load(REPO / "config/config.yaml")
    jobs = P.bench_jobs(cfg)
    for job in jobs:  # a finished run: every result and job file there
        for path, content in ((job.result, {}), (job.job_file, P.job_spec(cfg, job).model_dump(mode="json"))):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(content))
    fresh = P.predecessors(cfg), P.session_plans(cfg)
    for argv in (
        ["snakemake", "-R", "bench", "--cores", "2"],
        ["snakemake", "--forceall"],
        ["snakemake", "-R", "model"],
    ):
        finished = P.finished_as_planned(cfg, P.forced_reruns(cfg, **P.command_line_forcing(argv)))
        assert not any(finished(job) for job in jobs), argv
        assert (P.predecessors(cfg, finished), P.session_plans(cfg, finished)) == fresh, argv
    # nothing forced: every job finished, none waits for another
    finished = P.finished_as_planned(cfg, P.forced_reruns(cfg, **P.command_line_forcing(["snakemake", "-n"])))
    assert all(finished(job) for job in jobs) and not any(P.predecessors(cfg, finished).values())


def test_what_a_command_line_forces():
    from pathlib import Path

    cfg = C.load(REPO / "config/config.yaml")
    jobs = P.bench_jobs(cfg)

    def forced(*argv):
        test = P.forced_reruns(cfg, **P.command_line_forcing(["/venv/bin/snakemake", *argv]))
        return [job for job in jobs if test(job)]

    assert forced("-F") == forced("-R", "bench") == forced("--forcerun", "job_file") == jobs
    # the stacks served on the weights a rule makes: quantize's GPTQ checkpoint
    assert {job.stack for job in forced("-R", "quantize")} == {"vllm-marlin"} and not forced("-R", "gguf")
    one = jobs[3]
    assert forced("-R", one.result) == [one] and forced("-R", one.job_file) == [one]
    assert forced("-R", f"./{one.result}") == forced("-R", str(Path.cwd() / one.result)) == [one]
    assert forced(one.result, "-f") == [one] and not forced(one.result)  # a target is forced by -f only
    assert {job.stack for job in forced("-R", "resources/models/tiny/gptq-w4g128")} == {"vllm-marlin"}
    assert not forced("--cores", "2", "--resources", "gpu=1") and not forced("-R", "tables")
    # not Snakemake's command line (a test, the API, a cluster job): nothing forced
    assert P.command_line_forcing(["pytest", "-q"]) == {} and P.command_line_forcing([]) == {}


def test_a_command_line_it_cannot_read_forces_nothing_and_prints_nothing(capsys):
    assert P.command_line_forcing(["snakemake", "--no-such-option"]) == {}
    assert capsys.readouterr().err == ""  # Snakemake's own parse says what is wrong


def test_the_quality_probe_follows_every_cell_its_server_measures():
    """The probe goes with a stack's last job of run 0, whatever the servers' reuse (a grown
    grid, more runs, must not move it and rerun the old carrier)."""
    for reuse, want in (("per_run", (0, -1)), ("per_stack", (0, -1)), ("per_cell", (0, -1))):
        c = C.validate(given(REPO / "config/config.yaml", top={"benchmark": {"server_reuse": reuse}}))
        carriers = P.quality_carriers(c)
        for stack in {j.stack for j in carriers}:
            run, at = want
            mine = [j for j in P.bench_jobs(c) if j.stack == stack and j.run == run]
            assert [j for j in carriers if j.stack == stack] == [mine[at]], (reuse, stack)


def test_a_profiled_window_goes_with_run_0_of_each_named_cell_on_each_vllm_stack(cfg):
    """mechanism.profile: only run 0 of a named cell on a vLLM stack profiles (transformers serve
    has no profiler); only its sessions' servers are armed; a cell that profiles nothing keeps
    its job-file params (no key added), so turning the profile on reruns only the profiled cells."""
    cell = G.cells(cfg)[0].name
    plain = {j: P.job_cell(cfg, j) for j in P.bench_jobs(cfg)}
    profile = {"mechanism": {"profile": {"cells": [cell], "iterations": 8}}}
    c = C.validate(given(REPO / "config" / "config.yaml", top=profile))
    profiled = [j for j in P.bench_jobs(c) if P.profile_window(c, j)]
    vllm = [s for s in G.bench_stacks(c) if s.startswith("vllm")]
    assert sorted((j.stack, j.cell, j.run) for j in profiled) == sorted((s, cell, 0) for s in vllm)
    assert P.job_spec(c, profiled[0]).cell.profile.iterations == 8
    for job, before in plain.items():
        after = P.job_cell(c, job)
        assert after == (
            {**before, "profile": {"delay_iterations": 16, "iterations": 8}} if job in profiled else before
        )
    armed = {k: p.profiler_dir for k, p in P.session_plans(c).items()}
    assert {k.split("/")[1] for k, d in armed.items() if d} == set(vllm)
    assert all(d is None for d in (p.profiler_dir for p in P.session_plans(cfg).values()))
    only = C.validate(
        given(
            REPO / "config" / "config.yaml",
            top=C.merge(profile, {"mechanism": {"profile": {"stacks": ["vllm-marlin"]}}}),
        )
    )
    assert {j.stack for j in P.bench_jobs(only) if P.profile_window(only, j)} == {"vllm-marlin"}


@pytest.mark.parametrize(
    "profile,said",
    [
        ({"cells": ["no-such-cell"]}, "mechanism.profile.cells[0]: unknown cell 'no-such-cell'"),
        ({"cells": [], "stacks": ["hf-fp16"]}, "mechanism.profile.stacks[0]: 'hf-fp16' is not a vLLM stack"),
        ({"cells": ["r4-mix-greedy"]}, "mechanism.profile.cells[0]: 'r4-mix-greedy' is an open-loop or trace cell"),
    ],
)
def test_a_profile_of_an_unknown_cell_or_of_a_stack_without_the_profiler_is_refused(profile, said):
    mix = {
        "workloads": {"mix": {"prompt_tokens": 16, "output_tokens": 16, "arrival": {"rates": [4], "requests": 8}}},
        "grid": {
            "cells": [
                {"users": 2, "workload": "wide", "sampling": "greedy"},
                {"users": 1, "workload": "mix", "sampling": "greedy"},
            ]
        },
    }
    with pytest.raises(ConfigError, match=re.escape(said)):
        C.validate(given(REPO / "config/config.yaml", top={**mix, "mechanism": {"profile": profile}}))
