"""The host's own speed around a run's load: one fixed piece of pure-Python work, timed on the
client's core just before the load and just after it (the quickest of a few rounds, so that a
slice the scheduler gave another process is not taken for the host's speed).

Where two runs of one cell disagree, this says whether the machine changed under them: on a
2-core virtual machine the same work took about 35 ms or about 50 ms, switching every few
seconds with nothing else running (docs/measurements/demo-spread-cpu.md), and no order of runs
or length of phase makes a steady measurement of a host that moves 1.4x on its own. The record
keeps both timings (core/facts.HostSpeed); the answer's spread line says how far the host moved
within the runs that disagree. It is timed outside the load, never beside it: a thread doing
work on the client's core would delay the client's own timestamps.
"""

from __future__ import annotations

import time

ROUNDS = 3
ITERATIONS = 50_000  # about 3-6 ms a round in CPython on these hosts


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def work_ms(rounds: int = ROUNDS, iterations: int = ITERATIONS) -> float:
    """Milliseconds the fixed work took, the quickest of `rounds` (on the calling thread's core)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        _work(iterations)
        best = min(best, time.perf_counter() - t)
    return round(best * 1e3, 3)
