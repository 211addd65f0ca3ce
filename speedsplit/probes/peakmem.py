"""The peak memory of a command and everything it starts, for the memory budgets of the demo
and the tests (`make demo` and `make test` stay under 12 GiB on a 24 GiB machine).

    speedsplit peakmem -- make demo

Every 0.5 s it sums the resident memory of every process started since the command (the
command's tree, and the session daemons and servers that leave it for init: a tree walk would
miss them), and reads the host's memory in use. At the end it prints both peaks. Summed RSS
counts shared pages once per process, so it is an upper bound.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil

GIB = 2**30


def _started_since(t0: float) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["create_time"]):
        if (p.info["create_time"] or 0) >= t0 - 1:
            out.append(p)
    return out


def _rss(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def measure(argv: list[str], interval_s: float = 0.5) -> tuple[int, float, float, float]:
    """Run argv; returns (its exit code, peak summed RSS GiB, peak host memory in use GiB above
    what was in use at the start, seconds)."""
    t0 = time.time()
    base = psutil.virtual_memory().used
    peaks = {"rss": 0, "host": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks["rss"] = max(peaks["rss"], _rss(_started_since(t0)))
            peaks["host"] = max(peaks["host"], psutil.virtual_memory().used - base)
            done.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    rc = subprocess.call(argv)
    done.set()
    thread.join()
    return rc, peaks["rss"] / GIB, peaks["host"] / GIB, time.time() - t0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        raise SystemExit("usage: speedsplit peakmem -- COMMAND ARGS...")
    rc, rss, host, seconds = measure(argv)
    print(
        f"peakmem: {' '.join(argv)}: exit {rc}, {seconds / 60:.1f} min, peak summed RSS {rss:.2f} GiB, "
        f"peak host memory in use above the start {host:.2f} GiB",
        file=sys.stderr,
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
