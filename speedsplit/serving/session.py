"""Server sessions shared by consecutive cell jobs of one workflow.

A session is one running stack (all its instances) for one (model, stack, topology, session
id) of one workflow: its absolute working folder is part of its identity, and its launch digest
(what to launch: the stack definition and the model) covers the model's absolute path and identity. The first cell job of a session spawns a small
daemon (`python -m speedsplit.serving.daemon`, speedsplit/serving/daemon.py) that leases the cards, starts the servers and
publishes its state; later cell jobs find it and measure on it, one cell at a time.

The session's life is a state machine, written in one place (`transition`, beside the
session's files and locks in speedsplit/serving/session_state.py). A cell may attach only
while the session is spawning, starting or ready; `stopping` and `stopped` are final for it.
Anyone who stops a session (its last cell, an edited stack, another workflow's job that needs
the cards, the daemon's own idle timeout) first moves it to `stopping` while holding the cell
lock, so no cell can be mid-measurement on a server that is going away. Processes are identified by pid and start time (`procs.Proc`), never by pid
alone: a state file that outlived its daemon never gets a recycled pid signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from speedsplit.core import apikey, procs
from speedsplit.core.results import write_json_atomic
from speedsplit.core.specs import SessionPlan
from speedsplit.serving import lease as leases
from speedsplit.serving.session_state import (
    ATTACHABLE,
    DIED,
    FINAL,
    POLL_S,
    READY,
    STARTING,
    STARTUP_FAILED,
    STOPPED,
    STOPPING,
    Launch,
    LaunchFile,
    Session,
    SessionState,
    _new_generation,
    daemon_alive,
    host_states,
    transition,
)


class SessionBusy(RuntimeError):
    """The session's server must be replaced, but a cell keeps measuring on it."""


def workflow_owner() -> procs.Proc:
    """The outermost Snakemake process above this one (the daemon lives no longer than it),
    else the parent."""
    pid = procs.outermost(os.getppid(), b"snakemake") or os.getppid()
    return procs.Proc.of(pid) or procs.me()


def open_session(
    key: str,
    launch: Launch,
    log_path: Path,
    owner: procs.Proc,
    idle_timeout_s: float,
    lease_timeout_s: float,
    foreign_idle_s: float = 60.0,
) -> tuple[Session, bool, str]:
    """Find this workflow's running session for key with the same launch (stack
    definition, model and caches), or spawn one.

    Returns the session, whether an existing daemon was reused, and its generation.
    """
    sess = Session(key)
    digest = launch.digest()
    with sess.locked(sess.spawn_lock):
        st = sess.state()
        if st.digest == digest:
            if st.state in ATTACHABLE and daemon_alive(st):
                return sess, True, st.generation
            if st.state == STARTUP_FAILED and st.owner == owner:
                return sess, True, st.generation  # a start that failed in this workflow run is not retried per cell
        if daemon_alive(st) and not retire(sess, wait_s=lease_timeout_s):
            # an edited stack, or a session on its way out, that a cell still measures on
            raise SessionBusy(f"session {key}: another cell held its server for {lease_timeout_s:.0f} s")
        st = _new_generation(sess, digest=digest, owner=owner)
        told = LaunchFile(
            launch=launch,
            digest=digest,
            generation=st.generation,
            key=key,
            workdir=sess.workdir,
            owner=owner,
            log_path=str(log_path),
            idle_timeout_s=idle_timeout_s,
            lease_timeout_s=lease_timeout_s,
            foreign_idle_s=foreign_idle_s,
            # drawn per session, kept only here (mode 0600) and in the servers' environment
            api_key=apikey.new() if launch.stack.api_key_env else None,
        )
        write_json_atomic(sess.launch_path, told.model_dump(mode="json"), mode=0o600)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "speedsplit.serving.daemon", str(sess.launch_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0,  # its own group, in the workflow's session (core/procs.die_with_parent)
                cwd=sess.workdir,
            )
        daemon = procs.Proc.of(proc.pid)
        if transition(sess, st.generation, STARTING, daemon=daemon) is None:
            raise RuntimeError(f"session {key}: state changed while its daemon was spawned")
    return sess, False, st.generation


def wait_ready(sess: Session, generation: str, timeout_s: float, on_wait=None) -> SessionState:
    """This generation's state once ready or final (bounded by timeout_s); a daemon that is gone
    without saying so, or a timeout, reads as startup_failed. on_wait(state) is called at each
    look at a session not ready yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sess.state()
        if on_wait is not None and st.generation == generation and st.state == STARTING:
            on_wait(st)
        if st.generation != generation:
            return SessionState(state=STOPPED, error="the session was replaced by another start")
        if st.state == READY or st.state in FINAL:
            return st
        if st.state == STARTING and not daemon_alive(st):
            st = sess.state()  # it may have written its last state just now
            if st.state == READY or st.state in FINAL:
                return st
            return SessionState(state=STARTUP_FAILED, error="the server daemon ended before its servers were ready")
        if time.monotonic() > deadline:
            return SessionState(state=STARTUP_FAILED, error=f"servers not ready within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def wait_final(sess: Session, generation: str, timeout_s: float) -> SessionState:
    """This generation's state once its daemon has recorded how it ended (died, stopped,...),
    or as it is after timeout_s, or once the daemon is gone without recording it."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = sess.state()
        if st.generation != generation or st.state in FINAL or not daemon_alive(st):
            return st
        if time.monotonic() > deadline:
            return st
        time.sleep(POLL_S)


WAIT_TOLD_EVERY_S = 30.0


def waiting_told(progress):
    """An on_wait for wait_ready that tells progress who holds the cards a start waits for:
    when the holders change, and every WAIT_TOLD_EVERY_S while they do not."""
    if progress is None:
        return None
    told = {"holders": None, "at": 0.0}

    def on_wait(st: SessionState) -> None:
        holders = st.waiting_for
        if not holders or (holders == told["holders"] and time.monotonic() - told["at"] < WAIT_TOLD_EVERY_S):
            return
        told.update(holders=holders, at=time.monotonic())
        waited = time.time() - (st.waiting_since or time.time())
        progress(f"waiting {waited:.0f} s for the cards, held by: {'; '.join(holders)}")

    return on_wait


def api_key_of(sess: Session, generation: str) -> str | None:
    """The API key the session's servers of this generation demand (None: none)."""
    told = sess.launch_file()
    return told.api_key if told is not None and told.generation == generation else None


@contextlib.contextmanager
def attached(sess: Session, generation: str):
    """Hold the session for one cell's measurement: yields its ready state, or None if it was
    stopped (evicted, idle, replaced) between finding it and taking the cell lock."""
    with sess.locked(sess.cell_lock):
        st = sess.state()
        if st.generation != generation or st.state != READY or not daemon_alive(st):
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
    state: SessionState  # the session's ready state: urls, servers, facts, cells_measured
    api_key: str | None = field(default=None, repr=False)  # what its servers demand (core/apikey.py)


class NotReady(Exception):
    """The session's servers could not be held for the job. `status` is what its result
    records (startup_failed or server_died); `state` and `reused` describe the last attempt
    (state is None when no session was had at all)."""

    def __init__(self, status: str, error: str, state: SessionState | None = None, reused: bool = False):
        super().__init__(error)
        self.status, self.error, self.state, self.reused = status, error, state, reused


@contextlib.contextmanager
def hold_ready(plan: SessionPlan, launch: Launch, owner: procs.Proc, ready_timeout_s: float, keep: bool, progress=None):
    """Find or start the servers of a planned session and hold them, ready, for one job (its
    cell lock). While its start waits for cards others hold, progress (if given) is told who
    holds them and for how long it has waited.

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
                    plan.key,
                    launch,
                    Path(plan.log),
                    owner,
                    plan.idle_timeout_s,
                    plan.lease_timeout_s,
                    plan.foreign_idle_s,
                )
            except SessionBusy as busy:
                ended_cleanly = True
                raise NotReady(STARTUP_FAILED, str(busy)) from None
            state = wait_ready(sess, generation, ready_timeout_s, waiting_told(progress))
            if state.state in (STOPPING, STOPPED):
                continue  # stopped before we attached: start again
            if state.state != READY:  # died before this job, or never ready
                ended_cleanly = True
                status = "server_died" if state.state == DIED else STARTUP_FAILED
                raise NotReady(status, state.error or f"server session {state.state}", state, reused)
            with attached(sess, generation) as held:
                if held is None:
                    continue  # evicted between finding it and taking the cell lock
                yield Held(sess, generation, reused, held, api_key_of(sess, generation))
            ended_cleanly = True
            return
        ended_cleanly = True
        raise NotReady(
            STARTUP_FAILED, f"the session was stopped {ATTACH_TRIES} times before this job could attach", state, reused
        )
    finally:
        if sess is not None and not (keep and ended_cleanly):
            stop_daemon(sess, generation)


def _stop_processes(st: SessionState, timeout_s: float) -> None:
    """Stop a session's daemon (it stops its servers), then whatever servers it left."""
    daemon = st.daemon
    if daemon is not None and daemon.signal(signal.SIGTERM):
        deadline = time.monotonic() + timeout_s
        while daemon.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        daemon.signal_group(signal.SIGKILL)
    for server in st.servers:  # left by a daemon that was killed
        procs.stop_group(server)


def stop_daemon(sess: Session, generation: str | None = None, timeout_s: float = 60.0) -> None:
    """Move the session to `stopping` (no cell attaches any more) and wait until its daemon and
    servers are gone. Only this generation's, when one is given."""
    st = sess.state()
    generation = generation or st.generation
    if not generation or st.generation != generation:
        return
    if st.state in ATTACHABLE:
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
        if st.state in ATTACHABLE:
            transition(sess, st.generation, STOPPING)
    stop_daemon(sess, st.generation)
    return True


# How long another workflow's ready server must have gone without a cell before a session
# waiting for its cards may stop it (benchmark.foreign_idle_s).
FOREIGN_IDLE_S = 60.0


def evict_idle(except_key: str | None = None, foreign_idle_s: float = FOREIGN_IDLE_S) -> list[str]:
    """Stop the ready sessions on this host that no cell is using, for a session that waits for
    their cards; returns what was stopped, in words.

    The policy: this workflow's idle sessions stop at once (its lanes are planned: the next cell
    of a stopped one is not waiting for it). Another workflow's stop only once no cell has used
    them for foreign_idle_s: between two of its cells a session is idle for a few seconds, and
    stopping it there made two workflows on one host stop each other's servers cell after cell.
    So workflows take the cards in turns of whole sessions, and one that has stalled gives
    them up. A stopped session's state says for whom (evicted_by)."""
    me = str(Path.cwd().resolve())
    stopped = []
    for st in host_states():
        if not st.key or not st.workflow:
            continue  # written before sessions knew their workflow: nothing of ours to stop
        sess = Session(st.key, st.workflow)
        if except_key == sess.key and sess.workdir == me:
            continue
        if st.state != READY or not daemon_alive(st):
            continue  # a starting session is about to be used by the cell that started it
        if sess.workdir != me and time.time() - (st.last_used or 0.0) < foreign_idle_s:
            continue  # another workflow's, between two of its cells
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                continue
            cur = sess.state()
            by = f"workflow {me}" + (f" (session {except_key})" if except_key else "")
            if transition(sess, cur.generation, STOPPING, evicted_by=by) is None:
                continue
        stop_daemon(sess, cur.generation)
        stopped.append(describe(cur))
    return stopped


def describe(state: SessionState) -> str:
    """A session in words, for the terminal and the result: whose it is and what it does."""
    return f"workflow {state.workflow}, session {state.key} ({state.state or '?'})"


def measuring_elsewhere() -> list[str]:
    """Other workflows' sessions on this host with a cell measuring now (its cell lock held), in
    words: what a run shares the host with."""
    me = str(Path.cwd().resolve())
    out = []
    for st in host_states():
        if st.workflow in (None, me) or st.state != READY or not daemon_alive(st):
            continue
        sess = Session(st.key, st.workflow)
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                out.append(f"workflow {st.workflow}, session {st.key}")
    return out


def lease_holders(devices: list[str]) -> list[str]:
    """Who holds the cards (or CPU slots) a waiting session wants, in words: the session whose
    daemon holds each, or the process (a quantize job, say)."""
    daemons = {st.daemon.pid: st for st in host_states() if daemon_alive(st)}
    out = []
    for pid in leases.holders(devices):
        if pid in daemons:
            out.append(describe(daemons[pid]))
        elif procs.cmdline(pid):  # (none: a process that has ended, not yet reaped)
            out.append(f"process {pid} ({' '.join(procs.cmdline(pid))[:120]})")
    return sorted(set(out))
