"""GPU cards and loopback ports for one job: Snakemake only counts `gpu=N`, so each job takes
its own cards (lock files, all or nothing) and its own free ports, for its lifetime.

Locks are flock()s: the kernel drops them when the holder dies, so a crashed job never
leaves a card or port taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class LeaseError(RuntimeError):
    """Cards or ports could not be had in time; one-line message."""


def lock_dir() -> Path:
    path = Path(os.environ.get("SPEEDSPLIT_LOCK_DIR", f"/tmp/speedsplit-locks-{os.getuid()}"))
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def _try_lock(path: Path):
    f = open(path, "a+")
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


@dataclass
class Lease:
    """Cards and ports held by this process until release()."""

    devices: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    _files: list = field(default_factory=list, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.devices)

    def port(self) -> int:
        """Take one more free loopback port for this lease."""
        p = free_port(self)
        self.ports.append(p)
        return p

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
            f = _try_lock(locks / f"gpu-{dev}.lock")
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
        f = _try_lock(lock_dir() / f"port-{port}.lock")
        if f is not None:
            lease._files.append(f)
            return port
    raise LeaseError("no free loopback port found")


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
