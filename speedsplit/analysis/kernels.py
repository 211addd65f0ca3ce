"""The INT4 kernel sweep: every GPTQ stack's throughput over the FP16 reference's at each cell
(the same checkpoint on another kernel is another stack), with the kernel its engine reported
and a 95% t interval over both stacks' clean runs (speedsplit/analysis/run_estimates.py)."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis import run_estimates as est
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


def kernels_frame(runs: pl.DataFrame, reference: str, tolerate_flags: Collection[str] = ()) -> pl.DataFrame:
    """One row per (cell, GPTQ stack) where it and the reference have clean runs."""
    rows = []
    for key, df in runs.group_by(KEYS, maintain_order=True):
        ref, _ = clean_runs(df.filter(pl.col("stack") == reference), tolerate_flags)
        base = dict(zip(ref["run"], ref["output_tok_s"])) if ref.height else {}
        if not base:
            continue
        for (stack,), sdf in df.filter(pl.col("variant").is_in(INT4_FORMATS)).group_by(["stack"], maintain_order=True):
            clean, _ = clean_runs(sdf, tolerate_flags)
            tp = {r: v for r, v in zip(clean["run"], clean["output_tok_s"]) if v is not None}
            if not tp:
                continue
            e = est.ratio(base, tp)
            rows.append(
                {
                    **dict(zip(KEYS, key)),
                    "stack": stack,
                    "kernel": ", ".join(sorted({k for k in clean["linear_kernel"].to_list() if k})) or None,
                    "output_tok_s": est.over_runs(tp).value,
                    "reference": reference,
                    "vs_reference": e.value,
                    "lo": e.lo,
                    "hi": e.hi,
                    "runs_used": len(tp) + len(base),
                }
            )
    return pl.DataFrame(rows, schema=SCHEMA)
