"""Where make test's CPU goes: CPU seconds per test, sampled from /proc.

Every process a test starts (its servers, daemons, Snakemake and its jobs) inherits the
environment variable PYTEST_CURRENT_TEST that pytest sets while the test runs, so each process
is charged to the test that started it; one that has none (an xdist worker itself) is charged to
"other: " and its first argument. Processes shorter than one sampling interval are missed.

    python tests/cpu_sampler.py /tmp/cpu.json 1200 &      # sample for up to 1,200 s
    make test; kill %1
    python -c "import json; [print(round(s), t) for t, s in json.load(open('/tmp/cpu.json'))[:30]]"
"""

import collections
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def owner(pid: str) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        for kv in f.read().split(b"\0"):
            if kv.startswith(b"PYTEST_CURRENT_TEST="):
                return kv.split(b"=", 1)[1].decode().rsplit(" ", 1)[0]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    return "other: " + (argv[1] if len(argv) > 1 else argv[0]).decode(errors="replace")[:40]


def sample(out: str, seconds: float, every_s: float = 0.5) -> None:
    seen: dict[tuple[str, str], list] = {}  # (pid, start time) -> [test, CPU seconds counted]
    per: collections.Counter = collections.Counter()
    end, dumped = time.time() + seconds, 0.0
    while time.time() < end:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                cpu, key = (int(stat[11]) + int(stat[12])) / HZ, (pid, stat[19])
                if key not in seen:
                    seen[key] = [owner(pid), 0.0]
                per[seen[key][0]] += cpu - seen[key][1]
                seen[key][1] = cpu
            except (OSError, IndexError, ValueError):
                pass  # gone between the listing and the read
        if time.time() - dumped > 10:
            _write(out, per)
            dumped = time.time()
        time.sleep(every_s)
    _write(out, per)


def _write(out: str, per: collections.Counter) -> None:
    """The counts so far, most first, replacing the file whole (a reader never sees half of it)."""
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(per.most_common(), f, indent=0)
    os.replace(tmp, out)


if __name__ == "__main__":
    sample(sys.argv[1], float(sys.argv[2]))
