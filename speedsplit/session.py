"""Server sessions shared by consecutive cell jobs.

A session is one running stack (all its instances) for one (model, stack, topology,
session id). The first cell job of a session spawns a small daemon (`python -m
speedsplit.session`) that leases the cards, starts the servers and publishes its state in a
JSON file; later cell jobs of the same session find it and reuse the servers. The daemon
stops its servers when told to (the session's last cell, an interrupted job), when the
workflow that owns it is gone, when it has been idle for `idle_timeout_s`, or when another
session needs its cards while it is idle (eviction).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from speedsplit import lease as leases
from speedsplit import stacks
from speedsplit.models import ModelError, check_model
from speedsplit.results import redact, write_json_atomic

POLL_S = 0.25


class Stop(Exception):
    """Raised in the main thread when the process is asked to stop."""


def _raise_stop(signum, frame):
    raise Stop(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals():
    """Turn SIGTERM/SIGINT/SIGHUP into an exception so every `finally` runs."""
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    old = {s: signal.signal(s, _raise_stop) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def sessions_dir() -> Path:
    """Per host: a URL on 127.0.0.1 means nothing on another node."""
    path = leases.lock_dir() / "sessions" / socket.gethostname()
    path.mkdir(parents=True, exist_ok=True)
    return path


def spec_digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Session:
    """Paths and state of one session, seen from a cell job."""

    def __init__(self, key: str):
        self.key = key
        base = str(sessions_dir() / key.replace("/", "__"))  # keys hold dots: no with_suffix
        self.state_path = Path(base + ".json")
        self.spec_path = Path(base + ".spec.json")
        self.spawn_lock = Path(base + ".spawn.lock")
        self.cell_lock = Path(base + ".cells.lock")

    def state(self) -> dict:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return json.loads(self.state_path.read_text())
        return {}

    @contextlib.contextmanager
    def locked(self, path: Path, blocking: bool = True):
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def workflow_owner() -> int:
    """The outermost Snakemake process above this one (the daemon lives no longer than it),
    else the parent."""
    owner, pid = os.getppid(), os.getppid()
    while pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if b"snakemake" in cmd:
            owner = pid
        pid = ppid
    return owner


def open_session(
    key: str, spec: dict, log_path: Path, owner: int, idle_timeout_s: float, lease_timeout_s: float
) -> tuple[Session, bool]:
    """Find the running session for key with the same spec, or spawn one.

    Returns the session and whether an existing daemon was reused.
    """
    sess = Session(key)
    digest = spec_digest(spec)
    with sess.locked(sess.spawn_lock):
        st = sess.state()
        alive = pid_alive(st.get("pid"))
        failed_here = st.get("state") == "startup_failed" and st.get("owner") == owner
        if st.get("digest") == digest and (alive or failed_here):
            return sess, True  # a start that failed in this workflow run is not retried per cell
        if alive:  # same key, other spec: an edited stack; replace it
            stop_daemon(sess)
        spec_path = sess.spec_path
        write_json_atomic(
            spec_path,
            {
                "spec": spec,
                "digest": digest,
                "owner": owner,
                "idle_timeout_s": idle_timeout_s,
                "lease_timeout_s": lease_timeout_s,
                "log_path": str(log_path),
                "key": key,
            },
        )
        write_json_atomic(sess.state_path, {"state": "spawning", "digest": digest, "pid": None})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "speedsplit.session", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=os.getcwd(),
            )
        write_json_atomic(sess.state_path, {"state": "starting", "digest": digest, "pid": proc.pid})
    return sess, False


def wait_ready(sess: Session, timeout_s: float) -> dict:
    """The session's state once ready, failed or dead (bounded by timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sess.state()
        if st.get("state") in ("ready", "startup_failed", "died"):
            return st
        if st.get("pid") and not pid_alive(st["pid"]):
            st = sess.state()  # it may have written its last state just now
            if st.get("state") in ("ready", "startup_failed", "died"):
                return st
            return {"state": "startup_failed", "error": "the server daemon ended before its servers were ready"}
        if time.monotonic() > deadline:
            return {"state": "startup_failed", "error": f"servers not ready within {timeout_s:.0f} s"}
        time.sleep(POLL_S)


def stop_daemon(sess: Session, timeout_s: float = 60.0) -> None:
    """Ask the daemon to stop its servers and wait until it has."""
    pid = sess.state().get("pid")
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def evict_idle(except_key: str | None = None) -> int:
    """Stop every live session daemon that no cell is using; returns how many."""
    n = 0
    for path in sessions_dir().glob("*.json"):
        if path.name.endswith(".spec.json"):
            continue
        key = path.name.removesuffix(".json").replace("__", "/")
        if key == except_key:
            continue
        sess = Session(key)
        if not pid_alive(sess.state().get("pid")):
            continue
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if idle:
                stop_daemon(sess)
                n += 1
    return n


# --- the daemon -----------------------------------------------------------------------------


def _daemon(spec_path: Path) -> int:
    meta = json.loads(spec_path.read_text())
    spec, key = meta["spec"], meta["key"]
    sess = Session(key)
    stack = spec["stack"]
    state = {"state": "starting", "pid": os.getpid(), "digest": meta["digest"], "key": key, "owner": meta["owner"]}
    with sess.locked(sess.spawn_lock):  # the spawning job has finished writing its own state
        write_json_atomic(sess.state_path, state)
    servers: list[stacks.Server] = []
    held = None
    with stop_on_signals():
        try:
            check_model(spec["model_dir"], stack["variant"])
            platform_devices = None if stack["platform"] == "cuda" else ["cpu"]
            need = stack["tensor_parallel"] * stack["instances"] if platform_devices is None else 1
            t_lease = time.monotonic()
            held = leases.acquire_gpus(
                need,
                timeout_s=meta["lease_timeout_s"],
                devices=platform_devices,
                on_wait=lambda: evict_idle(except_key=key),
            )
            t_start = time.monotonic()
            log_path = Path(meta["log_path"])
            for i in range(stack["instances"]):
                devs = held.devices[i * stack["tensor_parallel"] : (i + 1) * stack["tensor_parallel"]]
                devs = devs if platform_devices is None else []
                env_stack = dict(stack, env={**stack["env"], "VLLM_PORT": str(held.port())})
                servers.append(
                    stacks.launch(
                        env_stack,
                        Path(spec["model_dir"]),
                        stack["model"],
                        held.port(),
                        devs,
                        Path(str(log_path).removesuffix(".log") + f".server{i}.log"),
                        Path(spec["cache_dir"]) / f"instance{i}",
                    )
                )
            for srv in servers:
                stacks.wait_ready(srv, stack["ready_path"], stack["startup_timeout_s"])
            text = "\n".join(s.log_path.read_text(errors="replace") for s in servers)
            state.update(
                state="ready",
                urls=[s.url for s in servers],
                model_id=servers[0].model_id,
                server_pids=[s.proc.pid for s in servers],
                startup_s=time.monotonic() - t_start,
                lease_wait_s=t_start - t_lease,
                devices=held.devices,
                facts=stacks.engine_facts(text),
                argv=redact(" ".join(servers[0].argv), Path.cwd()),
                server_logs=[str(s.log_path) for s in servers],
                last_used=time.time(),
            )
            write_json_atomic(sess.state_path, state)
            print(f"[session {key}] ready in {state['startup_s']:.1f} s at {state['urls']}", flush=True)
            _hold(sess, servers, meta)
            state = sess.state() or state
            if not all(s.alive() for s in servers):
                dead = next(s for s in servers if not s.alive())
                state.update(
                    state="died",
                    exit_code=dead.proc.returncode,
                    log_tail=redact(stacks.log_tail(dead.log_path), Path.cwd()),
                )
                write_json_atomic(sess.state_path, state)
                print(f"[session {key}] a server died (exit {dead.proc.returncode})", flush=True)
        except (stacks.StartupFailed, leases.LeaseError, ModelError, ValueError, OSError) as exc:
            state.update(
                state="startup_failed",
                error=redact(str(exc), Path.cwd()),
                log_tail=redact(getattr(exc, "log_tail", ""), Path.cwd()),
            )
            write_json_atomic(sess.state_path, state)
            print(f"[session {key}] startup failed: {exc}", flush=True)
        except Stop as why:
            print(f"[session {key}] stopping ({why})", flush=True)
        finally:
            for srv in servers:
                stacks.stop(srv)
            if held is not None:
                held.release()
            st = sess.state()
            if st.get("state") in ("ready", "starting"):
                st["state"] = "stopped"
                write_json_atomic(sess.state_path, st)
    return 0


def _hold(sess: Session, servers: list[stacks.Server], meta: dict) -> None:
    """Return when a server dies, the owner is gone or the session sat idle too long."""
    idle_since = time.monotonic()
    while all(s.alive() for s in servers):
        if not pid_alive(meta["owner"]):
            print(f"[session {meta['key']}] workflow process {meta['owner']} is gone", flush=True)
            return
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                idle_since = time.monotonic()
        if time.monotonic() - idle_since > meta["idle_timeout_s"]:
            print(f"[session {meta['key']}] idle for {meta['idle_timeout_s']:.0f} s", flush=True)
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one server session (spawned by a cell job).")
    p.add_argument("spec", type=Path)
    return _daemon(p.parse_args(argv).spec)


if __name__ == "__main__":
    sys.exit(main())
