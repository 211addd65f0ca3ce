"""The client's offsets measured against a real reference server of known speed."""

import pytest

from speedsplit.measuring import calibrate
from speedsplit.serving import reference_speed


# the offsets are the client's own latency: a second worker's load moved the 16-user offset to
# 52 ms on a 2-core CI host, so the test runs alone with the other latency bounds
@pytest.mark.serial
def test_a_level_measures_the_closed_loop_cycle_beside_the_end_to_end_offset():
    speed = reference_speed.Speed(ttft_s=0.02, itl_s=0.001)
    with calibrate.reference_server(speed) as url:
        lv = calibrate.level(url, 4, speed)
        many = calibrate.level(url, 16, speed)  # two requests a user, their warm-ups all at once
    assert lv.requests == 4 * 8 and many.requests == 16 * 2
    # a user's next request leaves after the last one's end: its cycle holds the end-to-end
    # offset and the turn between them (counting the warm-ups, sent apart, read -100 ms)
    for x in (lv, many):
        assert 0.0 <= x.e2e_s < x.cycle_s < x.e2e_s + 0.05 < 0.2
        # the client's tail: a p99 offset at least the median's
        assert x.ttft_p99_s >= x.ttft_s and x.tpot_p99_s >= x.tpot_s
    assert "cycle" in "\n".join(calibrate.lines(_carried(lv)))


def _carried(lv):
    from speedsplit.core.facts import Calibration

    return Calibration(
        measured_at="now",
        host_cpu="cpu",
        reference="ref",
        levels=[lv],
        ttft_s=lv.ttft_s,
        itl_s=0.0,
        tpot_s=0.0,
        e2e_s=lv.e2e_s,
        cycle_s=lv.cycle_s,
        ceiling_tok_s=1000.0,
        ceiling_users=1,
    )
