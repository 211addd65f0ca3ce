"""The INT4 kernel sweep (speedsplit/analysis/kernels.py): each GPTQ stack's throughput over the
FP16 reference's, cell by cell, with the kernel its engine reported, from clean runs only."""

import pytest
from records import fake_result, write_result

from speedsplit.analysis.kernels import kernels_frame
from speedsplit.output import aggregate


def runs_of(tmp_path, results):
    paths = [write_result(tmp_path / f"{r.stack}-{r.cell}-{r.run}.json", r) for r in results]
    return aggregate.build_frames(paths, {})["runs"]


def test_each_int4_stack_over_the_reference_with_its_kernel(tmp_path):
    results = [fake_result("vllm-fp16", 8, run, tok) for run, tok in enumerate((100.0, 110.0))]
    results += [fake_result("vllm-marlin", 8, run, tok) for run, tok in enumerate((150.0, 154.0))]
    results += [fake_result("vllm-fp16", 2, 0, 40.0), fake_result("vllm-marlin", 2, 0, 60.0)]
    frame = kernels_frame(runs_of(tmp_path, results), "vllm-fp16")
    rows = {r["cell"]: r for r in frame.iter_rows(named=True)}
    assert set(rows) == {"u8-wide-greedy", "u2-wide-greedy"}  # the FP16 stack is no row of its own
    eight = rows["u8-wide-greedy"]
    assert eight["stack"] == "vllm-marlin" and eight["kernel"] == "CPUWNA16LinearKernel"
    assert eight["reference"] == "vllm-fp16" and eight["runs_used"] == 4
    assert eight["output_tok_s"] == pytest.approx((150.0 * 154.0) ** 0.5)  # over runs: geometric
    assert eight["lo"] < eight["vs_reference"] < eight["hi"]  # paired by run: 1.5 and 1.4
    assert eight["vs_reference"] == pytest.approx(1.45, rel=0.01)
    two = rows["u2-wide-greedy"]
    assert two["vs_reference"] == pytest.approx(1.5) and two["runs_used"] == 2


def test_a_cell_without_a_clean_reference_or_int4_run_has_no_row(tmp_path):
    results = [fake_result("vllm-fp16", 8, 0, None, status="server_died"), fake_result("vllm-marlin", 8, 0, 150.0)]
    results += [fake_result("vllm-fp16", 2, 0, 40.0), fake_result("vllm-marlin", 2, 0, None, status="server_hung")]
    frame = kernels_frame(runs_of(tmp_path, results), "vllm-fp16")
    assert frame.is_empty() and "vs_reference" in frame.columns  # typed even when empty
