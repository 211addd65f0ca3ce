"""Measured memory bandwidth of the device the stacks run on: the ceiling that decode, which
reads every weight once per step, is held against (model-bandwidth utilisation).
"""

from __future__ import annotations

import time

from speedsplit.core.results import hardware
from speedsplit.serving.lease import cuda_devices


def copy_bandwidth(platform: str, size_mib: int = 2048, repeats: int = 20) -> dict:
    """Device-to-device copy rate in GB/s, counting bytes read and written (as a decode
    step's weight reads are counted). On the cpu platform, a host memory copy."""
    import torch

    device = "cuda" if platform == "cuda" else "cpu"
    n = size_mib * 2**20 // 2
    src = torch.empty(n, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 3):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= 3:  # warm-up copies excluded
            times.append(seconds)
    times.sort()
    moved = 2 * n * 2  # read + write, 2 bytes each
    return {
        "platform": platform,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "bytes_per_copy": moved,
        "repeats": repeats,
        "gb_s_median": moved / times[len(times) // 2] / 1e9,
        "gb_s_best": moved / times[0] / 1e9,
        "threads": torch.get_num_threads() if device == "cpu" else None,
    }


def measure(platform: str, size_mib: int = 2048, lease_timeout_s: float = 3600.0) -> dict:
    """Lease one card (on cuda), measure, and add the machine's provenance."""
    with cuda_devices(1, platform, timeout_s=lease_timeout_s):
        out = copy_bandwidth(platform, size_mib=size_mib)
    out["hardware"] = hardware()
    return out
