"""make test: the tests that hold latency to a bound (marker serial) at the CPUs' normal
priority, and all the others on three workers at the lowest (nice 19) beside them.

The serial tier (the truth tier, the vLLM cliff) waits on its servers most of its five minutes,
half a core busy; the workers' tier is CPU-bound (1.7 of 2 cores for eleven minutes). One after
the other they took 16-18 minutes on a 2-core AMD EPYC. Beside workers at nice 19 the serial
tier's threads get the CPU as on a machine of their own: a thread that wakes from a sleep takes
the core at once (the scheduler's wakeup preemption: a sleeper's 5 ms timer woke 0.07 ms late at
the median, 0.09 ms at p99, beside four busy threads at nice 19 as beside none), and a thread
that computes gets 1024 of every 1039 shares of a core from a thread at nice 19. The workers
share what is left as they always shared the CPUs, thread by thread: the serial tier alone left
an idle-priority thread waiting at most 0.06 s over its five minutes.

Not the idle policy (SCHED_IDLE): its threads do not preempt each other on waking (only the
timer tick switches them), and three workers' clients read their servers late: a client loop
0.17 s without the CPU, a quality probe's 5 s bound read 6 s, a Slurm run flagged client_stalled.

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
            workers.wait()
            return 130
    print(f"make test: serial tier exit {serial.returncode}, three workers exit {workers.returncode} (0: passed)")
    return 0 if serial.returncode == 0 and workers.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
