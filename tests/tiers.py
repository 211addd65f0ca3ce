"""make test: the tests that hold latency to a bound (marker serial) at the CPUs' normal
priority, and all the others on three workers at the lowest (nice 19) beside them.

The serial tier (the truth tier, the vLLM cliff) waits on its servers most of its five minutes,
half a core busy; the workers' tier is CPU-bound (1.7 of 2 cores for eleven minutes). One after
the other they took 16-18 minutes on a 2-core AMD EPYC; at once, 11 min 51 s and 12 min 52 s.
A thread that wakes from a sleep takes a core at once whatever else runs (the scheduler's wakeup
preemption: a 5 ms sleep overslept by 0.09 ms at p99 beside four busy threads at nice 19, by
0.18 ms beside four at nice 0, by 0.16 ms beside none); a thread that computes gets 1024 shares
of a core to a nice-19 thread's 15, where beside a worker at its own priority it would get half.
So the serial tier's clients and servers read their tokens as on a machine of their own (its
truth tier's errors stayed within those of its runs alone), and the workers share what it
leaves as they always shared the CPUs: the serial tier alone left a thread of the idle policy
(below nice 19) waiting at most 0.06 s over its five minutes.

Not the idle policy (SCHED_IDLE) for the workers: its threads do not preempt each other on
waking (only the timer tick switches them), and the workers' own clients read their servers
late: a client loop 0.17 s without the CPU, a quality probe's 5 s bound read 6 s, a Slurm run's
result flagged client_stalled.

Every process a tier starts inherits its niceness. Both stay in this process's session: Linux's
autogroup scheduler (/proc/sys/kernel/sched_autogroup_enabled) shares the CPUs between sessions
before it looks at a thread's niceness. The serial tier's output comes as it runs, the workers'
after it (kept in a file). Ctrl-C reaches both tiers (the terminal's process group); this waits
for them to stop. Exit status 0 when both passed.

    python tests/tiers.py [pytest arguments for both tiers]
"""

import os
import subprocess
import sys
import tempfile
import time

SERIAL = ["--durations=10", "-m", "serial"]
WORKERS = ["-n", "3", "--durations=25", "-m", "not serial"]


def lowest_priority() -> None:
    """In the workers' child before exec."""
    os.nice(19)


def follow(path: str, proc: subprocess.Popen) -> None:
    """The file's text to stdout from its start, until proc has ended and all of it is out."""
    with open(path, "rb") as f:
        while True:
            ended = proc.poll() is not None
            chunk = f.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            if ended and not chunk:
                return
            time.sleep(0.5)


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-q", *args]
    # Workers' OpenMP threads sleep while they wait (spinning, two workers' CPU servers slowed
    # each other 6x); three workers' servers at once would all be pinned to one core by the CPU
    # split (benchmark.cpu_isolation): it is off there.
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "SPEEDSPLIT_NO_CPU_SPLIT": "1"}
    with tempfile.NamedTemporaryFile(prefix="speedsplit-workers-", suffix=".log") as log:
        workers = subprocess.Popen(
            [*pytest, *WORKERS], stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=lowest_priority
        )
        serial = subprocess.Popen([*pytest, *SERIAL])
        try:
            serial.wait()
            print(f"\nmake test: serial tier exit {serial.returncode}; the three workers beside it:", flush=True)
            follow(log.name, workers)
        except KeyboardInterrupt:  # both tiers had it too: they end their tests' cleanup
            serial.wait()
            print("\nmake test: interrupted; the three workers say:", flush=True)
            follow(log.name, workers)
            return 130
    print(f"make test: serial tier exit {serial.returncode}, three workers exit {workers.returncode} (0: passed)")
    return 0 if serial.returncode == 0 and workers.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
