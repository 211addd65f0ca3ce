"""The interconnect control on a CPU: two real ranks over gloo, every payload measured."""

import pytest

from speedsplit import link
from speedsplit.analysis.topology import link_frame

MIB = 2**20


def test_payloads_run_from_a_decode_step_to_the_largest():
    decode = link.decode_payloads([8, 64], [4096])
    assert decode == [8 * 4096 * 2, 64 * 4096 * 2]
    sizes = link.payload_sizes(decode, 256 * MIB)
    assert sizes[0] == decode[0] and set(decode) <= set(sizes) and sizes[-1] == 256 * MIB
    doubling = [decode[0] * 2**k for k in range(20) if decode[0] * 2**k <= 256 * MIB]
    assert sizes == sorted(set(doubling) | set(decode) | {256 * MIB})


def test_two_ranks_all_reduce_over_gloo_on_a_cpu():
    out = link.run("cpu", 1, link.decode_payloads([2], [128]), max_mib=1)
    assert out["backend"] == "gloo" and out["topology_matrix"] is None and out["topology_matrix_absent"]
    frame = link_frame(out)
    assert frame["bytes"].to_list() == out["payload_bytes"] and frame["bytes"].to_list()[-1] == MIB
    assert frame.filter(frame["decode_sized"])["bytes"].to_list() == [2 * 128 * 2]
    assert (frame["latency_us"] > 0).all() and frame["busbw_gb_s"].to_list() == pytest.approx(
        [b / (t / 1e6) / 1e9 for b, t in zip(frame["bytes"], frame["latency_us"])]
    )
