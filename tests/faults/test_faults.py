"""Fault injection on the tiny model with the real servers: every fault ends in a recorded
status or a clear error within bounded time, with no server left behind."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import REPO, planned_outputs, run_snakemake
from speedsplit import bench, lease, session, stacks
from speedsplit import config as C
from speedsplit.results import read_result

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cfg():
    return C.load(REPO / "config/config.yaml")


@pytest.fixture(scope="module")
def gptq_model(tiny_model):
    from speedsplit.quantize import quantize

    out = tiny_model.parent / "gptq-w4g128"
    quantize(tiny_model, out, calibration_samples=8, calibration_tokens=64, eval_samples=2)
    return out


def cell(cfg, **kw):
    params = C.cell_params(cfg, "tiny", "vllm-fp16", "tp1", C.cells(cfg)[0])
    params.update(kw)
    return params


def run_cell(tmp_path, stack, cell_params, model_dir, tokenizer_dir, key, **kw):
    return bench.measure(
        session_key=key,
        stack=stack,
        cell=cell_params,
        run=0,
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        out_json=tmp_path / "r.json",
        out_requests=tmp_path / "r.requests.jsonl",
        session_log=tmp_path / "session.log",
        cache_dir=tmp_path / "cache",
        owner=os.getpid(),
        **kw,
    )


def wait_state(key, want, timeout=300):
    sess = session.Session(key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sess.state()
        if st.get("state") in want:
            return st
        time.sleep(0.2)
    raise AssertionError(f"session {key} never reached {want}")


def assert_gone(pids, within_s=30.0):
    """Every process ends within a bounded time (a server gets SIGTERM, then SIGKILL)."""
    deadline = time.monotonic() + within_s
    while any(session.pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        assert not session.pid_alive(pid), f"process {pid} is still running after {within_s:.0f} s"


def listening_addresses(pid):
    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    return {c.laddr.ip for p in procs for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_server_killed_mid_cell(cfg, tmp_path, tiny_model, gptq_model):
    """vLLM killed during the measured phase: server_died, completed requests kept, nothing left.
    The stack claims Marlin, which vLLM's CPU build does not have: the kernel check flags it."""
    stack = C.stack_params(cfg, "tiny", "vllm-marlin", "tp1")
    stack["expect_kernel"] = "Marlin"
    params = cell(cfg, users=2, output_tokens=400, requests_per_user=8, warmup_requests=1, prompt_tokens=16)
    key = "faults/kill/run0"
    seen = {}
    measuring = threading.Event()

    def progress(msg):
        if msg.startswith("measured"):  # first report: 2 s into the measured phase
            measuring.set()

    def killer():
        st = wait_state(key, ("ready",))
        seen["listen"] = listening_addresses(st["server_pids"][0])
        seen["pids"] = st["server_pids"] + [st["pid"]]
        seen["children"] = [p.pid for p in psutil.Process(st["server_pids"][0]).children(recursive=True)]
        measuring.wait(300)
        os.killpg(st["server_pids"][0], signal.SIGKILL)

    t = threading.Thread(target=killer)
    t.start()
    res = run_cell(tmp_path, stack, params, gptq_model, tiny_model, key, progress=progress)
    t.join()
    assert res["status"] == "server_died"
    assert seen["listen"] == {"127.0.0.1"}  # servers bind loopback only
    assert res["summary"]["failed"] > 0 and res["summary"]["failures"].get("connection")
    records = [json.loads(x) for x in (tmp_path / "r.requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 1 + 2 * 8 == 2 + res["summary"]["requests"]  # every request kept, done or not
    assert "kernel_mismatch" in res["flags"] and res["engine"]["linear_kernel"] == "CPUWNA16LinearKernel"
    assert read_result(tmp_path / "r.json")["status"] == "server_died"
    time.sleep(1.0)
    assert_gone(seen["pids"] + seen["children"])
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):
        pass


def test_stack_that_cannot_start(cfg, tmp_path, tiny_model):
    """A real vLLM given an argument it does not know: startup_failed with its log tail."""
    stack = C.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    stack["args"] = stack["args"] + ["--no-such-flag"]
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/nostart/run0")
    assert res["status"] == "startup_failed"
    assert "exited with code" in res["server"]["error"]
    assert "no-such-flag" in res["server"]["log_tail"]
    assert time.monotonic() - t0 < 120
    assert read_result(tmp_path / "r.json")["summary"] == {}


def test_server_that_never_gets_ready(cfg, tmp_path, tiny_model):
    stack = C.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    stack["startup_timeout_s"] = 3.0
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/slow/run0")
    assert res["status"] == "startup_failed" and "not ready within 3 s" in res["server"]["error"]
    assert time.monotonic() - t0 < 60
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in out and "faults__slow" not in out


def test_missing_or_corrupt_model_folder(cfg, tmp_path, tiny_model):
    stack = C.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_model, bad)
    (bad / "config.json").write_text("{not json")
    res = run_cell(tmp_path, stack, cell(cfg), bad, tiny_model, "faults/corrupt/run0")
    assert res["status"] == "startup_failed" and "config.json is corrupt" in res["server"]["error"]
    res = run_cell(tmp_path, stack, cell(cfg), tmp_path / "absent", tiny_model, "faults/absent/run0")
    assert res["status"] == "startup_failed" and "does not exist" in res["server"]["error"]
    gptq = C.stack_params(cfg, "tiny", "vllm-marlin", "tp1")
    res = run_cell(tmp_path, gptq, cell(cfg), tiny_model, tiny_model, "faults/notgptq/run0")
    assert res["status"] == "startup_failed" and "not GPTQ-quantized" in res["server"]["error"]


def test_lease_not_had_in_time(cfg, tmp_path, tiny_model):
    stack = C.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):  # someone else holds the card
        t0 = time.monotonic()
        res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/lease/run0", lease_timeout_s=1.0)
    assert res["status"] == "startup_failed" and "could not lease 1" in res["server"]["error"]
    assert time.monotonic() - t0 < 30


def test_port_already_taken(cfg, tmp_path, tiny_model):
    stack = C.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = stacks.launch(stack, tiny_model, "tiny", port, [], tmp_path / "server.log")
        with pytest.raises(stacks.StartupFailed) as err:
            stacks.wait_ready(srv, "/health", 120)
        stacks.stop(srv)
    assert "address already in use" in err.value.log_tail.lower()


def test_hanging_server_is_server_hung(cfg, tmp_path, tiny_model):
    """transformers serve frozen (SIGSTOP) mid-run: requests stall, status server_hung."""
    stack = C.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    params = cell(
        cfg, users=2, output_tokens=400, requests_per_user=6, warmup_requests=1, prompt_tokens=16, stall_timeout_s=3.0
    )
    key = "faults/hang/run0"
    seen = {}

    def freezer():
        st = wait_state(key, ("ready",))
        seen["pid"] = st["server_pids"][0]
        # wait for the measured phase: the warm-up ends when the first measured request is sent
        log = tmp_path / "progress.txt"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and "measured" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.2)
        time.sleep(0.5)
        os.killpg(seen["pid"], signal.SIGSTOP)

    def progress(msg):
        with open(tmp_path / "progress.txt", "a") as f:
            f.write(msg + "\n")

    t = threading.Thread(target=freezer)
    t.start()
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key, progress=progress)
    t.join()
    assert res["status"] == "server_hung", res["summary"]
    assert res["summary"]["failures"].get("stall")
    assert time.monotonic() - t0 < 300
    time.sleep(1.0)
    assert_gone([seen["pid"]])


def test_interrupted_workflow_leaves_nothing_and_resumes(tmp_path_factory):
    """SIGINT to Snakemake mid-cell: no server left, no partial result, leases free; a rerun
    keeps finished cells."""
    wd = tmp_path_factory.mktemp("interrupt")
    cfg = yaml.safe_load((REPO / "tests/config/ci.yaml").read_text())
    cfg["benchmark"]["stacks"] = ["hf-fp16"]
    cfg["chains"] = {"study": ["hf-fp16", "vllm-fp16"]}
    (wd / "c.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        str(Path(REPO / ".venv/bin/snakemake")) if (REPO / ".venv/bin/snakemake").exists() else "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(wd),
        "--configfile",
        "c.yaml",
        "--cores",
        "2",
        "--resources",
        "gpu=1",
    ]
    proc = subprocess.Popen(cmd, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    first = wd / "results/bench/tiny/hf-fp16/tp1/u4-ci-wide-greedy/run0.json"
    deadline = time.monotonic() + 600
    while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert first.exists(), proc.stdout.read().decode()[-3000:]
    time.sleep(1.0)  # the next cell of the same server is under way
    servers = [p for p in psutil.process_iter(["cmdline", "cwd"]) if _in(p, wd)]
    assert servers, "a server should be running"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches the whole group
    proc.wait(timeout=120)
    time.sleep(2.0)
    assert_gone([p.pid for p in servers])
    for path in (wd / "results/bench").rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json":
            read_result(path)
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):
        pass
    out = run_snakemake(["-n", "--configfile", "c.yaml", "--cores", "2", "--resources", "gpu=1"], wd, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    planned = planned_outputs(out.stdout)
    every = {
        f"results/bench/tiny/hf-fp16/tp1/{c}/run{r}.json"
        for c in ("u4-ci-wide-greedy", "u2-ci-narrow-greedy")
        for r in (0, 1)
    }
    finished = {p for p in every if (wd / p).exists()}
    first_cell = "results/bench/tiny/hf-fp16/tp1/u4-ci-wide-greedy/run0.json"
    assert first_cell in finished and first_cell not in planned  # finished before Ctrl-C: kept
    # every missing cell is rerun (a job stopped while it was writing its result counts as
    # unfinished for Snakemake and reruns too)
    assert every - finished <= set(planned)


def _in(proc, wd) -> bool:
    try:
        return proc.info["cwd"] == str(wd) and "speedsplit.session" not in " ".join(proc.info["cmdline"] or [])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def test_sigterm_to_one_job_stops_its_server_and_writes_nothing(cfg, tmp_path, tiny_model):
    """A single benchmark job terminated mid-cell: its server goes, no result file is left,
    its card is free again."""
    key = "faults/sigterm/run0"
    script = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from speedsplit import bench, config as C
cfg = C.load({str(REPO / "config/config.yaml")!r})
stack = C.stack_params(cfg, "tiny", "hf-fp16", "tp1")
cell = C.cell_params(cfg, "tiny", "hf-fp16", "tp1", C.cells(cfg)[0])
cell.update(users=2, output_tokens=400, requests_per_user=4, warmup_requests=1, prompt_tokens=16)
t = Path({str(tmp_path)!r})
bench.measure(session_key={key!r}, stack=stack, cell=cell, run=0, model_dir={str(tiny_model)!r},
              tokenizer_dir={str(tiny_model)!r}, out_json=t / "r.json", out_requests=t / "r.requests.jsonl",
              session_log=t / "session.log", cache_dir=t / "cache", owner=os.getpid())
"""
    job = subprocess.Popen([os.sys.executable, "-c", script], env=os.environ.copy())
    st = wait_state(key, ("ready",))
    time.sleep(2.0)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=90)
    time.sleep(1.0)
    assert_gone(st["server_pids"] + [st["pid"]])
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob(".r.json.*"))
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):
        pass
