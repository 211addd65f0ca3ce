"""The capacity sweep: per stack, the largest ladder level that met the objectives with no
failed request (its sustainable users, or rate for an open-loop ladder), the first level that did not and why, the levels
skipped past the cliff, and the ratio to a reference stack's capacity (e.g. INT4 over FP16);
with the memory it ran under and what its server was doing at the cliff.
"""

from __future__ import annotations

import polars as pl

from speedsplit.probes import slo

KEYS = ["model", "stack", "topology"]
SCHEMA = {
    "model": pl.Utf8,
    "stack": pl.Utf8,
    "topology": pl.Utf8,
    "workload": pl.Utf8,
    "sampling": pl.Utf8,
    "levels": pl.List(pl.Utf8),
    "sustainable_users": pl.Int64,
    "first_failing_users": pl.Int64,
    "sustainable_rps": pl.Float64,  # a ladder of rates (open loop): the largest passing rate
    "first_failing_rps": pl.Float64,
    "first_failing_why": pl.Utf8,
    "passing_users": pl.List(pl.Int64),
    "failing_users": pl.List(pl.Int64),
    "skipped_users": pl.List(pl.Int64),
    "passing_rps": pl.List(pl.Float64),
    "failing_rps": pl.List(pl.Float64),
    "skipped_rps": pl.List(pl.Float64),
    "card_memory_gib": pl.Float64,
    "kv_cache_gib": pl.Float64,
    "kv_cache_tokens": pl.Int64,
    "kv_cache_fit_gib": pl.Float64,
    "card_memory_peak_gib": pl.Float64,
    "kv_cache_peak_at_cliff": pl.Float64,
    "waiting_mean_at_cliff": pl.Float64,
    "preemptions_at_cliff": pl.Float64,
    "failed_requests_at_cliff": pl.Int64,
    "reference": pl.Utf8,
    "vs_reference": pl.Float64,
}


def card_memory_peak(runs: pl.DataFrame) -> float | None:
    """The most memory any one card of these runs held (NVML, every process on it), in GiB."""
    return (runs["gpu_memory_peak_gib"] / runs["devices"].list.len()).max()


def level_verdicts(df: pl.DataFrame) -> str | None:
    """Why one level (all its runs) failed, or None when every run passed."""
    why = [
        slo.level_failure(r["status"], r["slo_met"], r["slo_violations"], r["flags"]) for r in df.iter_rows(named=True)
    ]
    return " | ".join(dict.fromkeys(w for w in why if w)) or None


def capacity_frame(runs: pl.DataFrame, spec: dict) -> pl.DataFrame:
    """One row per (model, stack, topology) that measured the ladder: of users (closed loop), or
    of request rates (`spec["rates"]`, an open-loop workload)."""
    by_rate = bool(spec.get("rates"))
    level_col, unit = ("rate_rps", " rps") if by_rate else ("users", "")
    ladder = runs.filter(
        (pl.col("workload") == spec["workload"])
        & (pl.col("sampling") == spec["sampling"])
        & pl.col(level_col).is_in([float(r) for r in spec["rates"]] if by_rate else list(spec["users"]))
        # the sweeping stacks only: another stack that measured a grid cell on the ladder did not sweep
        & (pl.col("stack").is_in(list(spec["stacks"])) if spec.get("stacks") else pl.lit(True))
    )
    rows = []
    for key, df in ladder.group_by(KEYS, maintain_order=True):
        levels, passing, failing, skipped = [], [], [], []
        for (at,), level in df.sort(level_col).group_by([level_col], maintain_order=True):
            verdict = level_verdicts(level)
            levels.append(f"{at:g}{unit}: {'pass' if verdict is None else verdict}")
            if verdict is None:
                passing.append(at)
            elif set(level["status"].to_list()) == {"skipped"}:
                skipped.append(at)
            else:
                failing.append((at, verdict))
        first = min(failing) if failing else None
        cliff = df.filter(pl.col(level_col) == first[0]) if first else df.clear()
        top, cut = (max(passing) if passing else None), (first[0] if first else None)
        rows.append(
            {
                **dict(zip(KEYS, key)),
                "workload": spec["workload"],
                "sampling": spec["sampling"],
                "levels": levels,
                "sustainable_users": None if by_rate else top,
                "first_failing_users": None if by_rate else cut,
                "sustainable_rps": top if by_rate else None,
                "first_failing_rps": cut if by_rate else None,
                "first_failing_why": first[1] if first else None,
                "passing_users": [] if by_rate else passing,
                "failing_users": [] if by_rate else [u for u, _ in failing],
                "skipped_users": [] if by_rate else skipped,
                "passing_rps": passing if by_rate else [],
                "failing_rps": [r for r, _ in failing] if by_rate else [],
                "skipped_rps": skipped if by_rate else [],
                "card_memory_gib": df["card_memory_gib"].max(),
                "kv_cache_gib": df["kv_cache_gib"].min(),
                "kv_cache_tokens": df["kv_cache_tokens"].min(),
                "kv_cache_fit_gib": df["kv_cache_fit_gib"].min(),
                "card_memory_peak_gib": card_memory_peak(df),
                "kv_cache_peak_at_cliff": cliff["kv_cache_peak"].max(),
                "waiting_mean_at_cliff": cliff["waiting_mean"].max(),
                "preemptions_at_cliff": cliff["preemptions"].max(),
                "failed_requests_at_cliff": int(cliff["failed"].sum()) if first else None,
            }
        )
    out = pl.DataFrame(rows, schema={k: v for k, v in SCHEMA.items() if k not in ("reference", "vs_reference")})
    top = "sustainable_rps" if by_rate else "sustainable_users"
    ref = out.filter(pl.col("stack") == spec.get("reference")).select("model", "topology", top)
    return (
        out.join(ref.rename({top: "_ref"}), on=["model", "topology"], how="left")
        .with_columns(
            pl.lit(spec.get("reference"), dtype=pl.Utf8).alias("reference"),
            (pl.col(top) / pl.col("_ref")).alias("vs_reference"),
        )
        .drop("_ref")
        .select(list(SCHEMA))
    )
