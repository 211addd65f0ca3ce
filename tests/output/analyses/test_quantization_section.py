"""The INT4 checkpoints as an analysis (output/analyses/quantization.py): when the config turns it
on, the table it builds from the quantize rule's reports (one row each: how the checkpoint was
made, its time, card memory and quality) and its report section, with no report among the results."""

import json

import polars as pl
import pytest

from speedsplit.analysis.quantization import SCHEMA
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import quantization as Q
from speedsplit.planning import config as C
from speedsplit.planning.plan import QUANTIZE_REPORT

SETTINGS = {
    "bits": 4, "group_size": 128, "desc_act": False, "sym": True, "calibration_samples": 32,
    "calibration_tokens": 256, "seed": 0, "calibration_source": "random tokens of the vocabulary",
    "calibration_batch": 16,
}  # fmt: skip
# The three reports models/quantize.py writes: GPTQModel on a card, a checkpoint adopted from a
# folder, and a GPTQ config over weights the engine initialises (no format: GPTQ).
MADE = {
    "method": "gptqmodel", "format": "gptq", "settings": SETTINGS, "quantize_s": 754.5, "device": "NVIDIA H200",
    "peak_gpu_gib": 21.25,
    "quality": {"status": "measured", "tokens": 2040, "token_agreement": 0.9412, "perplexity_fp16": 6.1,
                "perplexity_int4": 6.4},
}  # fmt: skip
ADOPTED = {
    "method": "prequantized", "format": "awq", "path": "/models/llama-awq",
    "settings": {"bits": 4, "group_size": 128, "desc_act": False, "sym": False, "checkpoint_format": "gemm",
                 "modules": ["q_proj"], "quantized_layers": 224},
    "quantize_s": None,
    "quality": {"status": "not measured: the FP16 model has no weights of its own (dummy)"},
}  # fmt: skip
DUMMY = {
    "method": "dummy", "settings": SETTINGS, "quantize_s": 0.0,
    "quality": {"status": "not applicable: dummy weights are initialised by the engine"},
}  # fmt: skip


def report(root, model, variant, doc) -> str:
    """A report where the quantize rule writes it (results/quantize/{model}/{variant}.json)."""
    path = root / QUANTIZE_REPORT.format(model=model, variant=variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def built(paths) -> dict[str, pl.DataFrame]:
    empty = pl.DataFrame()
    return Q.build(Basis(runs=empty, cells=empty, by_throughput=empty, chains={}, quantize_paths=tuple(paths)))


def test_a_benchmarked_int4_stack_turns_the_analysis_on():
    int4 = C.load()  # its study chain ends on vllm-marlin (GPTQ)
    fp16_chain = C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"chains": {"study": ["hf-fp16", "vllm-fp16"]}})
    fp16 = C.validate(fp16_chain)
    awq = C.validate(C.merge(fp16_chain, {"chains": {"format": ["vllm-fp16", "vllm-awq"]}}))
    assert Q.ANALYSIS.enabled(int4) and Q.ANALYSIS.enabled(awq) and not Q.ANALYSIS.enabled(fp16)
    assert "quantization" in table_names(int4) and "quantization" not in table_names(fp16)


def test_no_report_is_an_empty_table_the_section_says_so_and_no_table_is_no_section():
    frames = built([])
    assert frames["quantization"].height == 0 and frames["quantization"].schema == pl.Schema(SCHEMA)
    html = Q.section(frames, {})
    assert html.startswith("<h2>INT4 checkpoints</h2>\n<p class='note'>How each INT4 checkpoint")
    assert html.endswith("<p>No quantization report among the results.</p>")
    assert Q.section({}, {}) == ""


def test_a_row_per_report_by_model_then_variant_with_how_it_was_made_and_its_quality(tmp_path):
    paths = [
        report(tmp_path, "tiny", "gptq-w4g128", DUMMY),
        report(tmp_path, "llama", "gptq-w4g128", MADE),
        report(tmp_path, "llama", "awq-w4g128", ADOPTED),
    ]
    frame = built(paths)["quantization"]
    assert frame.select("model", "variant", "method", "format").rows() == [
        ("llama", "awq-w4g128", "prequantized", "awq"),
        ("llama", "gptq-w4g128", "gptqmodel", "gptq"),
        ("tiny", "gptq-w4g128", "dummy", "gptq"),  # a dummy report names no format: GPTQ
    ]
    adopted, made, dummy = frame.iter_rows(named=True)
    assert made["calibration"] == "32 x 256 tokens (random tokens of the vocabulary)"
    assert (made["bits"], made["group_size"], made["desc_act"], made["device"]) == (4, 128, False, "NVIDIA H200")
    assert (made["quantize_s"], made["peak_gpu_gib"], made["quality"]) == (754.5, 21.25, "measured")
    assert (made["token_agreement"], made["perplexity_fp16"], made["perplexity_int4"]) == pytest.approx(
        (0.9412, 6.1, 6.4)
    )
    # adopted and dummy checkpoints were calibrated by nobody here, and have no quality numbers
    assert adopted["calibration"] is None and dummy["calibration"] is None
    assert (adopted["quantize_s"], adopted["device"], adopted["peak_gpu_gib"], adopted["token_agreement"]) == (
        None, None, None, None,
    )  # fmt: skip
    assert adopted["quality"] == "not measured: the FP16 model has no weights of its own (dummy)"
    assert (dummy["quantize_s"], dummy["quality"]) == (
        0.0,
        "not applicable: dummy weights are initialised by the engine",
    )


def test_the_section_tabulates_every_report(tmp_path):
    frames = built([report(tmp_path, "llama", "gptq-w4g128", MADE), report(tmp_path, "tiny", "gptq-w4g128", DUMMY)])
    html = Q.section(frames, {})
    assert html.count("<tr><td>") == 2 and "No quantization report" not in html
    assert (
        "<tr><td>llama</td><td>gptq-w4g128</td><td>gptqmodel</td><td>gptq</td><td>4</td><td>128</td><td>False</td>"
        "<td>32 x 256 tokens (random tokens of the vocabulary)</td><td>NVIDIA H200</td><td>754.5</td><td>21.25</td>"
        "<td>measured</td><td>0.9412</td><td>6.1</td><td>6.4</td></tr>"
    ) in html
    assert (
        "<td>dummy</td><td>gptq</td><td>4</td><td>128</td><td>False</td><td>—</td><td>—</td><td>0</td><td>—</td>"
        in html
    )


def test_a_gptqmodel_checkpoint_made_on_a_cpu_has_no_card_memory(tmp_path):
    on_cpu = MADE | {"device": "cpu", "peak_gpu_gib": None, "quantize_s": 9.8}
    (row,) = built([report(tmp_path, "tiny", "gptq-w4g128", on_cpu)])["quantization"].iter_rows(named=True)
    assert (row["device"], row["peak_gpu_gib"], row["quantize_s"]) == ("cpu", None, 9.8)
