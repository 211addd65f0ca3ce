"""A server session's published state: its files and locks on this host (Session), and the
state machine every change of its state goes through (transition).
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

from speedsplit.core import procs
from speedsplit.core.results import write_json_atomic
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
