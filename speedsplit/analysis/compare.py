"""Two result sets side by side ("did the new vLLM, GPU or driver make it faster, and where?"):
for every stack and cell both measured, its throughput and latency on each side and the ratio
B / A; for every chain factor both sides defined, the factor on each side and its ratio B / A.
Values over runs are geometric means; intervals are 95% t over each side's runs apart
(speedsplit/analysis/run_estimates.py).
The two sides may come from different hardware: nothing is pooled, only ratios are taken.
"""

from __future__ import annotations

import polars as pl

from speedsplit.analysis import run_estimates as est
from speedsplit.analysis.chains import clean_runs

STACK_KEYS = ["model", "stack", "topology", "cell"]
# column: higher is better (a latency's ratio is B / A too: below 1 B is faster)
METRICS = {"output_tok_s": True, "ttft_s_median": False, "tpot_s_median": False, "e2e_s_p99": False}


def _clean(runs: pl.DataFrame, tolerate_flags) -> pl.DataFrame:
    return clean_runs(runs, tolerate_flags)[0] if runs.height else runs


def left_out(runs: pl.DataFrame, side: str, tolerate_flags=()) -> str | None:
    """The runs of a side no ratio uses, and why, in one line (None: every run counts)."""
    if not runs.height:
        return None
    why = []
    for (cell,), df in runs.group_by(["cell"], maintain_order=True):
        why += [f"{w.replace(' run', f' at {cell} run', 1)}" for w in clean_runs(df, tolerate_flags)[1]]
    return f"Left out on {side} ({len(why)}): {'; '.join(why)}" if why else None


def stacks_frame(a: pl.DataFrame, b: pl.DataFrame, tolerate_flags=()) -> pl.DataFrame:
    """One row per (model, stack, topology, cell, metric) both sides measured cleanly: the
    geometric mean over runs on each side and B / A with its interval."""
    ca, cb = _clean(a, tolerate_flags), _clean(b, tolerate_flags)
    rows = []
    for key, da in ca.group_by(STACK_KEYS, maintain_order=True):
        db = cb.filter(pl.all_horizontal([pl.col(k) == v for k, v in zip(STACK_KEYS, key)]))
        for metric in METRICS:
            va, vb = da[metric].drop_nulls().to_list(), db[metric].drop_nulls().to_list() if db.height else []
            if not va or not vb:
                continue
            e = est.ratio(va, vb)
            rows.append(
                {
                    **dict(zip(STACK_KEYS, key)),
                    "metric": metric,
                    "a": est.over_runs(va).value,
                    "b": est.over_runs(vb).value,
                    "b_over_a": e.value,
                    "lo": e.lo,
                    "hi": e.hi,
                    "runs_a": len(va),
                    "runs_b": len(vb),
                }
            )
    schema = {**{k: pl.Utf8 for k in STACK_KEYS}, "metric": pl.Utf8, "a": pl.Float64, "b": pl.Float64}
    schema |= {"b_over_a": pl.Float64, "lo": pl.Float64, "hi": pl.Float64, "runs_a": pl.Int64, "runs_b": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def factors_frame(a: pl.DataFrame, b: pl.DataFrame, chains: dict[str, list[str]], tolerate_flags=()) -> pl.DataFrame:
    """One row per (chain, model, topology, cell, factor) both sides can compute from clean
    runs of its two stacks: the factor on each side and B / A, (b_to / b_frm) / (a_to / a_frm)
    over the four run lists apart."""
    ca, cb = _clean(a, tolerate_flags), _clean(b, tolerate_flags)
    rows = []
    keys = ["model", "topology", "cell"]
    for key, da in ca.group_by(keys, maintain_order=True):
        db = cb.filter(pl.all_horizontal([pl.col(k) == v for k, v in zip(keys, key)]))
        for name, chain in chains.items():
            for frm, to in zip(chain, chain[1:]):
                t = {
                    (side, s): df.filter(pl.col("stack") == s)["output_tok_s"].drop_nulls().to_list()
                    for side, df in (("a", da), ("b", db))
                    for s in (frm, to)
                }
                if not all(t.values()):
                    continue
                fa, fb = est.ratio(t["a", frm], t["a", to]).value, est.ratio(t["b", frm], t["b", to]).value
                e = est.contrast(t, {("a", frm): 1.0, ("a", to): -1.0, ("b", frm): -1.0, ("b", to): 1.0})
                rows.append(
                    {
                        **dict(zip(keys, key)),
                        "chain": name,
                        "factor": f"{to}/{frm}",
                        "a": fa,
                        "b": fb,
                        "b_over_a": e.value,
                        "lo": e.lo,
                        "hi": e.hi,
                    }
                )
    schema = {**{k: pl.Utf8 for k in keys}, "chain": pl.Utf8, "factor": pl.Utf8}
    schema |= {"a": pl.Float64, "b": pl.Float64, "b_over_a": pl.Float64, "lo": pl.Float64, "hi": pl.Float64}
    return pl.DataFrame(rows, schema=schema).unique(subset=keys + ["factor"], keep="first", maintain_order=True)
