"""The memory bandwidth the stacks' decode is held against (speedsplit/measuring/hardware.py),
measured for real on this host's memory: a copy's bytes read and written over its time."""

from speedsplit.measuring import hardware


def test_a_host_copy_counts_what_it_reads_and_writes():
    out = hardware.copy_bandwidth("cpu", size_mib=8, repeats=5)
    assert out["platform"] == "cpu" and out["device"] == "cpu" and out["repeats"] == 5
    assert out["bytes_per_copy"] == 2 * 8 * 2**20  # 8 MiB read and 8 MiB written
    assert 0 < out["gb_s_median"] <= out["gb_s_best"]  # the best of the copies, then their median
    assert out["gb_s_best"] < 10_000  # a host's memory, not a division by a zero time
    assert isinstance(out["threads"], int) and out["threads"] >= 1


def test_a_measurement_says_which_machine_made_it():
    out = hardware.measure("cpu", size_mib=4)
    assert out["gb_s_median"] > 0
    assert out["hardware"]["platform"] == "cpu" and out["hardware"]["cpu_count"] >= 1
