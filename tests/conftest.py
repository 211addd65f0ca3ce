"""Shared fixtures: a private lock folder per test session and a tiny synthesised model."""

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The test processes keep the bytecode of what they compile (the test modules as pytest rewrites
# their asserts, the project's own modules) even where PYTHONDONTWRITEBYTECODE is set, as on the 2-core
# hosts this project is tested on: every pytest process rewrote all 180 test modules again (4 of the 12 s a
# collection took on 2 cores), and every workflow job compiled the project's modules again. The
# servers and jobs the tests start keep the environment as it is (serving/caches.py is about it).
sys.dont_write_bytecode = False

from speedsplit.serving.caches import MODELINFOS_ENV  # noqa: E402 (after the repository is on the path)


# How `make test`'s workers (pytest-xdist) share the tests: one test at a time, except modules
# whose tests share a server, a run or a model made once (tests/workflow/test_truth.py shares
# one too, but it runs alone, after the workers: marker serial). Such a module's tests go to one
# worker together: handed out one at a time, its module fixture was made again on every worker
# that got one of them, and again on one worker after another module's test (the GGUF
# conversions three times, 28 s each on 2 busy cores). The local_run modules use the session
# fixture local_run (the whole DAG, about 200 s), so they go to one worker together; as one of
# the three units with the most tests it starts at once (xdist hands those out first).
LOCAL_RUN_MODULES = ("tests/workflow/test_workflow.py", "tests/workflow/test_slurm.py")
SHARED_FIXTURE_MODULES = (
    "tests/probes/test_loadgen.py",  # a server
    "tests/serving/test_hf_generate.py",  # a server
    "tests/workflow/test_truth_faults.py",  # a workflow run
    "tests/models/test_gguf.py",  # the checkpoint converted to GGUF
    "tests/models/test_train.py",  # a trained model
    "tests/models/test_prompts.py",  # a trained tokenizer's prompts
    "tests/probes/test_quality_tasks.py",  # a trained model
    "tests/analysis/test_quality_truth.py",  # reference servers probed for quality
)


def pytest_xdist_make_scheduler(config, log):
    """(xdist's own xdist_group marks do nothing under pytest 9: xdist 3.8 renames the tests
    through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            if module in LOCAL_RUN_MODULES:
                return "local_run"
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    return Units(config, log)


def pytest_collection_modifyitems(config, items):
    # Under xdist, the modules that start servers or run workflows first (each module's tests in
    # their order): xdist hands out the units of one test in collection order after the shared
    # ones, and the fault tests, collected last, made the workers' last minutes one long test each.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        heavy = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: item.nodeid.split("::")[0] not in heavy)
    for item in items:
        module = item.nodeid.split("::")[0]
        if "local_run" in item.fixturenames and module not in LOCAL_RUN_MODULES:
            raise pytest.UsageError(f"{module} uses local_run: add it to LOCAL_RUN_MODULES in tests/conftest.py")


@pytest.fixture(autouse=True, scope="session")
def shared_model_inspection(tmp_path_factory):
    """Every workflow and server of the run (every worker's) reads one folder of vLLM's model
    inspection (serving/caches.MODELINFOS_ENV): a cold one took 12 s of each vLLM start here
    alone, 27 s beside the other workers. local_run keeps the results folder's own (its layout is
    checked)."""
    base = tmp_path_factory.getbasetemp()  # a worker's is inside the run's: the run's, for all of them
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "modelinfos"
    os.environ[MODELINFOS_ENV] = str(path)
    yield path


@pytest.fixture(autouse=True, scope="session")
def private_locks(tmp_path_factory):
    """Leases and sessions of the tests never meet those of a workflow running beside them."""
    path = tmp_path_factory.mktemp("locks")
    os.environ["SPEEDSPLIT_LOCK_DIR"] = str(path)
    yield path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from speedsplit.models.checkpoint import synthesize

    out = tmp_path_factory.mktemp("models") / "tiny" / "fp16"
    synthesize("tiny", out)
    return out


PLANTED_TOKEN = "hf_PlantedSecretToken0123456789abcdef"


@pytest.fixture(scope="session")
def local_run(tmp_path_factory):
    """The whole DAG run once, locally, on tests/config/ci.yaml in a fresh folder (with a
    planted HF_TOKEN that must reach no output)."""
    wd = tmp_path_factory.mktemp("wf")
    shutil.copy(REPO / "tests/config/ci.yaml", wd / "ci.yaml")
    out = run_snakemake(
        ["--configfile", "ci.yaml", "--cores", "2", "--resources", "gpu=1"],
        wd,
        timeout=1200,
        env={"HF_TOKEN": PLANTED_TOKEN, MODELINFOS_ENV: None},
    )
    (wd / "snakemake.out").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    return wd


def snakemake_bin() -> str:
    exe = Path(sys.executable).parent / "snakemake"
    return str(exe) if exe.exists() else shutil.which("snakemake")


def run_snakemake(
    args: list[str], cwd: Path, timeout: float = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Snakemake on the repository's workflow in cwd, this process's environment with env over
    it (a value of None unsets that variable)."""
    cmd = [snakemake_bin(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(cwd), *args]
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full)


def planned_outputs(dry_run_stdout: str, prefix: str = "results/bench/") -> list[str]:
    """The bench result files a `snakemake -n` run would make (from its 'output:' lines)."""
    outs = []
    for line in dry_run_stdout.splitlines():
        line = line.strip()
        if line.startswith("output:"):
            outs += [
                p.strip()
                for p in line[len("output:") :].split(",")
                if p.strip().startswith(prefix) and p.strip().endswith(".json")
            ]
    return sorted(set(outs))


def measure_alone(stack: dict, cell: dict, model, tmp_path: Path, startup_timeout_s: float = 900.0):
    """One cell run, as a bench job runs it, on a session of its own that ends with it; its
    request records at tmp_path / "r.requests.jsonl"."""
    from speedsplit.core import procs
    from speedsplit.measuring import bench
    from speedsplit.core.specs import BenchJob, SessionPlan

    last = BenchJob(stack["model"], stack["stack"], stack["topology"], cell["cell"], 0).result
    key = f"alone/{stack['stack']}/{cell['cell']}"
    plan = SessionPlan(
        key, str(tmp_path / "s.log"), str(tmp_path / "c"), last, 120.0, 600.0, startup_timeout_s, 600.0, 120.0
    )
    return bench.measure(
        job={"stack": stack, "cell": cell, "run": 0},
        run=0,
        session=plan,
        model_dir=model,
        tokenizer_dir=model,
        out_json=tmp_path / "r.json",
        out_requests=tmp_path / "r.requests.jsonl",
        owner=procs.me(),
    ), plan


@pytest.fixture()
def small_disk(tmp_path):
    """A 4 MiB filesystem of its own (tmpfs; mounting needs root, as CI has)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small filesystem here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill the filesystem of disk until `leave` bytes are free."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with contextlib.suppress(OSError), open(disk / "ballast", "wb", buffering=0) as f:
        f.write(b"\0" * max(0, free - leave))


def assert_gone(processes, within_s=30.0):
    """Every process ends within a bounded time (speedsplit sends SIGTERM, then SIGKILL): what the
    project's own cleanup left, never the test's."""
    import time

    from speedsplit.core import procs

    deadline = time.monotonic() + within_s
    while any(p.alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"{p.pid} {' '.join(procs.cmdline(p.pid))[:80]}" for p in processes if p.alive()]
    assert not left, f"still running after {within_s:.0f} s: {left}"
