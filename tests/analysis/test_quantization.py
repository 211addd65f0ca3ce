"""The INT4 checkpoints table: one row per quantize report, whatever made the checkpoint."""

import json

from speedsplit.analysis.quantization import quantization_frame
from speedsplit.planning import config as C
from speedsplit.planning import plan as P


def test_each_report_is_a_row_with_its_model_variant_time_memory_and_quality(tmp_path):
    made = {
        "method": "gptqmodel",
        "format": "gptq",
        "settings": {
            "bits": 4,
            "group_size": 128,
            "desc_act": False,
            "calibration_samples": 128,
            "calibration_tokens": 512,
            "calibration_source": "random tokens of the vocabulary",
        },
        "quantize_s": 418.8,
        "device": "NVIDIA H200",
        "peak_gpu_gib": 6.0,
        "quality": {"status": "measured", "token_agreement": 0.9, "perplexity_fp16": 8.0, "perplexity_int4": 8.4},
    }
    dummy = {
        "method": "dummy",
        "settings": {"bits": 4, "group_size": 128, "desc_act": False},
        "quantize_s": 0.0,
        "quality": {"status": "not applicable: dummy weights are initialised by the engine"},
    }
    for model, report in (("big", made), ("small", dummy)):
        (tmp_path / model).mkdir()
        (tmp_path / model / "gptq-w4g128.json").write_text(json.dumps(report))
    q = quantization_frame(sorted(tmp_path.glob("*/*.json")))
    rows = {r["model"]: r for r in q.iter_rows(named=True)}
    assert rows["big"]["variant"] == "gptq-w4g128" and rows["big"]["quantize_s"] == 418.8
    assert rows["big"]["peak_gpu_gib"] == 6.0 and rows["big"]["device"] == "NVIDIA H200"
    assert rows["big"]["calibration"] == "128 x 512 tokens (random tokens of the vocabulary)"
    assert rows["small"]["method"] == "dummy" and rows["small"]["format"] == "gptq"
    assert rows["small"]["token_agreement"] is None and rows["small"]["calibration"] is None
    assert quantization_frame([]).columns == q.columns  # no report: the same columns, no rows


def test_the_tables_rule_reads_the_reports_behind_the_benchmarked_stacks():
    cfg = C.load()
    assert P.quantize_reports(cfg) == ["results/quantize/tiny/gptq-w4g128.json"]
    fp16_only = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"benchmark": {"stacks": ["vllm-fp16"]}}))
    assert P.quantize_reports(fp16_only) == []
