"""The decomposition under traffic: at an open-loop cell (requests arriving at a rate, or a
replayed trace) every stack meets the same requests at the same times, so what differs is how
well it serves them. Throughput there mostly follows the offered rate; goodput and latency
are what part ways. Each chain's factors are computed for each of those metrics, as speedups:
a higher-is-better metric (goodput, throughput) as new / old, a latency as old / new (per run
the reciprocal, so the factors still multiply exactly to the total). Above 1 the later stack
is faster on that metric.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis.chains import attribute_runs, clean_runs, covers, run_speeds
from speedsplit.analysis.frames import OPEN_LOOP

# column: (label, higher is better)
METRICS = {
    "goodput_rps": ("goodput", True),
    "output_tok_s": ("throughput", True),
    "ttft_s_median": ("TTFT p50", False),
    "ttft_s_p99": ("TTFT p99", False),
    "tpot_s_median": ("TPOT p50", False),
    "tpot_s_p99": ("TPOT p99", False),
    "e2e_s_median": ("E2E p50", False),
    # sessions only (a metric no run of a cell has is left out of its factors)
    "ttft_first_s_median": ("first-turn TTFT p50", False),
    "ttft_return_s_median": ("returning-turn TTFT p50", False),
    "session_s_median": ("session p50", False),
}
SESSION_METRICS = ("ttft_first_s_median", "ttft_return_s_median", "session_s_median")
KEYS = ["model", "topology", "cell", "workload", "sampling", "load"]

FACTORS_SCHEMA = {
    **{k: pl.Utf8 for k in KEYS},
    "rate_rps": pl.Float64,
    "chain": pl.Utf8,
    "position": pl.Int64,
    "factor": pl.Utf8,
    "step": pl.Utf8,
    "metric": pl.Utf8,
    "value": pl.Float64,  # the client's calibrated offset taken out where every run has one
    "raw_value": pl.Float64,  # as measured
    "lo": pl.Float64,
    "hi": pl.Float64,
    "verdict": pl.Utf8,
    "runs_used": pl.Int64,
    "interval": pl.Utf8,
    "note": pl.Utf8,
}
STACKS_COLUMNS = [
    "model", "topology", "cell", "workload", "sampling", "rate_rps", "stack", "runs_ok", "offered_rps",
    "output_tok_s", "goodput_rps", "slo_met", "ttft_s_median", "ttft_s_p99", "tpot_s_median", "tpot_s_p99",
    "e2e_s_median", "ttft_first_s_median", "ttft_return_s_median", "session_s_median", "prefix_cache_hit_rate",
    "offload_hit_rate", "kv_cache_peak", "preemptions", "failed_requests", "flags",
]  # fmt: skip


# The interval holds 1: the runs do not show which way the step goes (said in every answer).
NO_DIFFERENCE = "no difference shown"


def verdict(value: float | None, lo: float | None, hi: float | None) -> str:
    """Which way is faster, as far as the interval shows (with one run of a stack, or one pair,
    there is no interval to show it)."""
    if value is None:
        return "undefined"
    if lo is None or hi is None:
        return ("faster" if value > 1 else "slower" if value < 1 else "the same") + " (one run: no interval)"
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return f"{NO_DIFFERENCE} (the interval holds 1)"


def stacks_frame(cells: pl.DataFrame) -> pl.DataFrame:
    """Each stack at each open-loop cell: the rate offered, what it served, its latency, its
    prefix-cache hit rate (geometric means over runs, as cells_frame gives them; the hit rate and
    other telemetry, medians)."""
    return cells.filter(OPEN_LOOP).select([c for c in STACKS_COLUMNS if c in cells.columns])


def factors_frame(
    runs: pl.DataFrame,
    chains: dict[str, list[str]],
    steps: dict[str, list[str]] | None = None,
    tolerate_flags: Collection[str] = (),
) -> pl.DataFrame:
    """One row per (chain, open-loop cell, metric, factor), plus a 'total' row each: the
    factor as a speedup with its 95% t interval (paired by run), and which way it goes."""
    steps = steps or {}
    rows = []
    for key, df in runs.filter(OPEN_LOOP).group_by(KEYS, maintain_order=True):
        base = {**dict(zip(KEYS, key)), "rate_rps": df["rate_rps"][0]}
        for chain_name, chain in chains.items():
            clean = {s: clean_runs(df.filter(pl.col("stack") == s), tolerate_flags) for s in chain}
            if all(c.height == 0 and not why for c, why in clean.values()):
                continue  # no stack of this chain measured the cell
            for metric, (label, higher) in METRICS.items():
                if metric in SESSION_METRICS and df[metric].drop_nulls().len() == 0:
                    continue  # not a sessions cell
                speed, missing = {}, {}
                for s, (c, why) in clean.items():
                    speed[s] = run_speeds(c, metric, higher)
                    if not speed[s]:
                        missing[s] = _why_none(c, why, metric, label)
                a, client = attribute_runs(chain, {s: c for s, (c, _) in clean.items()}, metric, higher, missing, True)
                notes = [f"{s}: {w}" for s, w in a.missing.items()]
                if a.pairs is not None and any(len(v) > len(a.pairs) for v in speed.values()):
                    notes.append(
                        f"paired on runs {', '.join(map(str, a.pairs))} (the others lack a clean run of a stack)"
                    )
                note = "; ".join(notes)
                named = steps.get(chain_name) or []
                pairs = len(a.pairs) if a.pairs is not None else None
                for i, f in enumerate(a.factors):
                    rows.append(
                        {
                            **base,
                            "chain": chain_name,
                            "position": i + 1,
                            "factor": f.name,
                            "step": named[i] if i < len(named) else "",
                            "metric": label,
                            "value": f.value,
                            "raw_value": f.raw,
                            "lo": f.ci[0],
                            "hi": f.ci[1],
                            "verdict": verdict(f.value, *f.ci),
                            "runs_used": 2 * pairs if pairs is not None else len(speed[f.frm]) + len(speed[f.to]),
                            "interval": covers(True, client),
                            "note": note,
                        }
                    )
                rows.append(
                    {
                        **base,
                        "chain": chain_name,
                        "position": 0,
                        "factor": "total",
                        "step": "total",
                        "metric": label,
                        "value": a.total,
                        "raw_value": a.total_raw,
                        "lo": a.total_ci[0],
                        "hi": a.total_ci[1],
                        "verdict": verdict(a.total, *a.total_ci),
                        "runs_used": len(chain) * pairs if pairs is not None else sum(len(v) for v in speed.values()),
                        "interval": covers(True, client),
                        "note": note,
                    }
                )
    return pl.DataFrame(rows, schema=FACTORS_SCHEMA)


def _why_none(clean: pl.DataFrame, excluded: list[str], metric: str, label: str) -> str:
    """Why a stack has no value of a metric at a cell, in words."""
    if clean.height == 0:
        reasons = ", ".join(w.split(" ", 1)[1] for w in excluded)
        return f"no clean run ({reasons})" if excluded else "not measured"
    if metric == "goodput_rps" and clean[metric].drop_nulls().len() and not any(clean[metric].drop_nulls()):  # all 0
        return "goodput 0: no request met the objectives, the factor is unbounded"
    return f"no {label} in its clean runs"
