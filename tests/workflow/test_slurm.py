"""The workflow through a real Slurm: a one-node cluster on this machine (tests/slurm_cluster.py)
runs the default workflow on the tiny model through profiles/slurm. Jobs go through sbatch, a
session's cells go out as one submission and share its server, and the results have the
structure of a local run's."""

import json
import os
import re
import subprocess
import time

import pytest
from conftest import REPO, run_snakemake
from slurm_cluster import SlurmUnavailable, one_node_cluster

from speedsplit.core.record import read_result
from speedsplit.serving import session_state

pytestmark = pytest.mark.slow

# One stack, both cells, one run (2 bench jobs, one session, its quality probe after its last
# cell as in a local run); no link control or profile. What Slurm changes (submissions, a group
# a session, the card asked as a resource) is the same for every engine: a second stack (a vLLM
# start, 60-90 s of both cores here) added nothing to check, and what a second run adds, its own
# place in the session's lane, the local run checks. (One stack decomposes no chain: the run is
# told to accept that.) The model trains 20 steps, not ci.yaml's 150: its quality says nothing
# here, only that the probe ran.
OVERRIDES = """models: {tiny: {training: {steps: 20}}}
benchmark: {stacks: [hf-fp16], fail_on_undecomposed: false}
grid: {runs: 1}
link_control: {enabled: false}
coordination: {enabled: false}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with one_node_cluster(tmp_path_factory.mktemp("slurm")) as env:
            yield env
    except SlurmUnavailable as exc:
        if os.environ.get("CI"):
            raise  # CI installs Slurm (.ci/run): there it must run
        pytest.skip(f"no Slurm cluster here: {exc}")


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    wd = tmp_path_factory.mktemp("wf-slurm")
    (wd / "ci.yaml").write_text((REPO / "tests/config/ci.yaml").read_text())
    (wd / "slurm.yaml").write_text(OVERRIDES)
    args = [
        "--profile",
        str(REPO / "profiles/slurm"),
        "--configfile",
        "ci.yaml",
        "slurm.yaml",
        # the nodes' platform (the profile says cuda; this node has none)
        "--config",
        "platform=cpu",
        # a cluster without accounting: no account, and squeue for job states
        "--slurm-no-account",
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "5",
        # each finished submission was seen up to 10 s late (Snakemake's default): 2 s here
        "--seconds-between-status-checks",
        "2",
        "--slurm-keep-successful-logs",
        # this node's memory, not a GPU node's
        "--default-resources",
        "mem_mb=2000",
        "--set-resources",
        "model:mem_mb=4000",
        "bench:mem_mb=6000",
        "--jobs",
        "4",
    ]
    t0 = time.monotonic()
    out = run_snakemake(args, wd, timeout=1500, env=cluster)
    (wd / "snakemake.out").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    return {"dir": wd, "log": out.stdout + out.stderr, "wall_s": time.monotonic() - t0, "env": cluster}


def submissions(log: str) -> dict[int, str]:
    """Slurm job id -> its log path, from Snakemake's 'submitted with SLURM jobid' lines."""
    return {int(m[1]): m[2] for m in re.finditer(r"submitted with SLURM jobid (\d+) \(log: ([^)]+)\)", log)}


def test_every_job_went_through_slurm_and_a_session_is_one_submission(slurm_run):
    subs = submissions(slurm_run["log"])
    logs = sorted(subs.values())
    groups = [p for p in logs if "/group_" in p]
    assert len(groups) == 1, logs  # one per session (hf-fp16's), its 2 bench jobs
    assert not [p for p in logs if "/rule_bench/" in p], logs
    assert any("/rule_model/" in p for p in logs) and any("/rule_bandwidth/" in p for p in logs), logs
    shown = {}
    for jobid, path in subs.items():
        shown[path] = subprocess.run(
            ["scontrol", "show", "job", str(jobid)], capture_output=True, text=True, env=slurm_run["env"], timeout=10
        ).stdout
        assert "JobState=COMPLETED" in shown[path], shown[path]
    for group_log in groups:
        ran = set(re.findall(r"output: (results/bench/\S+/run\d\.json)", open(group_log).read()))
        assert len(ran) == 2 and len({r.split("/")[3] for r in ran}) == 1, ran  # one stack's 2 cells
        # the profile's gpu resource became a request for one card (a tp1 server)
        assert "TresPerJob=gres:gpu:1" in shown[group_log], shown[group_log]


def test_a_sessions_cells_shared_one_server(slurm_run):
    by_stack: dict[str, list] = {}
    for path in sorted((slurm_run["dir"] / "results/bench").rglob("run*.json")):
        res = read_result(path)
        by_stack.setdefault(res.stack, []).append(res)
    assert sorted(by_stack) == ["hf-fp16"]
    for stack, results in by_stack.items():
        assert all(r.status == "ok" for r in results), stack
        assert sorted(r.server.cells_before for r in results) == [0, 1], stack
        assert len({(r.server.startup_s, r.server.argv) for r in results}) == 1, stack


def shape(value):
    """A value's structure: keys that hold something, and the kinds of the things they hold."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_results_have_the_structure_of_a_local_run(slurm_run, local_run):
    ours = sorted(p.relative_to(slurm_run["dir"]) for p in (slurm_run["dir"] / "results/bench").rglob("run*.json"))
    assert len(ours) == 2
    for rel in ours:
        here, there = json.loads((slurm_run["dir"] / rel).read_text()), json.loads((local_run / rel).read_text())
        for res in (here, there):
            # the server's counters, or why none: whether a 0.5 s sample fell inside a short
            # measured phase is timing, not structure (one of the two, always)
            tel = res["telemetry"]
            assert (tel.pop("server", None) is None) != (tel.pop("server_absent", None) is None), rel
        assert shape(here) == shape(there), rel
        assert here["provenance"]["hardware"]["platform"] == "cpu" and not here["flags"], rel
    for table in ("runs", "cells", "attribution"):
        assert (slurm_run["dir"] / f"results/tables/{table}.csv").is_file()
    assert (slurm_run["dir"] / "results/report.html").is_file()


def test_no_server_is_left_running(slurm_run):
    ours = [st for st in session_state.host_states() if st.workflow == str(slurm_run["dir"].resolve())]
    assert sorted(st.key for st in ours) == ["tiny/hf-fp16/tp1/all"]
    for st in ours:
        assert st.state == "stopped" and not session_state.daemon_alive(st)
        assert not any(r.alive() for r in st.servers)


def test_a_cluster_run_without_a_platform_is_refused_before_any_submission(cluster, tmp_path):
    """`platform: auto` would be decided by this (submitting) machine for the nodes."""
    out = run_snakemake(
        ["--executor", "slurm", "--jobs", "1", "--slurm-no-account"], tmp_path, timeout=300, env=cluster
    )
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "speedsplit: config key platform: 'auto' cannot be resolved for a cluster run" in log, log[-3000:]
    assert not submissions(log) and not (tmp_path / "results/bench").exists()
