"""A server session's published state: its files and locks on this host (Session), what a
bench job hands its daemon (LaunchFile: the Launch, its owner and timeouts) and the state the
daemon publishes (SessionState), both typed, and the state machine every change of that state
goes through (transition).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from speedsplit.core import procs
from speedsplit.core.results import write_json_atomic
from speedsplit.core.specs import SessionPlan, StackSpec
from speedsplit.serving import lease as leases

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


class Launch(BaseModel):
    """What a session launches: the stack, the model and where its caches live. Its digest is
    the session's identity within its workflow: an edited stack starts another server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: StackSpec
    model_dir: str
    model: dict | None = None  # the model's identity (models/checkpoint.model_identity)
    cache_dir: str  # this session's compile cache
    shared_cache_dir: str | None = None  # the caches every session shares (bytecode, model inspection; else cache_dir)
    kv_tokens: int = 0  # what a CPU server sizes its caches for (serving/memcap.host_cache_gib)
    cpu_slots: int = 1  # how many CPU servers may run at once (benchmark.cpu_lanes)

    @classmethod
    def of(cls, stack: StackSpec, model_dir: str | Path, plan: SessionPlan, serves_cells: bool = True) -> Launch:
        """A stack on a model folder (its identity read from it) with its session plan's compile
        caches: its own, and the one every session shares (compiled graphs, bytecode, vLLM's model
        inspection). serves_cells: the KV tokens and CPU slots the plan gives (a coordination
        profile's own server serves no cell)."""
        from speedsplit.models.checkpoint import model_identity

        sized = dict(kv_tokens=plan.kv_tokens, cpu_slots=plan.cpu_slots) if serves_cells else {}
        return cls(
            stack=stack,
            model_dir=str(Path(model_dir).resolve()),
            model=model_identity(model_dir),
            cache_dir=str(Path(plan.cache_dir).resolve()),
            shared_cache_dir=str(Path(plan.shared_cache_dir).resolve()),
            **sized,
        )

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class LaunchFile(BaseModel):
    """The session's .launch.json (mode 0600): what its daemon is told, by the job that spawned it."""

    model_config = ConfigDict(extra="forbid")

    launch: Launch
    digest: str
    generation: str
    key: str
    workdir: str
    owner: procs.Proc  # the workflow's process: the daemon lives no longer than it
    log_path: str
    idle_timeout_s: float
    lease_timeout_s: float
    foreign_idle_s: float
    # drawn per session, kept only here and in the servers' environment (core/apikey.py)
    api_key: str | None = Field(default=None, repr=False)


class SessionState(BaseModel):
    """A session's published state (its .json): where the state machine has it, who runs it, and
    once ready what its servers are (the cells' results copy those facts: core/facts.ServerFacts).
    An empty state (no generation) is a session nobody has started."""

    model_config = ConfigDict(extra="forbid")

    state: str | None = None
    generation: str | None = None
    key: str | None = None
    workflow: str | None = None  # the workflow's folder
    digest: str | None = None  # its Launch's
    owner: procs.Proc | None = None
    daemon: procs.Proc | None = None
    servers: list[procs.Proc] = []  # (a daemon that was killed leaves them to whoever stops it)
    # while its start waits for cards others hold
    waiting_for: list[str] | None = None
    waiting_since: float | None = None
    lease_holders: list[str] | None = None
    # once ready (daemon._ready_facts)
    startup_s: float | None = None
    lease_wait_s: float | None = None
    urls: list[str] = []
    model_id: str | None = None
    devices: list[str] | None = None
    cpus: str | None = None  # the servers' cores
    client_cpus: str | None = None  # the cells' client's, where the split left it its own
    facts: dict | None = None  # what the engine logged about itself (serving/serverlog.engine_facts)
    argv: str | None = None
    server_logs: list[str] = []
    log_offsets: list[int] = []
    memory_cap: dict | None = None
    host_memory: str | None = None
    compile_cache_dir: str | None = None
    wide_listeners: list[str] | None = None
    api_key_required: bool | None = None
    cells_measured: int = 0
    last_used: float | None = None
    # how it ended
    error: str | None = None
    log_tail: str | None = None
    exit_code: int | None = None
    evicted_by: str | None = None


def sessions_dir() -> Path:
    """Per host (a URL on 127.0.0.1 means nothing on another node), inside the private lock folder."""
    return leases.private_dir(leases.private_dir(leases.lock_dir() / "sessions") / socket.gethostname())


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

    def state(self) -> SessionState:
        """The published state (an empty one if none, or unreadable)."""
        return _read_state(self.state_path)

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

    def write(self, state: SessionState) -> None:
        write_json_atomic(self.state_path, state.model_dump(mode="json", exclude_defaults=True), mode=0o600)

    def launch_file(self) -> LaunchFile | None:
        """What its daemon was told (None: no launch written, or unreadable)."""
        data = _read_private_json(self.launch_path)
        try:
            return LaunchFile.model_validate(data) if data else None
        except ValueError:
            return None


def _read_private_json(path: Path) -> dict:
    """A JSON file of the private folder ({} if absent or unreadable), read through no link."""
    with contextlib.suppress(json.JSONDecodeError, leases.LeaseError, OSError):
        with leases.open_private(path, os.O_RDONLY) as f:
            return json.loads(f.read())
    return {}


def _read_state(path: Path) -> SessionState:
    """A session's state file as its type (an empty state where there is none, or one of
    another version: nobody's session, which a start replaces)."""
    try:
        return SessionState.model_validate(_read_private_json(path))
    except ValueError:
        return SessionState()


def host_states() -> list[SessionState]:
    """The published state of every session on this host, of every workflow."""
    paths = (p for p in sorted(sessions_dir().glob("*.json")) if not p.name.endswith(".launch.json"))
    return [st for st in map(_read_state, paths) if st.generation]


def daemon_alive(state: SessionState) -> bool:
    return state.daemon is not None and state.daemon.alive()


def transition(sess: Session, generation: str | None, to: str, **fields) -> SessionState | None:
    """Move this generation's session to state `to` (with fields of SessionState) if the state
    machine allows it; returns the new state, or None (nothing written) if it does not or
    another generation owns the session now."""
    with sess.locked(sess.state_lock):
        st = sess.state()
        if st.generation != generation or to not in TRANSITIONS.get(st.state, set()):
            return None
        st = SessionState.model_validate({**st.model_dump(), **fields, "state": to})
        sess.write(st)
        return st


def _new_generation(sess: Session, **fields) -> SessionState:
    with sess.locked(sess.state_lock):
        st = SessionState(state=SPAWNING, generation=uuid.uuid4().hex, key=sess.key, workflow=sess.workdir, **fields)
        sess.write(st)
        return st
