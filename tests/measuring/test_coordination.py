"""The coordination split on traces and profiles with known parts."""

import pytest

from speedsplit.analysis.topology import coordination_frame
from speedsplit.core.trace_split import split_trace
from speedsplit.core.trace_split import ProfileWindow


def k(name, ts, dur, cat="kernel", tid=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_a_step_splits_into_compute_communication_copies_and_gaps():
    # two steps over 0..1000 µs: compute 0-300 and 500-800, an NCCL all-reduce 300-400 (and
    # overlapping compute on another stream 350-450: counted once, as communication up to 400),
    # a copy 900-950, idle otherwise
    events = [
        k("ampere_fp16_gemm", 0, 300),
        k("ncclDevKernel_AllReduce_Sum_f16_RING_LL", 300, 100),
        k("flash_fwd_kernel", 350, 100, tid=8),
        k("cross_device_reduce_1stage<half, 2>", 500, 0),
        k("sm90_gemm", 500, 300),
        k("Memcpy DtoD", 900, 50, cat="gpu_memcpy"),
        k("Memcpy DtoD", 950, 50, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # CPU side: ignored
    ]
    s = split_trace(events, steps=2)
    assert s.device == "gpu" and s.step_ms == pytest.approx(1000 / 2 / 1e3)
    assert s.communication_ms == pytest.approx(100 / 2 / 1e3)
    assert s.compute_ms == pytest.approx((300 + 50 + 300) / 2 / 1e3)
    assert s.attention_ms == pytest.approx(50 / 2 / 1e3)  # flash_fwd beyond the all-reduce
    assert s.copy_ms == pytest.approx(100 / 2 / 1e3)
    assert s.idle_ms == pytest.approx((1000 - 850) / 2 / 1e3)
    parts = s.communication_ms + s.compute_ms + s.copy_ms + s.idle_ms
    assert parts == pytest.approx(s.step_ms) and s.kernels == 5
    assert split_trace([{"ph": "X", "cat": "python_function", "name": "x", "ts": 0, "dur": 1}], 1) is None


def profile(topology, tp, step, comm, compute, gap, copy=0.0):
    return {
        "model": "m",
        "stack": "vllm-fp16",
        "cell": "c",
        "topology": topology,
        "tensor_parallel": tp,
        "breakdown": {
            "step_ms": step,
            "communication_ms": comm,
            "compute_ms": compute,
            "gap_ms": gap,
            "copy_ms": copy,
        },
    }


def test_the_shortfall_against_ideal_scaling_splits_exactly():
    # tp1: 10 ms a step (9 compute, 1 gap); tp2: 7 ms (4.6 compute, 1.6 communication, 0.8 gap)
    # ideal tp2 step 5 ms, shortfall 2 ms = compute 0.1 + communication 1.6 + gap 0.3
    rows = coordination_frame([profile("tp1", 1, 10.0, 0.0, 9.0, 1.0), profile("tp2", 2, 7.0, 1.6, 4.6, 0.8)])
    r = rows.row(0, named=True)
    assert r["ideal_step_ms"] == pytest.approx(5.0) and r["shortfall_ms"] == pytest.approx(2.0)
    assert r["excess_compute_ms"] == pytest.approx(0.1) and r["excess_gap_ms"] == pytest.approx(0.3)
    excess = sum(r[f"excess_{p}"] for p in ("compute_ms", "communication_ms", "copy_ms", "gap_ms"))
    assert excess == pytest.approx(r["shortfall_ms"])
    assert r["coordination_share"] == pytest.approx(1.9 / 2.0) and r["step_speedup"] == pytest.approx(10 / 7)


def test_a_missing_or_empty_profile_is_said():
    cpu = {**profile("tp1", 1, 1, 0, 1, 0), "breakdown": None, "note": "no GPU kernel events"}
    rows = coordination_frame([cpu, profile("tp2", 2, 1, 0, 1, 0)])
    assert rows["note"].to_list() == ["tp1: no GPU kernel events"] and rows["shortfall_ms"].to_list() == [None]
    assert coordination_frame([profile("tp2", 2, 1, 0, 1, 0)])["note"].to_list() == ["no tp1 profile"]


def test_profiler_arguments_survive_the_argument_templates():
    from speedsplit.serving.stacks import render_args

    args = render_args(ProfileWindow(delay_iterations=16, iterations=32).server_args("/t"), {})
    assert args[0] == "--profiler-config" and '"max_iterations": 32' in args[1] and args[1].startswith("{")
