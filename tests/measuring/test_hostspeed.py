"""measuring/hostspeed.py: the fixed piece of work a run times around its load, and what the
record makes of the two timings (core/facts.HostSpeed)."""

import pytest

from speedsplit.core.facts import HostSpeed
from speedsplit.measuring import hostspeed


def test_the_work_is_fixed_and_timed_in_milliseconds_as_the_quickest_round():
    # the work itself: the same answer every time (nothing it does depends on the host)
    assert hostspeed._work(7) == 0 + 1 + 4 + 2 + 2 + 4 + 1 == 14  # i² mod 7 for i = 0..6
    ms = hostspeed.work_ms(rounds=2, iterations=1_000)
    assert isinstance(ms, float) and 0 < ms < 1_000 and ms == round(ms, 3)


def test_how_far_the_host_moved_is_the_ratio_of_the_two_timings_either_way():
    assert HostSpeed(before_ms=35.0, after_ms=49.0).moved == pytest.approx(1.4)
    assert HostSpeed(before_ms=49.0, after_ms=35.0).moved == pytest.approx(1.4)  # quicker after: moved as far
    assert HostSpeed(before_ms=5.0, after_ms=5.0).moved == 1.0
