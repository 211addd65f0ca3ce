"""Interconnect control, no server: an all-reduce microbenchmark between each pair of the
job's cards through torch.distributed, as tensor-parallel decode all-reduces its
activations every layer.

Payloads run from one decode step's activation (users x hidden x 2 bytes, for each cell's
users) up to 256 MiB. Each pair is measured with peer-to-peer on (NCCL's default) and with
`NCCL_P2P_DISABLE=1` (through host memory), so the realised bandwidth of the two paths can be
compared at decode-sized payloads. NVLink multicast is never used (`NCCL_NVLS_ENABLE=0`).
On the cpu platform the same benchmark runs over gloo between two host processes (no cards,
no peer-to-peer modes): a CPU number, labelled as one.

Ranks rendezvous through a file (no TCP store listening anywhere), and NCCL/gloo bootstrap
on the loopback interface.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speedsplit.core.procs import die_with_parent, stop_on_signals
from speedsplit.core.results import hardware
from speedsplit.serving.lease import cuda_devices

MIB = 2**20
# The environment every rank starts with (NVLink multicast off; bootstrap on loopback).
BASE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_SOCKET_IFNAME": "lo",
    "GLOO_SOCKET_IFNAME": "lo",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # cards numbered as the lease and NVML number them
}
MODES = {"p2p": {}, "no_p2p": {"NCCL_P2P_DISABLE": "1"}}


def payload_sizes(decode_bytes: list[int], max_bytes: int = 256 * MIB) -> list[int]:
    """Each decode-step payload, then doubling from the smallest up to max_bytes."""
    smallest = max(4, min(decode_bytes, default=4096))
    sizes = set(b for b in decode_bytes if b <= max_bytes)
    size = smallest
    while size <= max_bytes:
        sizes.add(size)
        size *= 2
    sizes.add(max_bytes)
    return sorted(s - s % 2 for s in sizes)  # whole fp16 elements


def _iterations(nbytes: int) -> int:
    return 200 if nbytes <= MIB else (50 if nbytes <= 32 * MIB else 10)


def _rank(rank: int, world: int, init_file: str, backend: str, sizes: list[int], out: str) -> None:
    """One rank of the benchmark (its own process); rank 0 writes the timings to out."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = []
    try:
        for nbytes in sizes:
            # fp16 as tensor-parallel decode sends it; gloo on a CPU sums fp32 (same bytes)
            dtype, width = (torch.float16, 2) if backend == "nccl" else (torch.float32, 4)
            x = torch.ones(max(1, nbytes // width), dtype=dtype, device=device)
            iters = _iterations(nbytes)
            for _ in range(5):
                dist.all_reduce(x)
            if backend == "nccl":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            if backend == "nccl":
                torch.cuda.synchronize()
            seconds = (time.perf_counter() - t0) / iters
            rows.append({"bytes": nbytes, "iterations": iters, "latency_us": seconds * 1e6})
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def measure_pair(backend: str, sizes: list[int], env: dict[str, str], timeout_s: float = 900.0) -> list[dict]:
    """All-reduce latency and bus bandwidth per payload between two rank processes started
    with env (each `python -m speedsplit.measuring.link`, so no caller's main module is re-run)."""
    folder = Path(tempfile.mkdtemp(prefix="speedsplit-link-"))
    try:
        args = [json.dumps(sizes), backend, str(folder / "rendezvous"), str(folder / "rows.json")]
        ranks: list[subprocess.Popen] = []
        deadline = time.monotonic() + timeout_s
        try:
            with stop_on_signals():  # a stopped job still runs the finally below
                for r in range(2):
                    ranks.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "speedsplit.measuring.link", str(r), *args],
                            env={**os.environ, **env, "PYTHONPATH": _with_package(os.environ.get("PYTHONPATH"))},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent,  # a job killed outright takes its ranks with it
                        )
                    )
                while any(p.poll() is None for p in ranks) and time.monotonic() < deadline:
                    if any(p.poll() not in (None, 0) for p in ranks):
                        break  # one rank failed: the other would wait for it forever
                    time.sleep(0.2)
        finally:
            for p in ranks:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        if any(p.returncode for p in ranks):
            tail = b"".join(p.stdout.read() for p in ranks).decode(errors="replace")[-1500:]
            raise RuntimeError(f"an all-reduce rank failed or timed out ({[p.returncode for p in ranks]}): {tail}")
        rows = json.loads((folder / "rows.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for row in rows:
        algbw = row["bytes"] / (row["latency_us"] / 1e6) / 1e9
        row["algbw_gb_s"] = algbw
        row["busbw_gb_s"] = algbw * 2 * (2 - 1) / 2  # ring all-reduce over n ranks: 2(n-1)/n
    return rows


def _with_package(pythonpath: str | None) -> str:
    """PYTHONPATH that also finds this package (a workflow script's env may not install it)."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root, pythonpath]) if pythonpath else root


def topology_matrix() -> str | None:
    """`nvidia-smi topo -m` as printed, or None where there is no nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    return None


def run(platform: str, gpus: int, decode_bytes: list[int], max_mib: int = 256, lease_timeout_s: float = 3600.0):
    """The link control on `gpus` leased cards (every pair), or over gloo on the cpu platform."""
    sizes = payload_sizes(decode_bytes, max_mib * MIB)
    out = {"platform": platform, "payload_bytes": sizes, "decode_payload_bytes": sorted(set(decode_bytes))}
    with cuda_devices(gpus, platform, timeout_s=lease_timeout_s) as held:
        measurements = []
        if platform == "cuda":
            out["backend"] = "nccl"
            out["devices"] = held.devices
            for a, b in itertools.combinations(range(len(held.devices)), 2):
                pair = f"{held.devices[a]},{held.devices[b]}"
                visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                env_pair = {"CUDA_VISIBLE_DEVICES": f"{visible[a]},{visible[b]}"}
                for mode, extra in MODES.items():
                    rows = measure_pair("nccl", sizes, {**BASE_ENV, **env_pair, **extra})
                    measurements += [{"pair": pair, "mode": mode, **r} for r in rows]
            out["nccl_version"] = _nccl_version()
        else:
            out["backend"] = "gloo"
            out["devices"] = []
            out["note"] = "cpu platform: two host processes over gloo; no cards, no peer-to-peer modes"
            rows = measure_pair("gloo", sizes, dict(BASE_ENV))
            measurements += [{"pair": "cpu,cpu", "mode": "host", **r} for r in rows]
    out["measurements"] = measurements
    matrix = topology_matrix()
    out["topology_matrix"] = matrix
    if matrix is None:
        out["topology_matrix_absent"] = "no nvidia-smi on this host"
    out["hardware"] = hardware()
    return out


def _nccl_version() -> str | None:
    with contextlib.suppress(Exception):
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return None


def decode_payloads(users: list[int], hidden_sizes: list[int]) -> list[int]:
    """One decode step's activation per layer all-reduce: users x hidden x 2 bytes (fp16)."""
    return sorted({u * h * 2 for u in users for h in hidden_sizes})


if __name__ == "__main__":  # one rank: python -m speedsplit.measuring.link RANK SIZES BACKEND RENDEZVOUS OUT
    _rank(int(sys.argv[1]), 2, sys.argv[4], sys.argv[3], json.loads(sys.argv[2]), sys.argv[5])
