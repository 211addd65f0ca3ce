"""Snakemake itself on the shipped configs: lint, and dry runs that build each config's whole
DAG (no GPU, no network, nothing made). How many jobs a config plans is also checked in
process, without Snakemake (tests/planning/test_plan.py); these check that Snakemake agrees."""

import subprocess
from pathlib import Path

import pytest
from conftest import REPO, planned_outputs, run_snakemake, snakemake_bin

pytestmark = pytest.mark.snakemake


def test_snakemake_lint_is_clean():
    out = subprocess.run([snakemake_bin(), "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


def dry_run_counts(configfile: Path | list[Path], cwd: Path, gpus: int) -> dict[str, int]:
    files = [str(f) for f in (configfile if isinstance(configfile, list) else [configfile])]
    out = run_snakemake(
        ["-n", "--configfile", *files, "--cores", "all", "--resources", f"gpu={gpus}", "--quiet", "rules"],
        cwd,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    counts = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert not (cwd / "resources").exists()  # nothing downloaded, nothing made
    return counts


def test_a_hub_grid_dry_run_builds_the_full_dag_without_gpu_or_network(tmp_path):
    counts = dry_run_counts(REPO / "tests/config/grid.yaml", tmp_path, gpus=2)
    # 2 models; 4 cells x 2 runs x (3 stacks on tp1 + 2 on tp2 + 2 on 2x1) per model
    assert counts["model"] == 2 and counts["quantize"] == 2
    assert counts["bench"] == 2 * 4 * 2 * 7
    assert counts["tables"] == counts["plots"] == counts["report"] == 1


@pytest.mark.parametrize(
    "overlay, bench",
    [
        ("h200x4-topologies.yaml", 2 * 3 * 2 * 2),  # 2 stacks x (tp1, tp4, 4x1) x 2 cells x 2 runs
        ("h200x4-70b.yaml", 2 * 2 * 2 * 2),  # 2 stacks x (tp4, 2x2) x 2 cells x 2 runs
    ],
)
def test_the_four_card_configs_dry_run(tmp_path, overlay, bench):
    counts = dry_run_counts([REPO / "config/h200-smoke.yaml", REPO / "config" / overlay], tmp_path, gpus=4)
    assert counts["bench"] == bench


def test_the_factorial_config_dry_runs_with_its_table(tmp_path):
    files = [str(REPO / "config/h200-smoke.yaml"), str(REPO / "config/h200-factorial.yaml")]
    out = run_snakemake(["-n", "--configfile", *files, "--cores", "all", "--resources", "gpu=1"], tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "results/tables/factorial.parquet" in out.stdout
    # 3 stacks x 2 cells (greedy, ancestral) x 2 runs
    assert len(planned_outputs(out.stdout)) == 12


def test_the_capacity_configs_dry_run(tmp_path):
    base = [REPO / "config/h200-smoke.yaml", REPO / "config/h200-capacity.yaml"]
    # 3 stacks x 9 levels, the 64-user level a grid cell of 2 runs
    assert dry_run_counts(base, tmp_path, gpus=1)["bench"] == 3 * 10
    steady = [
        REPO / "config/h200-capacity-steady.yaml",
        REPO / "docs/evidence/h200x2-2026-11-30-capacity-steady/two-cards.yaml",
    ]
    assert dry_run_counts(base + steady, tmp_path, gpus=2)["bench"] == 2 * 9


def test_a_local_run_plans_no_group_jobs(tmp_path):
    """A session's cells are one group only where jobs are submitted (tests/workflow/
    test_slurm.py sees a cluster run submit one per session): a local or dry run names no group,
    which spares it Snakemake's group check (it walks each grouped job's whole lane)."""
    out = run_snakemake(
        ["-n", "--configfile", str(REPO / "tests/config/ci.yaml"), "--cores", "2", "--resources", "gpu=1"],
        tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rule bench:" in out.stdout
    assert "Group job" not in out.stdout + out.stderr
    # every cell waits for the bandwidth copy (order only): run between two cells of one server,
    # it took the card from it, and the server was stopped for it and started again
    jobs = _job_lines(out.stdout, "bench", "input")
    assert jobs and all("results/hardware/bandwidth.json" in inputs for inputs in jobs), jobs[:1]


def _job_lines(stdout: str, rule: str, field: str) -> list[str]:
    """Each planned job of a rule's line `field:` (input, resources, ...), from a dry run's listing."""
    return [job.partition(f"{field}:")[2].partition("\n")[0] for job in stdout.split(f"rule {rule}:")[1:]]


def test_a_dummy_quantization_takes_no_card_and_a_real_one_does(tmp_path):
    """On a GPU host the dummy INT4 config is written while the first server starts; GPTQModel
    (and every job on a CPU, where the one "card" keeps jobs apart) takes a card."""
    for config, gpu in (("config/h200-smoke.yaml", "gpu=0"), ("tests/config/ci.yaml", "gpu=1")):
        out = run_snakemake(["-n", "--configfile", str(REPO / config), "--cores", "2", "--resources", "gpu=1"],
                            tmp_path, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        jobs = _job_lines(out.stdout, "quantize", "resources")
        assert jobs and all(r.strip().endswith(gpu) for r in jobs), (config, jobs)


def test_the_shipped_study_config_dry_runs(tmp_path):
    counts = dry_run_counts(REPO / "config/study.yaml", tmp_path, gpus=4)
    assert counts["bench"] > 0 and counts["report"] == 1


def test_a_cluster_run_plans_the_profiles_platform_not_the_submitting_hosts(tmp_path):
    """No GPU here, yet through profiles/slurm a GPU config plans cuda cells: tp2 asks Slurm
    for two cards (a dry run; tests/test_slurm.py sees a real run refuse `platform: auto`)."""
    gpu_configs = ["--configfile", str(REPO / "config/h200-smoke.yaml"), str(REPO / "config/h200-topologies.yaml")]
    out = run_snakemake(["-n", "--profile", str(REPO / "profiles/slurm"), *gpu_configs], tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    bench = [b for b in out.stdout.split("\n\n") if "rule bench:" in b]
    tp2 = [b for b in bench if "topology=tp2" in b]
    assert tp2 and all("gpu=2" in b and "runtime=" in b for b in tp2)
    assert all("gpu=1" in b for b in bench if "topology=tp1" in b)


@pytest.mark.snakemake
def test_a_working_folder_with_a_space_is_refused_at_once_in_one_line(tmp_path):
    """vLLM's compile cache under results/cache breaks in such a folder (Inductor's g++ splits
    the path): refused before anything runs, in one line naming the space."""
    spaced = tmp_path / "my project"
    spaced.mkdir()
    out = run_snakemake(["-n", "--cores", "1"], spaced, timeout=120)
    said = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode != 0
    assert said[-1] == (
        f"speedsplit: the working folder ({spaced}) has a space in its path: vLLM's compile cache under "
        "results/cache breaks there (Inductor's g++ splits the path); run from a folder without one"
    )
    assert [s for s in said[:-1] if not s.startswith("Using workflow specific profile")] == []  # nothing else
    assert not (spaced / "results").exists()


def test_a_python_with_a_space_in_its_path_is_refused_in_one_line():
    from speedsplit.planning.config import check_paths
    from speedsplit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"the Python that runs the jobs \(/tmp/my env/bin/python\) has a space"):
        check_paths("/work", "/tmp/my env/bin/python")
    check_paths("/work", "/usr/bin/python3")  # neither: nothing to say
