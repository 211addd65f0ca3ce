"""The confounds of an "operational" speedup, separated (config `factorial`).

The study's operational number set vLLM (64 users, greedy) against an HF baseline capped at
a batch of 8 and sampling ancestrally: a runtime swap, a batch-ceiling change and a sampling
change in one ratio. Here the runtime factor R(c, s) = fast stack / HF reference, at one
users x workload, is measured at two batch ceilings c of the reference (two stacks: `low`,
`high`) and two sampling modes s (`matched`, the first; `other`, the second). With
L(c, s) = ln R(c, s), the 2x2 design's effects on the log scale (each a difference of
means, so a main effect is the average change over the other factor's two levels):

    ceiling     = [L(low, m) + L(low, o) - L(high, m) - L(high, o)] / 2
    sampling    = [L(low, o) + L(high, o) - L(low, m) - L(high, m)] / 2
    interaction =  L(low, o) - L(high, o) - L(low, m) + L(high, m)

and the operational number telescopes exactly into the matched one and two confounds:

    fast(m) / low(o) = [fast(m) / high(m)] x [high(m) / low(m)] x [low(m) / low(o)]
     operational     =      matched       x   batch ceiling   x      sampling

Values are over each group's runs (geometric means); intervals 95% t over each (stack,
sampling) group's runs apart (speedsplit/analysis/run_estimates.py: a log-linear contrast).
"""

from __future__ import annotations

import math
from collections.abc import Collection

import polars as pl

from speedsplit.analysis import run_estimates as est
from speedsplit.analysis.chains import clean_runs

FACTORIAL_SCHEMA = {
    "users": pl.Int64,
    "workload": pl.Utf8,
    "kind": pl.Utf8,  # runtime_factor | effect | decomposition
    "name": pl.Utf8,
    "value": pl.Float64,  # a factor (effects: exp of the log effect)
    "lo": pl.Float64,
    "hi": pl.Float64,
    "log_value": pl.Float64,
    "note": pl.Utf8,
}


def _groups(runs: pl.DataFrame, spec: dict, tolerate_flags: Collection[str]) -> tuple[dict, list[str]]:
    """Per-run throughputs of each (role, sampling) group, and what is missing."""
    cell = runs.filter((pl.col("users") == spec["users"]) & (pl.col("workload") == spec["workload"]))
    ok, _ = clean_runs(cell, tolerate_flags)
    roles = {"fast": spec["fast"], "low": spec["low"], "high": spec["high"]}
    groups, missing = {}, []
    for role, stack in roles.items():
        for s in spec["sampling"]:
            values = ok.filter((pl.col("stack") == stack) & (pl.col("sampling") == s))["output_tok_s"].to_list()
            groups[(role, s)] = values
            if not values:
                missing.append(f"{stack} at {s}: no clean run")
    return groups, missing


def _statistics(ln: dict, m: str, o: str) -> dict[str, float]:
    """Every reported quantity, on the log scale, from each group's log throughput: each one a
    linear combination of them."""

    def L(c: str, s: str) -> float:
        return ln[("fast", s)] - ln[(c, s)]

    return {
        f"R(low, {m})": L("low", m),
        f"R(high, {m})": L("high", m),
        f"R(low, {o})": L("low", o),
        f"R(high, {o})": L("high", o),
        "ceiling": (L("low", m) + L("low", o) - L("high", m) - L("high", o)) / 2,
        "sampling": (L("low", o) + L("high", o) - L("low", m) - L("high", m)) / 2,
        "interaction": L("low", o) - L("high", o) - L("low", m) + L("high", m),
        "operational": ln[("fast", m)] - ln[("low", o)],
        "matched": L("high", m),
        "batch ceiling": ln[("high", m)] - ln[("low", m)],
        "sampling (HF, low ceiling)": ln[("low", m)] - ln[("low", o)],
    }


KINDS = {
    "R": "runtime_factor",
    "ceiling": "effect",
    "sampling": "effect",
    "interaction": "effect",
    "operational": "decomposition",
    "matched": "decomposition",
    "batch ceiling": "decomposition",
    "sampling (HF, low ceiling)": "decomposition",
}


def factorial_frame(runs: pl.DataFrame, spec: dict, tolerate_flags: Collection[str] = ()) -> pl.DataFrame:
    """The runtime factors, effects and decomposition of the config's `factorial` section."""
    m, o = spec["sampling"]
    groups, missing = _groups(runs, spec, tolerate_flags)
    base = {"users": spec["users"], "workload": spec["workload"]}
    if missing:
        return pl.DataFrame(
            [{**base, "kind": "undefined", "name": "factorial", "note": "; ".join(missing)}], schema=FACTORIAL_SCHEMA
        )
    # each quantity's weight on each group's mean log throughput (they are linear in them): the
    # quantities of each group's indicator, once per group
    basis = {g: _statistics({k: float(k == g) for k in groups}, m, o) for g in groups}
    names = list(next(iter(basis.values())))
    weights = {n: {g: basis[g][n] for g in groups} for n in names}
    rows = []
    for name in names:
        e = est.contrast(groups, weights[name])
        rows.append(
            {
                **base,
                "kind": KINDS["R"] if name.startswith("R(") else KINDS[name],
                "name": name,
                "value": e.value,
                "lo": e.lo,
                "hi": e.hi,
                "log_value": math.log(e.value),
                "note": "" if e.lo is not None else "a group has one run: no interval",
            }
        )
    return pl.DataFrame(rows, schema=FACTORIAL_SCHEMA)
