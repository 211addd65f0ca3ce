"""The chains as typed frames: which runs may make a factor, each chain's factors per cell
with 95% t intervals and log shares (from analysis/attribution.py's arithmetic), the
runtime-share crossover and the cross-model stability."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis import attribution as attr
from speedsplit.analysis.frames import CELL_KEYS, RUNS_SCHEMA, clean_runs, open_loop

# What a factor's interval covers, said in every factor table.
COVERS = "95% t over runs{pairing}{client}"


def covers(paired: bool, client: bool) -> str:
    """What a factor's interval covers, in words."""
    return COVERS.format(
        pairing=" (paired by run: each run index one arrival schedule)" if paired else "",
        client=", and the client's calibrated offset (the value has it taken out; raw_value as measured)"
        if client
        else " (no client calibration)",
    )


# The client's calibrated tail a p99 latency's bound takes out (where the calibration measured it).
TAIL_OFFSET = {"ttft_s": "client_ttft_p99_s", "tpot_s": "client_tpot_p99_s"}


def _offset(metric: str) -> str | None:
    """The calibrated client offset a latency metric carries (None: a rate)."""
    for prefix in ("ttft", "tpot", "itl", "e2e"):
        if metric.startswith(prefix):
            return f"{prefix}_s"
    return None


def client_free(row: dict, metric: str, bound: bool = False) -> float | None:
    """A run's value of a metric with the client's offset taken out (None: the run has no
    calibration, or no value). The value: a latency less the uncontended client's offset (the
    calibration's fewest users: every request carries at least that); a rate as if its wall had
    not held what the run's own records show the client held (client_wall_s) nor each request's
    uncontended end-to-end offset (a closed loop: each of a user's requests in turn; an open
    loop: the last answer's). bound: the largest offset calibrated, the far side of the
    interval: a latency less it, a closed-loop rate as if no request had waited on the client
    for the largest cycle (its end-to-end offset and the turn to the user's next request; the
    end-to-end offset alone in calibrations older than the cycle's), an open-loop rate as if
    its wall had not waited for the last answer's largest end-to-end offset. A p99's bound is the
    client's own tail where calibrated (its largest p99 offset): on servers of known speed a TPOT
    p99 of 10 ms read 0.031 ms late against a 0.013 ms median offset."""
    v = row[metric]
    if v is None:
        return None
    prefix = "client_" if bound else "client_least_"
    latency = _offset(metric)
    if latency is not None:
        offset = row.get(prefix + latency)
        tail = row.get(TAIL_OFFSET[latency]) if bound and metric.endswith("_p99") and latency in TAIL_OFFSET else None
        if offset is not None and tail is not None:
            offset = max(offset, tail)
        return None if offset is None else v - offset
    if metric.startswith("session"):  # a session's time: each of its turns a request's end-to-end offset
        offset = row.get(prefix + "e2e_s")
        return None if offset is None else v - offset * (row.get("session_turns") or 1)
    e2e, cycle, wall = row.get(prefix + "e2e_s"), row.get(prefix + "cycle_s"), row["wall_s"]
    if e2e is None or not wall:
        return None
    when_due = open_loop(row["load"])
    if not bound and row.get("client_wall_s") is not None:
        per_request = 1.0 if when_due else (row["completed"] or 0) / max(1, row["users"] or 1)
        return v / (1.0 - min(0.5, (row["client_wall_s"] + per_request * e2e) / wall))
    if when_due:
        return v / (1.0 - min(0.5, e2e / wall))
    cycle = cycle if cycle is not None else e2e
    if not row["e2e_s_median"]:
        return None
    # a user's period: its request and its thinking after it
    return v / (1.0 - min(0.5, cycle / (row["e2e_s_median"] + (row.get("think_s") or 0.0))))


def run_speeds(
    df: pl.DataFrame, metric: str, higher_is_better: bool = True, without_client: str | None = None
) -> dict[int, float]:
    """Each run's speed on a metric by run index: the value, or a latency's reciprocal (so a
    factor is a speedup either way); values of 0 or less left out (no ratio). without_client:
    with the client's offset taken out (client_free; runs without a calibration left out):
    "value" the uncontended client's and what the run's records show, "bound" the largest
    calibrated."""
    out = {}
    for row in df.iter_rows(named=True):
        v = row[metric]
        if v is None or v <= 0:
            continue
        if without_client:
            v = client_free(row, metric, bound=without_client == "bound")
            if v is None or v <= 0:
                continue
        out[int(row["run"])] = v if higher_is_better else 1.0 / v
    return out


def attribute_runs(
    chain: list[str],
    clean: dict[str, pl.DataFrame],
    metric: str,
    higher_is_better: bool,
    missing: dict[str, str],
    paired: bool,
) -> tuple[attr.Attribution, bool]:
    """A chain's factors on a metric from each stack's clean runs, and whether the client's
    offset was taken into them (every stack's runs calibrated): the values with it taken out,
    the intervals spanning none to the largest calibrated (attribution.attribute)."""
    speeds = {s: run_speeds(clean[s], metric, higher_is_better) for s in chain}
    bound = {s: run_speeds(clean[s], metric, higher_is_better, without_client="bound") for s in chain}
    client = all(bound.values())
    value = (
        {s: run_speeds(clean[s], metric, higher_is_better, without_client="value") for s in chain} if client else None
    )
    a = attr.attribute(
        chain, speeds, missing=missing, paired=paired, without_client=bound if client else None, corrected=value
    )
    return a, client


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
        paired = open_loop(base["load"])
        for chain_name, chain in chains.items():
            tp: dict[str, dict[int, float]] = {}
            clean_by: dict[str, pl.DataFrame] = {}
            missing: dict[str, str] = {}
            used: dict[str, int] = {}
            excluded: dict[str, list[str]] = {}
            for stack in chain:
                sdf = df.filter(pl.col("stack") == stack)
                clean, excluded[stack] = clean_runs(sdf, tolerate_flags)
                tp[stack], clean_by[stack] = run_speeds(clean, metric), clean
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
            a, client = attribute_runs(chain, clean_by, metric, True, missing, paired)
            notes = [a.share_note] + [f"{s}: {why}" for s, why in a.missing.items()]
            if a.pairs is not None and any(len(tp[s]) > len(a.pairs) for s in chain):
                notes.append(f"paired on runs {', '.join(map(str, a.pairs))} (the others lack a clean run of a stack)")
            note = "; ".join(n for n in notes if n)

            def counts(stacks: list[str]) -> dict:
                out = [w for s in stacks for w in excluded[s]]
                n = sum(len(a.pairs) if a.pairs is not None else used[s] for s in stacks)
                return {"runs_used": n, "runs_excluded": len(out), "excluded": out}

            for i, f in enumerate(a.factors):
                rows.append(
                    {
                        **base,
                        "chain": chain_name,
                        "position": i + 1,
                        "factor": f.name,
                        "value": f.value,
                        "raw_value": f.raw,
                        "lo": f.ci[0],
                        "hi": f.ci[1],
                        "log_share": f.share,
                        "share_lo": f.share_ci[0],
                        "share_hi": f.share_ci[1],
                        **counts([f.frm, f.to]),
                        "interval": covers(paired, client),
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
                    "raw_value": a.total_raw,
                    "lo": a.total_ci[0],
                    "hi": a.total_ci[1],
                    "log_share": 1.0 if a.total is not None and not a.share_note else None,
                    "share_lo": None,
                    "share_hi": None,
                    **counts(chain),
                    "interval": covers(paired, client),
                    "note": note,
                }
            )
    schema = {
        "excluded": pl.List(pl.Utf8),
        "value": pl.Float64,
        "raw_value": pl.Float64,
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
        return pl.DataFrame(schema={**fixed, **schema, "interval": pl.Utf8, "note": pl.Utf8})
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
