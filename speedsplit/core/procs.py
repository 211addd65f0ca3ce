"""Processes seen through /proc: identity (pid + start time, so a recycled pid is never taken
for the process it once was), process groups, descendants and the sockets they listen on.

Every place that signals or watches a process goes through here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 onwards), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Proc:
    """A process by pid and kernel start time (clock ticks since boot): unique on a host."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> "Proc | None":
        fields = _stat_fields(pid)
        return cls(pid, int(fields[19])) if fields else None

    @classmethod
    def from_record(cls, rec: dict | None) -> "Proc | None":
        """From {"pid": .., "start": ..} as written by as_record(); None if incomplete."""
        if not rec or not isinstance(rec.get("pid"), int) or not isinstance(rec.get("start"), int):
            return None
        return cls(rec["pid"], rec["start"])

    def as_record(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    def alive(self) -> bool:
        """True while this very process exists and is not a zombie."""
        fields = _stat_fields(self.pid)
        return bool(fields) and int(fields[19]) == self.start and fields[0] != "Z"

    def signal(self, sig: int) -> bool:
        """Send sig to this process only if it is still the same process; True if sent.

        (Between the check and the kill a pid could only be reused after this process ended
        and was reaped, which its parent does, not us: the window is the kernel's, not ours.)
        """
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
            return True
        return False

    def signal_group(self, sig: int) -> bool:
        """Send sig to the process group this process leads, if it still leads it."""
        if not self.alive() or group_of(self.pid) != self.pid:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)
            return True
        return False


def me() -> Proc:
    proc = Proc.of(os.getpid())
    assert proc is not None
    return proc


def group_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def group_members(pgid: int) -> list[Proc]:
    """Every live (non-zombie) process whose process group is pgid."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(Proc(int(entry.name), int(fields[19])))
    return out


def descendants(pid: int) -> list[Proc]:
    """Every live process below pid (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
                starts[int(entry.name)] = (int(fields[19]), fields[0])
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        start, state = starts[p]
        if state != "Z":
            out.append(Proc(p, start))
        todo += children.get(p, [])
    return out


def tree(pgid: int) -> list[Proc]:
    """A server's processes: its process group and everything started below its members
    (a child that left the group with setsid included)."""
    seen = {p.pid: p for p in group_members(pgid)}
    for p in list(seen.values()):
        for d in descendants(p.pid):
            seen.setdefault(d.pid, d)
    return list(seen.values())


def listening(procs: list[Proc]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the given processes listen on."""
    out = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(p.pid)
            connections = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6
            for c in connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((c.laddr.ip, c.laddr.port))
    return out


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def outermost(pid: int, marker: bytes) -> int | None:
    """The outermost ancestor of pid (itself included) whose command line holds marker."""
    found, p = None, pid
    while p and p > 1:
        try:
            if marker in Path(f"/proc/{p}/cmdline").read_bytes():
                found = p
        except OSError:
            break
        p = parent_of(p) or 0
    return found


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stop(Exception):
    """Raised in the main thread when the process is asked to stop."""


def _raise_stop(signum, frame):
    raise Stop(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_signals():
    """Turn SIGTERM/SIGINT/SIGHUP into an exception so every `finally` runs."""
    old = {s: signal.signal(s, _raise_stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_held():
    """Cleanup that must finish (stop servers, then free their cards) is not interrupted by a
    second stop signal; it is bounded in time by the stops themselves."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def die_with_parent() -> None:
    """In a child before exec (preexec_fn): its own process group, and SIGTERM when the process
    that started it dies, however it dies (Linux PR_SET_PDEATHSIG): a killed job never leaves
    its servers or ranks behind.

    A process group, not a session (setsid): Linux's autogroup scheduler
    (/proc/sys/kernel/sched_autogroup_enabled, on by default) gives each session one share of
    the CPUs, and a session of busy-waiting threads (vLLM's CPU worker and engine core spin
    while they wait) kept the client's session, which sleeps between chunks, off the CPUs for
    0.7-3 s at a time on two cores: it read first tokens seconds late. In the client's session
    the CPUs are shared thread by thread."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def stop_group(leader: Proc, grace_s: float = 20.0) -> None:
    """SIGTERM a server's process group and every process below it, then SIGKILL what is left;
    return once all of them are gone. A process is signalled only while it is the very
    process seen (pid and start time)."""
    current = Proc.of(leader.pid)
    if current is not None and current != leader:
        # The pid is another process's now. Linux reuses a pid only once no process group of
        # that id is left, so the server's group is empty: nothing of ours to stop.
        return
    members = {p.pid: p for p in tree(leader.pid)}
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for p in list(members.values()):
            if p.signal(sig):
                p.signal(signal.SIGCONT)  # a stopped (hung) process acts on SIGTERM only once continued
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader.alive():  # children it starts while shutting down count too
                members.update({p.pid: p for p in tree(leader.pid)})
            if not any(p.alive() for p in members.values()):
                return
            time.sleep(0.2)
