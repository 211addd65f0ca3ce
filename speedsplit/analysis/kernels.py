"""The INT4 kernel sweep: every GPTQ stack's throughput over the FP16 reference's at each cell
(the same checkpoint on another kernel is another stack), with the kernel its engine reported
and a bootstrap interval over both stacks' clean runs."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import polars as pl

from speedsplit.analysis import attribution as attr
from speedsplit.analysis.chains import clean_runs
from speedsplit.models.checkpoint import INT4_FORMATS

KEYS = ["model", "topology", "cell", "users", "workload", "sampling"]
SCHEMA = {
    **{k: pl.Utf8 for k in KEYS},
    "users": pl.Int64,
    "stack": pl.Utf8,
    "kernel": pl.Utf8,
    "output_tok_s": pl.Float64,
    "reference": pl.Utf8,
    "vs_reference": pl.Float64,
    "lo": pl.Float64,
    "hi": pl.Float64,
    "runs_used": pl.Int64,
}


def kernels_frame(
    runs: pl.DataFrame, reference: str, tolerate_flags: Collection[str] = (), seed: int = 0
) -> pl.DataFrame:
    """One row per (cell, GPTQ stack) where it and the reference have clean runs."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, df in runs.group_by(KEYS, maintain_order=True):
        ref, _ = clean_runs(df.filter(pl.col("stack") == reference), tolerate_flags)
        base = ref["output_tok_s"].drop_nulls().to_list()
        if not base:
            continue
        for (stack,), sdf in df.filter(pl.col("variant").is_in(INT4_FORMATS)).group_by(["stack"], maintain_order=True):
            clean, _ = clean_runs(sdf, tolerate_flags)
            tp = clean["output_tok_s"].drop_nulls().to_list()
            if not tp:
                continue
            ratio, lo, hi = attr.median_ratio(base, tp, rng)
            rows.append(
                {
                    **dict(zip(KEYS, key)),
                    "stack": stack,
                    "kernel": ", ".join(sorted({k for k in clean["linear_kernel"].to_list() if k})) or None,
                    "output_tok_s": float(np.median(tp)),
                    "reference": reference,
                    "vs_reference": ratio,
                    "lo": lo,
                    "hi": hi,
                    "runs_used": len(tp) + len(base),
                }
            )
    return pl.DataFrame(rows, schema=SCHEMA)
