"""Keeping a timing loop's CPU out of deep idle while it times something.

On a virtual machine (a KVM guest with the haltpoll idle driver, say), a CPU left idle for a
few hundred milliseconds is given back to the host, and the timer or packet that ends the wait
wakes it milliseconds late: on a 2-core Xeon guest `asyncio.sleep(0.8)` returned 4.8 ms late
(0.14 ms for 8 ms), and a client waiting 320 ms for a first token read it 7 ms late, at one user
only (at eight the CPUs never sleep that long). A loop that wakes itself every `PERIOD_S` never
idles long enough for that: with a 2 ms tick the same 0.8 s sleep returned 0.7 ms late, the
millisecond rounding of the event loop's own timers.

    async with Awake():   # or: with awake.held(): inside a running loop
        ...               # every await in here wakes on time

The ticker also says when the loop itself did not run: a tick that wakes late marks a stretch
in which no callback of the loop ran (one callback held it, or the process was off the CPUs),
and every timestamp the loop took in it may be that late (`longest_stall`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import asynccontextmanager

PERIOD_S = 0.002  # the tick: 500 wakeups a second, a fraction of a percent of a core
LATE_S = 0.01  # a tick later than this is kept: the loop did not run (busy, or off the CPUs)


async def _tick(period_s: float, late: deque[tuple[float, float]]) -> None:
    """Wake every period_s; each wake-up later than LATE_S is kept as (when it woke, how late)."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        woke = time.perf_counter()
        if (late_s := woke - t - period_s) > LATE_S:
            late.append((woke, late_s))


class Awake:
    """A count of the timed things under way in one event loop; while it is above zero, a
    ticker wakes the loop every `period_s` (a server ticks only while it serves)."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self.holders = 0
        # (time.perf_counter it woke, seconds late); a long-serving server keeps the latest
        self.late: deque[tuple[float, float]] = deque(maxlen=10_000)
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Awake:
        self.holders += 1
        if self._task is None:
            self._task = asyncio.create_task(_tick(self.period_s, self.late))
        return self

    def longest_stall(self, start: float, end: float) -> float:
        """The longest the loop went without running inside [start, end] (time.perf_counter; a
        late tick counts the part of its lateness inside), 0.0 when no tick was above LATE_S."""
        inside = [min(w, end) - max(w - late, start) for w, late in self.late if w > start and w - late < end]
        return max(inside, default=0.0)

    async def __aexit__(self, *exc) -> None:
        self.holders -= 1
        if self.holders == 0 and self._task is not None:
            self._task.cancel()
            self._task = None


@asynccontextmanager
async def held(period_s: float = PERIOD_S):
    """The loop kept awake for the block's duration."""
    async with Awake(period_s) as a:
        yield a
