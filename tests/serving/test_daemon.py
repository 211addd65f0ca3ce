"""A session's daemon (speedsplit/serving/daemon.py), spawned as a cell job spawns it, on the
reference server: the servers it launches and with what, the state it publishes, and how it
stops them (told, idle, a dead workflow, SIGTERM, a server that dies or cannot serve)."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_gone
from records import stack_spec

from speedsplit.core import procs
from speedsplit.core.results import write_json_atomic
from speedsplit.serving import daemon, lease, serverlog, session
from speedsplit.serving import reference as R
from speedsplit.serving.caches import MODELINFOS_ENV
from speedsplit.serving.session_state import (
    DIED,
    READY,
    STARTING,
    STARTUP_FAILED,
    STOPPED,
    STOPPING,
    Launch,
    LaunchFile,
    Session,
    _new_generation,
    daemon_alive,
    host_states,
    transition,
)

# The reference server run through a module of the session's folder: it has no bytecode (so the
# daemon gives it a bytecode folder), it waits until the test says go (a file "go" beside it),
# and it dies, naming why, when the test says so (a file "die"). SERVER_FAULT=bytecode: it fails
# before it listens, as a server that imported a bytecode file cut short fails.
HELD_SERVER = """
import os
import sys
import threading
import time
from pathlib import Path

if os.environ.get("SERVER_FAULT") == "bytecode":
    print("ValueError: bad marshal data (unknown type code)", flush=True)
    time.sleep(0.3)
    sys.exit(1)
while not Path("go").exists():
    time.sleep(0.05)


def die_when_told():
    while not Path("die").exists():
        time.sleep(0.05)
    print("RuntimeError: the engine died (told to by the test)", flush=True)
    time.sleep(0.3)
    os._exit(3)


threading.Thread(target=die_when_told, daemon=True).start()
from speedsplit.serving import reference

reference.main()
"""
ARGS = ["--served-model-name", "{served_name}", "--host", "{host}", "--port", "{port}", "--ttft-s", "0", "--itl-s", "0"]


def held_stack(**changes):
    """The reference stack, run through the held module, with a key, and an environment of its own."""
    base = dict(
        stack="reference",
        args=["{python}", "-m", "held_reference", *ARGS],
        env={"PYTHONDONTWRITEBYTECODE": "1", "SERVER_SAYS": "{served_name} on {port}"},
        startup_timeout_s=30.0,
        api_key=True,
        api_key_env="SPEEDSPLIT_API_KEY",
    )
    return stack_spec(**{**base, **changes})


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """The session's workflow folder (this process's too), holding the held server's module."""
    monkeypatch.chdir(tmp_path)
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONPYCACHEPREFIX"):
        monkeypatch.delenv(name, raising=False)  # a launch sets them only where they are unset
    monkeypatch.setenv("SPEEDSPLIT_API_KEY", "sk-from-the-users-shell")  # never handed on
    (tmp_path / "held_reference.py").write_text(HELD_SERVER)
    yield tmp_path
    # only after a failed test is anything left: stopped, so the next test finds the card free
    for st in host_states():
        if st.workflow == str(tmp_path.resolve()) and daemon_alive(st):
            session.stop_daemon(Session(st.key, st.workflow))


def open_held(workdir, tiny_model, key, stack=None, owner=None, idle_timeout_s=60.0, go=True, log="s.log"):
    """Spawn the session's daemon as a cell job does (its log workdir / log, its servers' beside
    it); returns the session and its generation."""
    if go:
        (workdir / "go").touch()
    launch = Launch(
        stack=stack or held_stack(),
        model_dir=str(tiny_model),
        cache_dir=str(workdir / "cache"),
        shared_cache_dir=str(workdir / "shared"),
    )
    sess, reused, gen = session.open_session(key, launch, workdir / log, owner or procs.me(), idle_timeout_s, 30.0)
    assert not reused
    return sess, gen


def wait_until(what, timeout_s=30.0):
    """what()'s first true value, polled within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def wait_state(sess, states, timeout_s=30.0):
    return wait_until(lambda: (st := sess.state()).state in states and st, timeout_s)


def assert_released(ports):
    """The card (the CPU's one slot) and the ports of the lease are free for the next session."""
    lease.acquire_gpus(1, timeout_s=0, devices=["cpu"]).release()
    for port in ports:
        taken = lease.try_lock(lease.lock_dir() / f"port-{port}.lock")
        assert taken is not None, f"port {port} is still leased"
        taken.close()


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def port_of(pid: int) -> int:
    argv = procs.cmdline(pid)
    return int(argv[argv.index("--port") + 1])


def port_of_url(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def launched_port(workdir) -> int:
    """The port of the session's server, as its log's launching line says."""
    log = (workdir / "s.server0.log").read_text().splitlines()
    words = next(line for line in log if line.startswith("[speedsplit] launching:")).split()
    return int(words[words.index("--port") + 1])


def daemon_log(workdir, log="s.log") -> list[str]:
    return (workdir / log).read_text().splitlines()


@pytest.mark.slow
def test_a_session_waits_for_its_card_launches_its_server_as_told_and_stops_once_idle(workdir, tiny_model):
    """The launch the daemon is given: the stack's environment with its placeholders filled, a
    port of the lease for vLLM's own use, the shared compile cache (held until ready) with the
    host's model inspection, a bytecode folder for an engine without bytecode, the session's API
    key. Its state: starting (waiting for the card, naming who holds it; then its server
    listed), ready with its server's facts; held while a cell measures, stopped once idle."""
    key = "daemon/launch/run0"
    holder = lease.acquire_gpus(1, timeout_s=0, devices=["cpu"])  # the card is ours, for now
    t_open = time.monotonic()
    sess, gen = open_held(workdir, tiny_model, key, idle_timeout_s=2.0, go=False)
    waiting = wait_until(lambda: (st := sess.state()).waiting_for and st)
    me = f"process {os.getpid()} ({' '.join(procs.cmdline(os.getpid()))[:120]})"
    assert waiting.state == STARTING and waiting.waiting_for == [me] and waiting.lease_holders == [me]
    assert waiting.servers == []  # nothing launched on a card it does not hold
    time.sleep(1.0)
    holder.release()
    t_release = time.monotonic()

    starting = wait_until(lambda: (st := sess.state()).servers and st)
    assert starting.state == STARTING and len(starting.servers) == 1
    server = starting.servers[0]
    port, env = port_of(server.pid), environ(server.pid)
    shared = workdir / "shared"
    (cache_lock,) = shared.glob("*.lock")
    cache_key = cache_lock.stem
    assert lease.try_lock(cache_lock) is None  # the shared compile cache is this session's while it starts
    instance = shared / cache_key / "instance0"
    assert env["SERVER_SAYS"] == f"tiny on {port}"
    vllm_port = int(env["VLLM_PORT"])
    assert vllm_port != port and lease.try_lock(lease.lock_dir() / f"port-{vllm_port}.lock") is None
    assert (env["VLLM_CACHE_ROOT"], env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) == (
        str(instance / "vllm"),
        str(instance / "inductor"),
        str(instance / "triton"),
    )
    inspection = (instance / "vllm" / "modelinfos").resolve()
    assert inspection.parent == Path(os.environ[MODELINFOS_ENV]).resolve()
    assert env["PYTHONPYCACHEPREFIX"] == str((shared / "pycache").resolve()) and "PYTHONDONTWRITEBYTECODE" not in env
    secret = session.api_key_of(sess, gen)
    assert env["SPEEDSPLIT_API_KEY"] == secret and secret.startswith("sk-speedsplit-")

    go = time.monotonic()
    (workdir / "go").touch()
    ready = wait_state(sess, {READY})
    assert ready.servers == [server] and ready.daemon == starting.daemon
    assert ready.urls == [f"http://127.0.0.1:{port}"] and ready.model_id == "tiny"
    assert ready.devices == ["cpu"] and ready.cpus is None and ready.client_cpus is None
    assert ready.argv == f"{sys.executable} -m held_reference " + " ".join(ARGS).format(
        served_name="tiny", host="127.0.0.1", port=port
    )
    assert ready.server_logs == [str(workdir / "s.server0.log")]
    head = (workdir / "s.server0.log").read_text().split("\n")[:2]
    assert head == [
        f"[speedsplit] bytecode in {shared / 'pycache'} (PYTHONDONTWRITEBYTECODE is set and held_reference has "
        "none: without it every start compiles every module it imports)",
        f"[speedsplit] launching: {ready.argv}",
    ]
    assert ready.log_offsets == [len(("\n".join(head) + "\n").encode())]
    assert ready.compile_cache_dir == f"shared {cache_key}" and ready.api_key_required is True
    assert (ready.memory_cap, ready.host_memory, ready.wide_listeners, ready.cells_measured) == (None, None, [], 0)
    assert ready.waiting_for == [me] and 1.0 <= ready.lease_wait_s <= t_release - t_open + 3.0
    assert ready.startup_s >= go - t_release  # its start counts from the card's lease to ready
    held_cache = lease.try_lock(cache_lock)  # ready: the next session may have the shared cache
    assert held_cache is not None
    held_cache.close()
    # the server wrote what it imported into the bytecode folder (speedsplit's modules included)
    tag = sys.implementation.cache_tag
    compiled = [p.relative_to(shared / "pycache") for p in (shared / "pycache").rglob("reference.*.pyc")]
    assert compiled == [Path(R.__file__).parent.relative_to("/") / f"reference.{tag}.pyc"]
    tree = procs.tree(server.pid)

    with session.attached(sess, gen) as held:  # a cell measures: never idle, however long
        assert held is not None
        time.sleep(3.5)
        assert sess.state().state == READY and all(p.alive() for p in tree)
    released = time.monotonic()
    stopping = wait_state(sess, {STOPPING, STOPPED})
    assert time.monotonic() - released > 0.5  # idle counted from the cell's end (less one poll of the daemon)
    assert stopping.evicted_by is None
    assert_gone(tree + [ready.daemon])
    assert sess.state().state == STOPPED
    said = daemon_log(workdir)
    assert f"[session {key}] waiting for the cards: {me}" in said
    assert f"[session {key}] ready in {ready.startup_s:.1f} s at {ready.urls}" in said
    assert f"[session {key}] idle for 2 s" in said
    assert_released([port, vllm_port])


@pytest.mark.slow
def test_a_server_that_dies_while_ready_is_published_as_died_with_its_exit_and_its_logs_cause(workdir, tiny_model):
    key = "daemon/died/run0"
    sess, gen = open_held(workdir, tiny_model, key)
    ready = wait_state(sess, {READY})
    tree = procs.tree(ready.servers[0].pid)
    (workdir / "die").touch()
    died = wait_state(sess, {DIED})
    assert died.exit_code == 3 and died.error is None
    assert died.log_tail.splitlines()[-1] == "RuntimeError: the engine died (told to by the test)"
    assert serverlog.log_cause(died.log_tail) == "RuntimeError: the engine died (told to by the test)"
    assert_gone(tree + [ready.daemon])
    assert sess.state() == died  # died is final: the daemon's own cleanup leaves it said
    assert f"[session {key}] a server exited with code 3" in daemon_log(workdir)
    assert_released([port_of_url(ready.urls[0])])


@pytest.mark.slow
def test_a_session_of_two_instances_moved_to_stopping_stops_both_and_leaves_the_card_free(workdir, tiny_model):
    """Each instance is a server of its own (its port, log and compile cache folder); moving the
    session to stopping, as its last cell, an edited stack or an eviction does first, stops
    them all with no signal needed."""
    sess, gen = open_held(workdir, tiny_model, "daemon/told/run0", stack=held_stack(instances=2, api_key=False))
    ready = wait_state(sess, {READY})
    assert len(ready.servers) == 2 and ready.api_key_required is None
    ports = [port_of(s.pid) for s in ready.servers]
    assert ready.urls == [f"http://127.0.0.1:{p}" for p in ports] and ports[0] != ports[1]
    assert ready.server_logs == [str(workdir / "s.server0.log"), str(workdir / "s.server1.log")]
    assert ready.compile_cache_dir.startswith("shared ")
    instances = workdir / "shared" / ready.compile_cache_dir.removeprefix("shared ")
    assert [environ(s.pid)["VLLM_CACHE_ROOT"] for s in ready.servers] == [
        str(instances / "instance0" / "vllm"),
        str(instances / "instance1" / "vllm"),
    ]
    assert [environ(s.pid)["SERVER_SAYS"] for s in ready.servers] == [f"tiny on {p}" for p in ports]
    tree = [p for s in ready.servers for p in procs.tree(s.pid)]
    assert transition(sess, gen, STOPPING) is not None
    assert_gone(tree + [ready.daemon])
    assert sess.state().state == STOPPED
    assert_released(ports)


@pytest.mark.slow
def test_a_session_waiting_for_the_card_stops_an_idle_session_of_its_workflow_that_holds_it(workdir, tiny_model):
    """LeaseWait: this workflow's idle session gives up the card at once (its state says for
    whom), and both daemons' logs say so."""
    first, second = "daemon/first/run0", "daemon/second/run0"
    sess1, _ = open_held(workdir, tiny_model, first, log="first.log")
    held = wait_state(sess1, {READY})
    tree = procs.tree(held.servers[0].pid)
    sess2, _ = open_held(workdir, tiny_model, second, log="second.log")
    ready = wait_state(sess2, {READY})
    assert_gone(tree + [held.daemon])
    me = str(workdir.resolve())
    evicted = sess1.state()
    assert evicted.state == STOPPED and evicted.evicted_by == f"workflow {me} (session {second})"
    told = f"[session {second}] stopped an idle session for its cards: workflow {me}, session {first} (ready)"
    assert told in daemon_log(workdir, "second.log")
    tree = procs.tree(ready.servers[0].pid)
    session.stop_daemon(sess2)
    assert_gone(tree + [ready.daemon])
    assert_released([port_of_url(held.urls[0]), port_of_url(ready.urls[0])])


@pytest.mark.slow
def test_a_session_whose_workflow_process_is_gone_stops(workdir, tiny_model):
    import subprocess

    workflow = subprocess.Popen(["sleep", "120"], start_new_session=True)
    owner = procs.Proc.of(workflow.pid)
    key = "daemon/owner/run0"
    sess, gen = open_held(workdir, tiny_model, key, owner=owner)
    ready = wait_state(sess, {READY})
    tree = procs.tree(ready.servers[0].pid)
    workflow.kill()
    workflow.wait()
    assert_gone(tree + [ready.daemon])
    assert sess.state().state == STOPPED
    assert f"[session {key}] workflow process {owner.as_record()} is gone" in daemon_log(workdir)
    assert_released([port_of_url(ready.urls[0])])


@pytest.mark.slow
def test_sigterm_while_a_server_starts_stops_it_and_frees_the_card_and_the_shared_cache(workdir, tiny_model):
    key = "daemon/sigterm/run0"
    sess, gen = open_held(workdir, tiny_model, key, go=False)
    starting = wait_until(lambda: (st := sess.state()).servers and st)
    server = starting.servers[0]
    port, vllm_port = port_of(server.pid), int(environ(server.pid)["VLLM_PORT"])
    tree = procs.tree(server.pid)
    assert starting.daemon.signal(signal.SIGTERM)
    assert_gone(tree + [starting.daemon])
    assert sess.state().state == STOPPED
    assert f"[session {key}] stopping (SIGTERM)" in daemon_log(workdir)
    assert_released([port, vllm_port])
    (cache_lock,) = (workdir / "shared").glob("*.lock")
    free = lease.try_lock(cache_lock)
    assert free is not None
    free.close()


@pytest.mark.slow
def test_a_server_whose_first_request_fails_fails_the_start_with_its_answer(workdir, tiny_model):
    """The preflight: a server that says it is ready but answers HTTP 500 fails the session's
    start (its cells are told why), and it is stopped."""
    stack = held_stack(args=["{python}", "-m", "held_reference", *ARGS, "--error-every", "1"], api_key=False)
    sess, gen = open_held(workdir, tiny_model, "daemon/preflight/run0", stack=stack)
    starting = wait_until(lambda: (st := sess.state()).servers and st)
    tree = procs.tree(starting.servers[0].pid)
    failed = wait_state(sess, {STARTUP_FAILED})
    answer = '{"error": {"message": "reference fault: error", "code": 500}}'
    assert failed.error == f"ready, but its first request failed (http_500: {answer})"
    assert failed.log_tail.splitlines()[0].startswith("reference server: Speed(")
    assert_gone(tree + [starting.daemon])
    assert sess.state() == failed  # final: the cleanup leaves it said
    assert_released([launched_port(workdir)])


@pytest.mark.slow
def test_a_start_that_fails_on_a_broken_bytecode_file_clears_the_bytecode_folder(workdir, tiny_model):
    stack = held_stack(env={"PYTHONDONTWRITEBYTECODE": "1", "SERVER_FAULT": "bytecode"})
    sess, gen = open_held(workdir, tiny_model, "daemon/bytecode/run0", stack=stack)
    failed = wait_state(sess, {STARTUP_FAILED})
    said = "ValueError: bad marshal data (unknown type code)"
    assert failed.error == (
        f"server exited with code 1 before it was ready: {said}; "
        f"a broken bytecode file ({said}) under shared/pycache: the folder is cleared, the next start rebuilds it"
    )
    assert failed.log_tail == said
    assert not (workdir / "shared" / "pycache").exists()
    assert_gone(failed.servers + [failed.daemon])
    assert_released([launched_port(workdir)])


def test_a_daemon_whose_start_was_replaced_starts_nothing(workdir, capsys):
    """A daemon told of a generation that is no longer the session's, or whose state names
    another daemon, returns at once: no lease, no server, the state untouched."""
    key = "daemon/superseded/run0"
    sess = Session(key)
    launch = Launch(stack=held_stack(), model_dir=str(workdir / "no-model"), cache_dir=str(workdir / "cache"))
    current = _new_generation(sess)
    other = procs.Proc(os.getpid(), procs.me().start - 1)  # another daemon's (gone since)
    assert transition(sess, current.generation, STARTING, daemon=other) is not None
    for told_generation in ("an-older-start", current.generation):
        told = LaunchFile(
            launch=launch,
            digest=launch.digest(),
            generation=told_generation,
            key=key,
            workdir=sess.workdir,
            owner=procs.me(),
            log_path=str(workdir / "s.log"),
            idle_timeout_s=60.0,
            lease_timeout_s=0.0,
            foreign_idle_s=60.0,
        )
        write_json_atomic(sess.launch_path, told.model_dump(mode="json"), mode=0o600)
        before = sess.state()
        assert daemon.main([str(sess.launch_path)]) == 0
        assert sess.state() == before and before.state == STARTING and before.servers == []
        assert capsys.readouterr().out == f"[session {key}] superseded before it started\n"
    assert not (workdir / "s.server0.log").exists()
    assert_released([])
