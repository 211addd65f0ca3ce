"""How each INT4 checkpoint was made (the quantize rule's reports, results/quantize/{model}/{variant}.json):
by whom (GPTQModel, adopted from a folder, or engine-initialised), with what settings, how long it
took and how much card memory, and its quality against the FP16 model."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

SCHEMA = {
    "model": pl.String,
    "variant": pl.String,
    "method": pl.String,
    "format": pl.String,
    "bits": pl.Int64,
    "group_size": pl.Int64,
    "desc_act": pl.Boolean,
    "calibration": pl.String,
    "device": pl.String,
    "quantize_s": pl.Float64,
    "peak_gpu_gib": pl.Float64,
    "quality": pl.String,
    "token_agreement": pl.Float64,
    "perplexity_fp16": pl.Float64,
    "perplexity_int4": pl.Float64,
}


def quantization_frame(paths: list[str | Path]) -> pl.DataFrame:
    """One row per report; the model and variant are its path's last two parts."""
    rows = []
    for path in sorted(Path(p) for p in paths):
        r = json.loads(path.read_text())
        s, q = r.get("settings", {}), r.get("quality", {})
        calibration = (
            f"{s['calibration_samples']} x {s['calibration_tokens']} tokens ({s.get('calibration_source', '')})"
            if r.get("method") == "gptqmodel"
            else None
        )
        rows.append(
            {
                "model": path.parent.name,
                "variant": path.stem,
                "method": r.get("method"),
                "format": r.get("format", "gptq"),
                "bits": s.get("bits"),
                "group_size": s.get("group_size"),
                "desc_act": s.get("desc_act"),
                "calibration": calibration,
                "device": r.get("device"),
                "quantize_s": r.get("quantize_s"),
                "peak_gpu_gib": r.get("peak_gpu_gib"),
                "quality": q.get("status"),
                "token_agreement": q.get("token_agreement"),
                "perplexity_fp16": q.get("perplexity_fp16"),
                "perplexity_int4": q.get("perplexity_int4"),
            }
        )
    return pl.DataFrame(rows, schema=SCHEMA)
