"""The chains as typed frames: which runs may make a factor, each chain's factors per cell
with bootstrap intervals and log shares (from analysis/attribution.py's arithmetic), the
runtime-share crossover and the cross-model stability."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis import attribution as attr
from speedsplit.analysis.frames import CELL_KEYS, RUNS_SCHEMA


def clean_runs(df: pl.DataFrame, tolerate_flags: Collection[str] = ()) -> tuple[pl.DataFrame, list[str]]:
    """The runs that may make a factor (status ok, a throughput, no flag beyond the tolerated
    ones) and, for each other run, why it was left out ("vllm-marlin run1: kernel_mismatch")."""
    keep, why = [], []
    for row in df.iter_rows(named=True):
        flags = [f for f in row["flags"] if f not in tolerate_flags]
        if row["status"] != "ok" or row["output_tok_s"] is None:
            why.append(f"{row['stack']} run{row['run']}: {row['status']}")
        elif flags:
            why.append(f"{row['stack']} run{row['run']}: {'+'.join(flags)}")
        else:
            keep.append(True)
            continue
        keep.append(False)
    return df.filter(pl.Series(keep, dtype=pl.Boolean)), why


def attribution_frame(
    runs: pl.DataFrame, chains: dict[str, list[str]], tolerate_flags: Collection[str] = (), metric: str = "output_tok_s"
) -> pl.DataFrame:
    """One row per (chain, model, topology, cell, factor), plus a 'total' row per cell.

    Only clean runs count (see clean_runs); each row says how many runs it used, how many it
    left out and why. A factor without a clean run of both its stacks is undefined, with the
    reason in `note`.
    """
    rows = []
    keys = CELL_KEYS
    for group, df in runs.group_by(keys, maintain_order=True):
        base = dict(zip(keys, group))
        for chain_name, chain in chains.items():
            tp: dict[str, list[float]] = {}
            missing: dict[str, str] = {}
            used: dict[str, int] = {}
            excluded: dict[str, list[str]] = {}
            for stack in chain:
                sdf = df.filter(pl.col("stack") == stack)
                clean, excluded[stack] = clean_runs(sdf, tolerate_flags)
                tp[stack] = clean[metric].drop_nulls().to_list()
                used[stack] = len(tp[stack])
                if sdf.height == 0:
                    missing[stack] = "not measured"
                elif clean.height and not tp[stack]:
                    missing[stack] = f"no {metric} in its clean runs"
                elif not tp[stack]:
                    reasons = ", ".join(w.removeprefix(f"{stack} ") for w in excluded[stack])
                    missing[stack] = f"no clean run ({reasons})"
            if all(m == "not measured" for m in missing.values()) and len(missing) == len(chain):
                continue
            a = attr.attribute(chain, tp, missing=missing)
            note = (
                a.share_note
                + ("; " if a.share_note and a.missing else "")
                + ("; ".join(f"{s}: {why}" for s, why in a.missing.items()))
            )

            def counts(stacks: list[str]) -> dict:
                out = [w for s in stacks for w in excluded[s]]
                return {"runs_used": sum(used[s] for s in stacks), "runs_excluded": len(out), "excluded": out}

            for i, f in enumerate(a.factors):
                rows.append(
                    {
                        **base,
                        "chain": chain_name,
                        "position": i + 1,
                        "factor": f.name,
                        "value": f.value,
                        "lo": f.ci[0],
                        "hi": f.ci[1],
                        "log_share": f.share,
                        "share_lo": f.share_ci[0],
                        "share_hi": f.share_ci[1],
                        **counts([f.frm, f.to]),
                        "note": note,
                    }
                )
            rows.append(
                {
                    **base,
                    "chain": chain_name,
                    "position": 0,
                    "factor": "total",
                    "value": a.total,
                    "lo": a.total_ci[0],
                    "hi": a.total_ci[1],
                    "log_share": 1.0 if a.total is not None and not a.share_note else None,
                    "share_lo": None,
                    "share_hi": None,
                    **counts(chain),
                    "note": note,
                }
            )
    schema = {
        "excluded": pl.List(pl.Utf8),
        "value": pl.Float64,
        "lo": pl.Float64,
        "hi": pl.Float64,
        "log_share": pl.Float64,
        "share_lo": pl.Float64,
        "share_hi": pl.Float64,
        "runs_used": pl.Int64,
        "runs_excluded": pl.Int64,
    }
    if not rows:
        fixed = {**{k: RUNS_SCHEMA[k] for k in keys}, "chain": pl.Utf8, "position": pl.Int64, "factor": pl.Utf8}
        return pl.DataFrame(schema={**fixed, **schema, "note": pl.Utf8})
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def crossover_frame(attribution: pl.DataFrame) -> pl.DataFrame:
    """Per chain, model, topology, workload and sampling: users where factor 1's share crosses 50%."""
    rows = []
    first = attribution.filter(pl.col("position") == 1)
    for group, df in first.group_by(
        ["chain", "model", "topology", "workload", "sampling", "factor"], maintain_order=True
    ):
        df = df.sort("users")
        u = attr.crossover(df["users"].to_list(), df["log_share"].to_list())
        rows.append(
            {
                **dict(zip(["chain", "model", "topology", "workload", "sampling", "factor"], group)),
                "users_min": df["users"].min(),
                "users_max": df["users"].max(),
                "crossover_users": u,  # null: the share does not cross 50% in the measured range
            }
        )
    return pl.DataFrame(rows, schema_overrides={"crossover_users": pl.Float64}, infer_schema_length=None)


def stability_frame(attribution: pl.DataFrame) -> pl.DataFrame:
    """Spread of each factor across models at the same chain, topology and cell."""
    rows = []
    for group, df in attribution.group_by(["chain", "topology", "cell", "factor"], maintain_order=True):
        s = attr.spread(df["value"].to_list())
        rows.append(
            {
                **dict(zip(["chain", "topology", "cell", "factor"], group)),
                "models": df["model"].to_list(),
                **s,
            }
        )
    return pl.DataFrame(
        rows,
        schema_overrides={"min": pl.Float64, "max": pl.Float64, "spread_pct": pl.Float64},
        infer_schema_length=None,
    )
