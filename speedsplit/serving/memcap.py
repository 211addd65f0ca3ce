"""Run a Python server as if its card had only N GiB, or (on a CPU) as if its host had only
N GiB beyond what it holds: the memory cap for stacks that have no memory setting of their
own (`transformers serve`, speedsplit.serving.hf_generate).

Two things make a big card look small to a PyTorch server in this process: the caching
allocator refuses to hold more than N GiB (`set_per_process_memory_fraction`), so a batch
that would not fit on the small card fails as it would there; and `torch.cuda.mem_get_info`
reports the small card (total N GiB, free N less what is in use), so a server that sizes its
KV cache from free memory (transformers' continuous batching takes 90% of it) sizes it for
the small card instead of failing at the cap. Bandwidth and compute stay the big card's.

On a CPU, `transformers serve --continuous-batching` sizes its cache from the host's memory
(90% of what is not resident: ~21 GB on a 24 GiB machine, for a 2 MB model). `--host-cache-gib`
makes `psutil.virtual_memory()` report a host whose memory is what the process holds plus N
GiB, so the cache is sized from N GiB.

    python -m speedsplit.serving.memcap --gib 24 -- -m transformers.cli.transformers serve DIR ...
    python -m speedsplit.serving.memcap --host-cache-gib 0.3 -- -m transformers.cli.transformers serve DIR ...
    python -m speedsplit.serving.memcap --gib 24 -- path/to/server.py ARGS ...
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys

GIB = 2**30


def allocator_fraction(free: int, total: int, cap: int) -> float:
    """The share of the card PyTorch's allocator may hold so that the card holds at most cap:
    what is already on it (this process's CUDA context, about 0.5 GiB) counts against the
    cap, as it would on the small card."""
    return max(0, cap - (total - free)) / total


def capped_info(free: int, total: int, cap: int) -> tuple[int, int]:
    """(free, total) as a card of `cap` bytes would report them: what is in use stays in use."""
    return max(0, free - (total - cap)), cap


def apply(gib: float) -> str:
    """Caps every visible CUDA card at gib GiB for this process; returns what it did."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: nothing capped"
    cap = int(gib * GIB)
    totals = []
    fractions = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)  # after this process's context was made
        if cap >= total:
            raise SystemExit(f"memcap: {gib} GiB is not below card {index}'s {total / GIB:.1f} GiB")
        fractions.append(allocator_fraction(free, total, cap))
        torch.cuda.set_per_process_memory_fraction(fractions[-1], index)
        totals.append(total)
    real = torch.cuda.mem_get_info

    def mem_get_info(device=None):
        free, total = real(device)
        return capped_info(free, total, cap)

    torch.cuda.mem_get_info = mem_get_info
    torch.cuda.memory.mem_get_info = mem_get_info
    # transformers' continuous batching says how much it gave its cache at INFO only.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.INFO)
    cards = ", ".join(f"{t / GIB:.1f}" for t in totals)
    return (
        f"capped at {gib} GiB per card (allocator fraction {fractions[0]:.4f} of {cards} GiB: the cap less "
        f"{(totals[0] * (cap / totals[0] - fractions[0])) / GIB:.2f} GiB already on the card)"
    )


def apply_host(gib: float) -> str:
    """Make the host look like it has what this process holds plus gib GiB (psutil's view)."""
    import psutil

    extra, real = int(gib * GIB), psutil.virtual_memory

    def virtual_memory():
        vm = real()
        rss = psutil.Process().memory_info().rss
        total = min(vm.total, rss + extra)
        available = max(0, min(vm.available, total - rss))
        return vm._replace(total=total, available=available, free=min(vm.free, available))

    psutil.virtual_memory = virtual_memory
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.INFO)
    return f"host memory seen as resident + {gib:g} GiB (caches sized from {gib:g} GiB)"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit(
            "memcap: usage: python -m speedsplit.serving.memcap (--gib N | --host-cache-gib N) -- (-m MODULE | SCRIPT) ARGS..."
        )
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m speedsplit.serving.memcap")
    parser.add_argument("--gib", type=float, help="the emulated card's memory")
    parser.add_argument("--host-cache-gib", type=float, help="host memory a CPU server may size its caches from")
    opts = parser.parse_args(argv[:split])
    if opts.gib is None and opts.host_cache_gib is None:
        raise SystemExit("memcap: give --gib (a card) or --host-cache-gib (the host)")
    target = argv[split + 1 :]
    if not target or (target[0] == "-m" and len(target) < 2):
        raise SystemExit("memcap: nothing to run after --")
    if opts.gib is not None:
        print(f"[memcap] {apply(opts.gib)}", flush=True)
    if opts.host_cache_gib is not None:
        print(f"[memcap] {apply_host(opts.host_cache_gib)}", flush=True)
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    main()
