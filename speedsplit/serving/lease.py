"""GPU cards and loopback ports for one job: Snakemake only counts `gpu=N`, so each job takes
its own cards (lock files, all or nothing) and its own free ports, for its lifetime.

Locks are flock()s: the kernel drops them when the holder dies, so a crashed job never
leaves a card or port taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from speedsplit.core import procs


class LeaseError(RuntimeError):
    """Cards or ports could not be had in time; one-line message."""


def private_dir(path: Path) -> Path:
    """Create path mode 0700, or accept it only if it is a real folder of ours that nobody else
    can write or read; anything else is refused with a one-line LeaseError.

    Lock and session files live there: another local user who could create or change them
    could redirect our writes, forge a session state or swap what a daemon executes.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # a parent is missing
        path.parent.mkdir(parents=True, exist_ok=True)
        return private_dir(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LeaseError(f"lock folder {path} is not a plain folder (a link?): refusing it; set SPEEDSPLIT_LOCK_DIR")
    if st.st_uid != os.getuid():
        raise LeaseError(
            f"lock folder {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): refusing it; "
            "set SPEEDSPLIT_LOCK_DIR to a folder of your own"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but made by an older version or a umask: close it
    return path


def lock_dir() -> Path:
    return private_dir(Path(os.environ.get("SPEEDSPLIT_LOCK_DIR", f"/tmp/speedsplit-locks-{os.getuid()}")))


def open_private(path: Path, flags: int = os.O_RDWR | os.O_CREAT):
    """Open a file in a private folder for reading and writing, never through a link."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LeaseError(f"{path} is a link: refusing to open it") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)  # planted by someone else: its content (a forged state, a lock) is not ours to trust
        raise LeaseError(
            f"{path} is not a plain file of yours (uid {st.st_uid}): refusing it; remove it or set SPEEDSPLIT_LOCK_DIR"
        )
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "r+")


def visible_devices() -> list[str]:
    """Device ids this process may use: CUDA_VISIBLE_DEVICES entries as set (e.g. by Slurm),
    else every GPU nvidia-smi lists, else none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            return []
    return []


def cpu_share(devices: list[str], visible: list[str] | None = None, cores: list[int] | None = None) -> list[int]:
    """The host cores that go with `devices`: the cores this process may use (its affinity,
    as Slurm or a cgroup set it) split into equal contiguous blocks over the visible cards in
    order, one block per card held. Servers on different cards then never compete for a
    core (a vLLM start-up compiles on every core it may use; stock generate() slows when its
    Python loop is starved). Empty, meaning unpinned, when there is nothing to split."""
    visible = visible_devices() if visible is None else visible
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if not devices or not visible or len(cores) < len(visible) or any(d not in visible for d in devices):
        return []
    per = len(cores) // len(visible)
    return sorted(c for d in devices for c in cores[visible.index(d) * per : (visible.index(d) + 1) * per])


def cpu_split(cores: list[int] | None = None) -> tuple[list[int], list[int]]:
    """On a host without cards: (the server's cores, the client's), the client on the first core
    this process may use and the server on the rest; ([], []), unpinned, below two cores. Two
    cores shared by a vLLM CPU server's threads and the load generator measured 8-user cells
    27.6% apart (max/min of six; cv 8.0%); the server on one, the client on the other, 2.6% (cv
    0.9%) at the same throughput (docs/how-it-works.md, "On a CPU")."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if len(cores) < 2 or os.environ.get(NO_CPU_SPLIT_ENV):
        return [], []
    return cores[1:], cores[:1]


# Set where several workflows' servers share a host's few cores at once (the test suite's
# parallel tier: three workers, each with its own lock folder): pinning every one of them to the
# same core would starve them. A workflow on a host of its own never sets it.
NO_CPU_SPLIT_ENV = "SPEEDSPLIT_NO_CPU_SPLIT"


def cpu_ranges(cores: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> '0-3,8-9' (as taskset and cgroups write them)."""
    out: list[str] = []
    for c in sorted(cores):
        if out and int(out[-1].split("-")[-1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def parse_cpu_ranges(text: str) -> list[int]:
    """'0-3,8-9' -> [0, 1, 2, 3, 8, 9]."""
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def try_lock(path: Path):
    """An exclusive flock on path without waiting (its open file), or None when another holds it."""
    f = open_private(path)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def holders(devices: list[str]) -> list[int]:
    """The live processes that last took these cards' locks (the pid try_lock wrote): asked
    when a lease could not be had, so they hold them, or did a moment ago. Read without a lock
    of its own, which would make a taker's try fail."""
    pids = []
    for dev in devices:
        try:
            with open_private(lock_dir() / f"gpu-{dev}.lock", os.O_RDONLY) as f:
                text = f.read().strip()
        except (OSError, LeaseError):
            continue
        if text.isdigit() and procs.Proc.of(int(text)) is not None:
            pids.append(int(text))
    return pids


@dataclass
class Lease:
    """Cards and ports held by this process until release()."""

    devices: list[str] = field(default_factory=list)
    _files: list = field(default_factory=list, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.devices)

    def port(self) -> int:
        """Take one more free loopback port for this lease."""
        return free_port(self)

    def fds(self) -> list[int]:
        """The lock files' descriptors: a server that inherits them keeps its cards and ports
        locked until it exits, even if the process that leased them is killed first."""
        return [f.fileno() for f in self._files]

    def release(self) -> None:
        for f in self._files:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()
        self._files.clear()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire_gpus(
    n: int, timeout_s: float = 3600.0, poll_s: float = 0.5, devices: list[str] | None = None, on_wait=None
) -> Lease:
    """Take n distinct cards of `devices` (default: the visible ones), all or nothing,
    waiting up to timeout_s; on_wait() is called between tries (e.g. to evict idle holders)."""
    lease = Lease()
    if n <= 0:
        return lease
    devices = visible_devices() if devices is None else devices
    if len(devices) < n:
        raise LeaseError(f"job needs {n} GPUs but only {len(devices)} are visible ({','.join(devices) or 'none'})")
    deadline = time.monotonic() + timeout_s
    locks = lock_dir()
    while True:
        taken = []
        for dev in devices:
            f = try_lock(locks / f"gpu-{dev}.lock")
            if f is not None:
                taken.append((dev, f))
                if len(taken) == n:
                    lease.devices = [d for d, _ in taken]
                    lease._files = [f for _, f in taken]
                    return lease
        for _, f in taken:  # all or nothing: never sit on part of a set
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
        if on_wait is not None and on_wait():
            continue
        if time.monotonic() >= deadline:
            raise LeaseError(
                f"could not lease {n} of GPUs {','.join(devices)} within {timeout_s:.0f} s (others hold them)"
            )
        time.sleep(poll_s * (1 + random.random()))


@contextlib.contextmanager
def cuda_devices(n: int, platform: str, timeout_s: float = 3600.0):
    """For a job that computes on GPUs itself (quantization, weight synthesis, bandwidth):
    lease n cards on the cuda platform and point CUDA_VISIBLE_DEVICES at them."""
    with acquire_gpus(n if platform == "cuda" else 0, timeout_s=timeout_s) as held:
        old = os.environ.get("CUDA_VISIBLE_DEVICES")
        if held.devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = held.cuda_visible_devices
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the lease's indices are NVML's (PCI bus order)
        try:
            yield held
        finally:
            if old is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = old


def free_port(lease: Lease) -> int:
    """A loopback port nobody listens on, held by a lock file so no other job picks it."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        f = try_lock(lock_dir() / f"port-{port}.lock")
        if f is not None:
            lease._files.append(f)
            return port
    raise LeaseError("no free loopback port found")
