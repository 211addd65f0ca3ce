"""Server sessions shared by consecutive cell jobs of one workflow.

A session is one running stack (all its instances) for one (model, stack, topology, session
id) of one workflow: its absolute working folder is part of its identity, and its launch digest
(what to launch: the stack definition and the model) covers the model's absolute path and identity. The first cell job of a session spawns a small
daemon (`python -m speedsplit.serving.session`) that leases the cards, starts the servers and
publishes its state; later cell jobs find it and measure on it, one cell at a time.

The session's life is the state machine below, written in one place (`transition`). A cell
may attach only while the session is spawning, starting or ready; `stopping` and `stopped`
are final for it. Anyone who stops a session (its last cell, an edited stack, another
workflow's job that needs the cards, the daemon's own idle timeout) first moves it to
`stopping` while holding the cell lock, so no cell can be mid-measurement on a server that is
going away. Processes are identified by pid and start time (`procs.Proc`), never by pid
alone: a state file that outlived its daemon never gets a recycled pid signalled.
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
import uuid
from dataclasses import dataclass
from pathlib import Path

from speedsplit.core import procs
from speedsplit.core.procs import Stop, signals_held, stop_on_signals
from speedsplit.core.results import redact, write_json_atomic
from speedsplit.models.checkpoint import ModelError, check_model
from speedsplit.planning.plan import SessionPlan
from speedsplit.probes import loadgen, telemetry
from speedsplit.serving import lease as leases
from speedsplit.serving import stacks

POLL_S = 0.25

SPAWNING, STARTING, READY = "spawning", "starting", "ready"
STOPPING, STOPPED, STARTUP_FAILED, DIED = "stopping", "stopped", "startup_failed", "died"
ATTACHABLE = frozenset({SPAWNING, STARTING, READY})
FINAL = frozenset({STOPPING, STOPPED, STARTUP_FAILED, DIED})
# Within one daemon's life (a generation). A new generation starts at SPAWNING once the last
# daemon is gone, whatever state it left.
TRANSITIONS = {
    SPAWNING: {STARTING, STARTUP_FAILED, STOPPING},
    STARTING: {STARTING, READY, STARTUP_FAILED, STOPPING},
    READY: {READY, STOPPING, DIED},
    STOPPING: {STOPPED},
    STARTUP_FAILED: set(),
    DIED: set(),
    STOPPED: set(),
}


class SessionBusy(RuntimeError):
    """The session's server must be replaced, but a cell keeps measuring on it."""


def sessions_dir() -> Path:
    """Per host (a URL on 127.0.0.1 means nothing on another node), inside the private lock folder."""
    return leases.private_dir(leases.private_dir(leases.lock_dir() / "sessions") / socket.gethostname())


def launch_digest(launch: dict) -> str:
    return hashlib.sha256(json.dumps(launch, sort_keys=True, default=str).encode()).hexdigest()[:16]


def workflow_id(workdir: str | Path) -> str:
    return hashlib.sha256(str(Path(workdir).resolve()).encode()).hexdigest()[:12]


class Session:
    """Paths and state of one session of one workflow, seen from a cell job or the daemon."""

    def __init__(self, key: str, workdir: str | Path | None = None):
        self.key = key
        self.workdir = str(Path(workdir or os.getcwd()).resolve())
        # keys hold dots: no with_suffix
        base = str(sessions_dir() / f"{workflow_id(self.workdir)}__{key.replace('/', '__')}")
        self.state_path = Path(base + ".json")
        self.launch_path = Path(base + ".launch.json")
        self.spawn_lock = Path(base + ".spawn.lock")
        self.cell_lock = Path(base + ".cells.lock")
        self.state_lock = Path(base + ".state.lock")

    def state(self) -> dict:
        """The published state ({} if none)."""
        return _read_private_json(self.state_path)

    @contextlib.contextmanager
    def locked(self, path: Path, blocking: bool = True, timeout_s: float | None = None):
        """Hold an flock on path; yields False (not held) if non-blocking or timed out."""
        with leases.open_private(path) as f:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking and deadline is None else fcntl.LOCK_NB))
                    break
                except BlockingIOError:
                    if deadline is None or time.monotonic() > deadline:
                        yield False
                        return
                    time.sleep(POLL_S)
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def write(self, state: dict) -> None:
        write_json_atomic(self.state_path, state, mode=0o600)


def _read_private_json(path: Path) -> dict:
    """A JSON file of the private folder ({} if absent or unreadable), read through no link."""
    with contextlib.suppress(json.JSONDecodeError, leases.LeaseError, OSError):
        with leases.open_private(path, os.O_RDONLY) as f:
            return json.loads(f.read())
    return {}


def host_states() -> list[dict]:
    """The published state of every session on this host, of every workflow."""
    paths = (p for p in sorted(sessions_dir().glob("*.json")) if not p.name.endswith(".launch.json"))
    return [st for st in map(_read_private_json, paths) if st]


def daemon_of(state: dict) -> procs.Proc | None:
    return procs.Proc.from_record(state.get("daemon"))


def daemon_alive(state: dict) -> bool:
    daemon = daemon_of(state)
    return daemon is not None and daemon.alive()


def transition(sess: Session, generation: str, to: str, **fields) -> dict | None:
    """Move this generation's session to state `to` (with fields) if the state machine allows
    it; returns the new state, or None (nothing written) if it does not or another generation
    owns the session now."""
    with sess.locked(sess.state_lock):
        st = sess.state()
        if st.get("generation") != generation or to not in TRANSITIONS.get(st.get("state"), set()):
            return None
        st.update(fields, state=to)
        sess.write(st)
        return st


def _new_generation(sess: Session, **fields) -> dict:
    with sess.locked(sess.state_lock):
        st = {"state": SPAWNING, "generation": uuid.uuid4().hex, "key": sess.key, "workflow": sess.workdir, **fields}
        sess.write(st)
        return st


def workflow_owner() -> procs.Proc:
    """The outermost Snakemake process above this one (the daemon lives no longer than it),
    else the parent."""
    pid = procs.outermost(os.getppid(), b"snakemake") or os.getppid()
    return procs.Proc.of(pid) or procs.me()


def open_session(
    key: str,
    launch: dict,
    log_path: Path,
    owner: procs.Proc,
    idle_timeout_s: float,
    lease_timeout_s: float,
) -> tuple[Session, bool, str]:
    """Find this workflow's running session for key with the same launch (stack
    definition, model and caches), or spawn one.

    Returns the session, whether an existing daemon was reused, and its generation.
    """
    sess = Session(key)
    digest = launch_digest(launch)
    with sess.locked(sess.spawn_lock):
        st = sess.state()
        if st.get("digest") == digest:
            if st.get("state") in ATTACHABLE and daemon_alive(st):
                return sess, True, st["generation"]
            if st.get("state") == STARTUP_FAILED and st.get("owner") == owner.as_record():
                return sess, True, st["generation"]  # a start that failed in this workflow run is not retried per cell
        if daemon_alive(st) and not retire(sess, wait_s=lease_timeout_s):
            # an edited stack, or a session on its way out, that a cell still measures on
            raise SessionBusy(f"session {key}: another cell held its server for {lease_timeout_s:.0f} s")
        meta = {
            "launch": launch,
            "digest": digest,
            "owner": owner.as_record(),
            "idle_timeout_s": idle_timeout_s,
            "lease_timeout_s": lease_timeout_s,
            "log_path": str(log_path),
            "key": key,
            "workdir": sess.workdir,
        }
        st = _new_generation(sess, digest=digest, owner=owner.as_record())
        write_json_atomic(sess.launch_path, {**meta, "generation": st["generation"]}, mode=0o600)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "speedsplit.serving.session", str(sess.launch_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=sess.workdir,
            )
        daemon = procs.Proc.of(proc.pid)
        if transition(sess, st["generation"], STARTING, daemon=daemon.as_record() if daemon else None) is None:
            raise RuntimeError(f"session {key}: state changed while its daemon was spawned")
    return sess, False, st["generation"]


def wait_ready(sess: Session, generation: str, timeout_s: float) -> dict:
    """This generation's state once ready or final (bounded by timeout_s); a daemon that is gone
    without saying so, or a timeout, reads as startup_failed."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sess.state()
        if st.get("generation") != generation:
            return {"state": STOPPED, "error": "the session was replaced by another start"}
        if st.get("state") == READY or st.get("state") in FINAL:
            return st
        if st.get("state") == STARTING and not daemon_alive(st):
            st = sess.state()  # it may have written its last state just now
            if st.get("state") == READY or st.get("state") in FINAL:
                return st
            return {"state": STARTUP_FAILED, "error": "the server daemon ended before its servers were ready"}
        if time.monotonic() > deadline:
            return {"state": STARTUP_FAILED, "error": f"servers not ready within {timeout_s:.0f} s"}
        time.sleep(POLL_S)


def wait_final(sess: Session, generation: str, timeout_s: float) -> dict:
    """This generation's state once its daemon has recorded how it ended (died, stopped,...),
    or as it is after timeout_s, or once the daemon is gone without recording it."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sess.state()
        if st.get("generation") != generation or st.get("state") in FINAL or not daemon_alive(st):
            return st
        if time.monotonic() > deadline:
            return st
        time.sleep(POLL_S)


@contextlib.contextmanager
def attached(sess: Session, generation: str):
    """Hold the session for one cell's measurement: yields its ready state, or None if it was
    stopped (evicted, idle, replaced) between finding it and taking the cell lock."""
    with sess.locked(sess.cell_lock):
        st = sess.state()
        if st.get("generation") != generation or st.get("state") != READY or not daemon_alive(st):
            yield None
        else:
            yield st


ATTACH_TRIES = 3


@dataclass
class Held:
    """A session's servers held ready for one job (see `hold_ready`)."""

    sess: Session
    generation: str
    reused: bool  # an existing daemon was found, not spawned by this job
    state: dict  # the session's ready state: urls, servers, facts, cells_measured


class NotReady(Exception):
    """The session's servers could not be held for the job. `status` is what its result
    records (startup_failed or server_died); `state` and `reused` describe the last attempt
    (state is None when no session was had at all)."""

    def __init__(self, status: str, error: str, state: dict | None = None, reused: bool = False):
        super().__init__(error)
        self.status, self.error, self.state, self.reused = status, error, state, reused


@contextlib.contextmanager
def hold_ready(plan: SessionPlan, launch: dict, owner: procs.Proc, ready_timeout_s: float, keep: bool):
    """Find or start the servers of a planned session and hold them, ready, for one job (its
    cell lock).

    A session stopped (evicted, idle, replaced) between being found and being held is started
    again, up to ATTACH_TRIES times. Raises NotReady when it is busy, never gets ready, died,
    or kept being stopped. Afterwards the session's servers keep running only if `keep` and
    the job ended without an exception (NotReady included: a failed start is not retried per
    job); any other end, an interruption too, stops them."""
    sess = generation = None
    ended_cleanly = False
    try:
        state, reused = None, False
        for _ in range(ATTACH_TRIES):
            try:
                sess, reused, generation = open_session(
                    plan.key, launch, Path(plan.log), owner, plan.idle_timeout_s, plan.lease_timeout_s
                )
            except SessionBusy as busy:
                ended_cleanly = True
                raise NotReady(STARTUP_FAILED, str(busy)) from None
            state = wait_ready(sess, generation, ready_timeout_s)
            if state["state"] in (STOPPING, STOPPED):
                continue  # stopped before we attached: start again
            if state["state"] != READY:  # died before this job, or never ready
                ended_cleanly = True
                status = "server_died" if state["state"] == DIED else STARTUP_FAILED
                raise NotReady(status, state.get("error") or f"server session {state['state']}", state, reused)
            with attached(sess, generation) as held:
                if held is None:
                    continue  # evicted between finding it and taking the cell lock
                yield Held(sess, generation, reused, held)
            ended_cleanly = True
            return
        ended_cleanly = True
        raise NotReady(
            STARTUP_FAILED, f"the session was stopped {ATTACH_TRIES} times before this job could attach", state, reused
        )
    finally:
        if sess is not None and not (keep and ended_cleanly):
            stop_daemon(sess, generation)


def _stop_processes(st: dict, timeout_s: float) -> None:
    """Stop a session's daemon (it stops its servers), then whatever servers it left."""
    daemon = daemon_of(st)
    if daemon is not None and daemon.signal(signal.SIGTERM):
        deadline = time.monotonic() + timeout_s
        while daemon.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        daemon.signal_group(signal.SIGKILL)
    for rec in st.get("servers") or []:  # left by a daemon that was killed
        server = procs.Proc.from_record(rec)
        if server is not None:
            stacks.stop_group(server)


def stop_daemon(sess: Session, generation: str | None = None, timeout_s: float = 60.0) -> None:
    """Move the session to `stopping` (no cell attaches any more) and wait until its daemon and
    servers are gone. Only this generation's, when one is given."""
    st = sess.state()
    generation = generation or st.get("generation")
    if not generation or st.get("generation") != generation:
        return
    if st.get("state") in ATTACHABLE:
        st = transition(sess, generation, STOPPING) or sess.state()
    _stop_processes(st, timeout_s)
    transition(sess, generation, STOPPED)  # if the daemon could not say so itself


def retire(sess: Session, wait_s: float) -> bool:
    """Stop a session once no cell is measuring on it (waiting up to wait_s); False if a cell
    held it all that time."""
    with sess.locked(sess.cell_lock, timeout_s=wait_s) as idle:
        if not idle:
            return False
        st = sess.state()
        if st.get("state") in ATTACHABLE:
            transition(sess, st["generation"], STOPPING)
    stop_daemon(sess, st.get("generation"))
    return True


def evict_idle(except_key: str | None = None) -> int:
    """Stop every ready session on this host that no cell is using (any workflow's: they want
    the same cards); returns how many."""
    n = 0
    for st in host_states():
        if not st.get("key") or not st.get("workflow"):
            continue  # written before sessions knew their workflow: nothing of ours to stop
        sess = Session(st["key"], st["workflow"])
        if except_key == sess.key and sess.workdir == str(Path.cwd().resolve()):
            continue
        if st.get("state") != READY or not daemon_alive(st):
            continue  # a starting session is about to be used by the cell that started it
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                continue
            cur = sess.state()
            if transition(sess, cur.get("generation"), STOPPING) is None:
                continue
        stop_daemon(sess, cur["generation"])
        n += 1
    return n


# --- the daemon -----------------------------------------------------------------------------


def _daemon(launch_path: Path) -> int:
    meta = _read_private_json(launch_path)
    launch, key, generation = meta["launch"], meta["key"], meta["generation"]
    sess = Session(key, meta["workdir"])
    stack = launch["stack"]
    with sess.locked(sess.spawn_lock):  # the spawning job has finished writing its own state
        st = sess.state()
    if st.get("generation") != generation or daemon_of(st) != procs.me():
        print(f"[session {key}] superseded before it started", flush=True)
        return 0
    servers: list[stacks.Server] = []
    held = None
    with stop_on_signals():
        try:
            check_model(launch["model_dir"], stack["variant"])
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
            pinned: list[int] = []
            for i in range(stack["instances"]):
                devs = held.devices[i * stack["tensor_parallel"] : (i + 1) * stack["tensor_parallel"]]
                devs = devs if platform_devices is None else []
                cpus = leases.cpu_share(devs) if stack.get("cpu_isolation") else []
                pinned += cpus
                env_stack = dict(stack, env={**stack["env"], "VLLM_PORT": str(held.port())})
                total = card_total_gib(devs) if stack.get("card_memory_gib") and devs else None
                servers.append(
                    stacks.launch(
                        env_stack,
                        Path(launch["model_dir"]),
                        stack["model"],
                        held.port(),
                        devs,
                        Path(str(log_path).removesuffix(".log") + f".server{i}.log"),
                        Path(launch["cache_dir"]) / f"instance{i}",
                        keep_fds=held.fds(),
                        cpus=cpus,
                        card_total_gib=total,
                        host_cache=stacks.host_cache_gib(stack, launch["model_dir"], launch.get("kv_tokens", 0)),
                    )
                )
                if transition(sess, generation, STARTING, servers=[s.proc_id.as_record() for s in servers]) is None:
                    raise Stop("the session was stopped while it started")
            for srv in servers:
                stacks.wait_ready(srv, stack["ready_path"], stack["startup_timeout_s"])
            for srv in servers:  # a server that cannot serve fails its start, not every cell's timeout
                preflight(srv, stack)
            st = transition(
                sess,
                generation,
                READY,
                urls=[s.url for s in servers],
                model_id=servers[0].model_id,
                startup_s=time.monotonic() - t_start,
                lease_wait_s=t_start - t_lease,
                devices=held.devices,
                cpus=leases.cpu_ranges(pinned) or None,
                facts=stacks.engine_facts("\n".join(s.launch_output() for s in servers)),
                argv=redact(" ".join(servers[0].argv), sess.workdir),
                server_logs=[str(s.log_path) for s in servers],
                log_offsets=[s.log_offset for s in servers],
                memory_cap=servers[0].memory_cap,
                host_memory=servers[0].host_memory,
                wide_listeners=sorted({w for s in servers for w in s.wide_listeners}),
                cells_measured=0,
            )
            if st is None:
                raise Stop("the session was stopped while it started")
            print(f"[session {key}] ready in {st['startup_s']:.1f} s at {st['urls']}", flush=True)
            _hold(sess, generation, servers, meta)
            dead = next((s for s in servers if not s.alive()), None)
            if dead is not None:
                transition(
                    sess,
                    generation,
                    DIED,
                    exit_code=dead.proc.returncode,
                    log_tail=redact(dead.launch_output_tail(), sess.workdir),
                )
                print(f"[session {key}] a server {stacks.exit_cause(dead.proc.returncode)}", flush=True)
        except Stop as why:
            print(f"[session {key}] stopping ({why})", flush=True)
        except Exception as exc:  # whatever kept the servers from starting is the cells' answer
            expected = isinstance(exc, (stacks.StartupFailed, leases.LeaseError, ModelError, ValueError, OSError))
            transition(
                sess,
                generation,
                STARTUP_FAILED,
                error=redact(str(exc) if expected else f"{type(exc).__name__}: {exc}", sess.workdir),
                log_tail=redact(getattr(exc, "log_tail", ""), sess.workdir),
            )
            print(f"[session {key}] startup failed: {exc}", flush=True)
        finally:
            with signals_held():
                transition(sess, generation, STOPPING)
                for srv in servers:
                    stacks.stop(srv)
                if held is not None:  # the cards are free only once their servers are gone
                    held.release()
                transition(sess, generation, STOPPED)
    return 0


PREFLIGHT_TOKENS = 2


def preflight(server: stacks.Server, stack: dict) -> float:
    """One short request through the load generator on a server that says it is ready;
    returns its seconds, or raises StartupFailed with the answer and the failure the server's
    log names (e.g. an INT4 kernel this CPU's build lacks answers HTTP 500)."""
    spec = loadgen.LoadSpec(
        urls=[server.url],
        model=server.model_id,
        prompts=["Say hello."],
        users=1,
        prompt_tokens=0,
        output_tokens=PREFLIGHT_TOKENS,
        requests_per_user=1,
        warmup_requests=0,
        dialect=stack["dialect"],
        request_timeout_s=stack["startup_timeout_s"],
        stall_timeout_s=min(120.0, stack["startup_timeout_s"]),
    )
    t0 = time.monotonic()
    _, records = loadgen.run(spec)
    failed = next((r for r in records if not r.ok), None)
    if failed is not None:
        time.sleep(1.0)  # the server's own account of the failure reaches its log
        cause = stacks.log_cause(server.launch_output())
        answer = f"{failed.error}{': ' + failed.detail if failed.detail else ''}"
        alive = "" if server.alive() else f"; the server then {stacks.exit_cause(server.proc.returncode)}"
        raise stacks.StartupFailed(
            f"ready, but its first request failed ({answer}){alive}" + (f"; its log: {cause}" if cause else ""),
            server.launch_output_tail(),
        )
    print(f"[session] {server.url} served a first request in {time.monotonic() - t0:.1f} s", flush=True)
    return time.monotonic() - t0


def card_total_gib(devices: list[str]) -> float:
    """The memory a cap is taken from; a card NVML cannot read fails the start, naming why."""
    try:
        return telemetry.card_memory_gib(devices)
    except Exception as exc:
        raise ValueError(f"card_memory_gib: cannot read the memory of cards {devices} ({exc})") from None


def _hold(sess: Session, generation: str, servers: list[stacks.Server], meta: dict) -> None:
    """Return when a server dies, the owner is gone, the session sat idle too long or someone
    moved it to stopping."""
    owner = procs.Proc.from_record(meta["owner"])
    idle_since = time.monotonic()
    while all(s.alive() for s in servers):
        st = sess.state()
        if st.get("generation") != generation or st.get("state") != READY:
            return
        if owner is None or not owner.alive():
            print(f"[session {meta['key']}] workflow process {meta['owner']} is gone", flush=True)
            transition(sess, generation, STOPPING)
            return
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > meta["idle_timeout_s"]:
                print(f"[session {meta['key']}] idle for {meta['idle_timeout_s']:.0f} s", flush=True)
                transition(sess, generation, STOPPING)  # under the cell lock: no cell is attaching
                return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one server session (spawned by a cell job).")
    p.add_argument("launch", type=Path, help="the session's .launch.json")
    return _daemon(p.parse_args(argv).launch)


if __name__ == "__main__":
    sys.exit(main())
