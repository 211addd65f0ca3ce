"""A chain step's change of decode step, split by kernel class, on profiles whose answer is known."""

from types import SimpleNamespace

import pytest

from speedsplit.analysis.step_time import CLASSES, by_chain, sentence, step_time_changes, step_time_frame
from speedsplit.core.trace_split import ProfileRecord, ProfileWindow, StepSplit


def split(**ms):
    parts = {f"{c}_ms": ms.get(c, 0.0) for c in CLASSES}
    return StepSplit(device="gpu", step_ms=sum(parts.values()), steps=32, kernels=100, **parts)


def run(stack, cell="u64", profile=None):
    return SimpleNamespace(
        model="m",
        stack=stack,
        topology="tp1",
        cell=cell,
        run=0,
        job=SimpleNamespace(cell=SimpleNamespace(users=64)),
        profile=profile,
    )


def profiled(stack, **ms):
    return run(stack, profile=ProfileRecord(status="ok", window=ProfileWindow(), ranks=[split(**ms)], seconds=3.0))


FP16 = dict(dense_gemm=6.0, attention=1.5, other=0.9, idle=0.8)  # 9.2 ms a step
MARLIN = dict(dense_gemm=0.6, quantized_gemm=7.0, attention=1.5, other=0.9, idle=0.8)  # 10.8 ms


def test_a_step_change_splits_exactly_into_its_classes():
    frame = step_time_frame([profiled("vllm-fp16", **FP16), profiled("vllm-marlin", **MARLIN), run("hf-fp16")])
    assert frame["stack"].to_list() == ["vllm-fp16", "vllm-marlin"]  # a run that profiled nothing has no row
    changes = step_time_changes(frame, {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]})
    assert changes.height == 1  # hf-fp16 was not profiled: its step has no kernel level
    r = changes.row(0, named=True)
    assert r["step"] == "vllm-fp16 → vllm-marlin" and r["position"] == 2
    assert (r["from_step_ms"], r["to_step_ms"]) == pytest.approx((9.2, 10.8))
    assert r["quantized_gemm_delta_ms"] == pytest.approx(7.0) and r["dense_gemm_delta_ms"] == pytest.approx(-5.4)
    assert sum(r[f"{c}_delta_ms"] for c in CLASSES) == pytest.approx(r["delta_ms"])
    assert r["step_speedup"] == pytest.approx(9.2 / 10.8)
    said = sentence(r)
    assert said.startswith("decode step 9.2 → 10.8 ms (17% slower; by kernel class): quantized GEMM +7 ms")
    assert "dense GEMM -5.4 ms" in said and said.endswith("; attention unchanged")
    assert by_chain(changes) == {("study", "m", "tp1", "u64"): f"vllm-fp16 → vllm-marlin: {said}"}


def test_a_failed_profile_is_a_row_that_says_why_and_no_step():
    failed = run("vllm-marlin", profile=ProfileRecord(status="error", window=ProfileWindow(), error="no trace"))
    frame = step_time_frame([profiled("vllm-fp16", **FP16), failed])
    assert frame.filter(frame["stack"] == "vllm-marlin")["error"].to_list() == ["no trace"]
    assert step_time_changes(frame, {"study": ["vllm-fp16", "vllm-marlin"]}).height == 0


def test_the_measured_phase_steps_stand_beside_the_profiled_ones_and_a_profiler_slowed_side_is_said():
    import polars as pl

    # the measured phases: FP16 150 steps a second (6.67 ms), Marlin 248 (4.03 ms); profiled
    # 9.2 and 10.8 ms: Marlin's profiled steps are 168% slower than its measured ones
    runs = pl.DataFrame(
        {
            "model": ["m", "m"],
            "stack": ["vllm-fp16", "vllm-marlin"],
            "topology": ["tp1", "tp1"],
            "cell": ["u64", "u64"],
            "run": [0, 0],
            "wall_s": [2.0, 2.0],
            "engine_steps": [300.0, 496.0],
        }
    )
    frame = step_time_frame([profiled("vllm-fp16", **FP16), profiled("vllm-marlin", **MARLIN)], runs)
    assert frame["measured_step_ms"].to_list() == pytest.approx([2000 / 300, 2000 / 496])
    r = step_time_changes(frame, {"study": ["vllm-fp16", "vllm-marlin"]}).row(0, named=True)
    said = sentence(r)
    assert "the measured phase's steps (prefill in them) 6.67 → 4.03 ms" in said
    assert said.endswith(
        "(the profiler slowed vllm-fp16's 38%, vllm-marlin's 168% beyond them: idle there is partly the profiler's)"
    )
