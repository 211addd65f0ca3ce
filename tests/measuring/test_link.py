"""The interconnect control on a CPU: two real ranks over gloo, every payload measured."""

import pytest

from speedsplit.analysis.topology import link_frame
from speedsplit.measuring import link

MIB = 2**20


def test_payloads_run_from_a_decode_step_to_the_largest():
    decode = link.decode_payloads([8, 64], [4096])
    assert decode == [8 * 4096 * 2, 64 * 4096 * 2]
    sizes = link.payload_sizes(decode, 256 * MIB)
    assert sizes[0] == decode[0] and set(decode) <= set(sizes) and sizes[-1] == 256 * MIB
    doubling = [decode[0] * 2**k for k in range(20) if decode[0] * 2**k <= 256 * MIB]
    assert sizes == sorted(set(doubling) | set(decode) | {256 * MIB})


@pytest.mark.slow
def test_two_ranks_all_reduce_over_gloo_on_a_cpu():
    out = link.run("cpu", 1, link.decode_payloads([2], [128]), max_mib=1)
    assert out["backend"] == "gloo" and out["topology_matrix"] is None and out["topology_matrix_absent"]
    frame = link_frame(out)
    assert frame["bytes"].to_list() == out["payload_bytes"] and frame["bytes"].to_list()[-1] == MIB
    assert frame.filter(frame["decode_sized"])["bytes"].to_list() == [2 * 128 * 2]
    assert (frame["latency_us"] > 0).all() and frame["busbw_gb_s"].to_list() == pytest.approx(
        [b / (t / 1e6) / 1e9 for b, t in zip(frame["bytes"], frame["latency_us"])]
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_stopped_or_killed_link_job_takes_its_ranks_with_it(sig, tmp_path):
    """The control's parent stopped (SIGTERM) or killed outright (SIGKILL) mid-measurement:
    both rank processes are gone within seconds (on GPUs they would go on all-reducing on
    cards whose lease was released)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from speedsplit.core import procs

    code = "from speedsplit.measuring import link; link.measure_pair('gloo', [64 * 2**20] * 200, dict(link.BASE_ENV))"
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
    deadline = time.monotonic() + 60
    ranks = []
    while len(ranks) < 2 and time.monotonic() < deadline:
        ranks = [
            p for p in procs.descendants(parent.pid) if "speedsplit.measuring.link" in " ".join(procs.cmdline(p.pid))
        ]
        time.sleep(0.2)
    assert len(ranks) == 2, "the ranks never started"
    time.sleep(2.0)  # rendezvous done: the ranks are all-reducing
    os.kill(parent.pid, getattr(signal, sig))
    parent.wait(timeout=30)
    deadline = time.monotonic() + 15
    while any(r.alive() for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(r.alive() for r in ranks), f"ranks still running after {sig} to their parent"
