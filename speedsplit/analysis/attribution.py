"""Decompose an end-to-end speedup along a chain of stacks into factors that multiply exactly,
with 95% intervals (speedsplit/analysis/run_estimates.py), log shares, the runtime-share crossover
and cross-model spread.

Pure functions over plain numbers: a speed per stack and run (higher is faster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from speedsplit.analysis import run_estimates as est

# Below this |ln total| (a total within about 5% of 1) log shares divide by almost zero.
MIN_ABS_LOG_TOTAL = math.log(1.05)


@dataclass
class Factor:
    """The speedup from one stack to the next in a chain."""

    name: str  # "vllm-fp16/hf-fp16"
    frm: str
    to: str
    value: float | None  # with the client's calibrated offset taken out, where every run has one
    ci: tuple[float | None, float | None] = (None, None)
    share: float | None = None
    share_ci: tuple[float | None, float | None] = (None, None)
    runs: int = 0  # the fewer runs of its two stacks (paired: the pairs)
    raw: float | None = None  # as measured, the client's offset in it


@dataclass
class Attribution:
    """A chain's decomposition at one cell."""

    chain: list[str]
    factors: list[Factor]
    total: float | None
    total_ci: tuple[float | None, float | None] = (None, None)
    share_note: str = ""
    missing: dict[str, str] = field(default_factory=dict)
    pairs: list[int] | None = None  # paired: the run indices every stack measured cleanly
    total_raw: float | None = None  # as measured
    corrected: bool = False  # whether the values have the client's offset taken out


def _pct(samples: np.ndarray, level: float = est.LEVEL) -> tuple[float | None, float | None]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (None, None)
    lo, hi = np.percentile(samples, [50 * (1 - level), 100 - 50 * (1 - level)])
    return (float(lo), float(hi))


def log_shares(factors: list[float]) -> tuple[list[float | None], str]:
    """ln(f)/ln(total) per factor, or None everywhere with the reason when total is near 1."""
    total = math.prod(factors)
    if total <= 0 or abs(math.log(total)) < MIN_ABS_LOG_TOTAL:
        return [None] * len(factors), (
            f"total speedup {total:.3f} is within 5% of 1: log shares are undefined (they divide by ln(total) ~ 0)"
        )
    lt = math.log(total)
    return [math.log(f) / lt for f in factors], ""


def _clean(values) -> dict[int, float]:
    items = values.items() if isinstance(values, dict) else enumerate(values)
    return {int(r): float(v) for r, v in items if v is not None and v > 0}


def attribute(
    chain: list[str],
    speeds: dict[str, dict[int, float] | list[float]],
    missing: dict[str, str] | None = None,
    paired: bool = False,
    without_client: dict[str, dict[int, float] | list[float]] | None = None,
    seed: int = 0,
    corrected: dict[str, dict[int, float] | list[float]] | None = None,
) -> Attribution:
    """Factors between neighbours of `chain` from each stack's speed per run (by run index, or
    a list in run order).

    Each stack's value is the geometric mean of its runs, so factor i, value[i+1] / value[i],
    telescopes: the factors multiply exactly to value[last] / value[first]. Paired, every
    stack's value is taken over the runs all of them measured (an excluded run drops its
    pair) and each interval from the per-run ratios; unpaired, from each stack's runs apart.
    `corrected`, the same speeds with the client's offset taken out (its uncontended offset and
    what each run's records show it held: chains.client_free), makes the values where it covers
    every run of every stack (each factor's `raw` keeps the value as measured: on servers of
    known speed a true 5.0x read 4.946x raw, the fast stack's 0.17 s requests carrying the
    client's 1-2 ms). `without_client`, the speeds with the largest calibrated offset taken out,
    widens every interval to hold each stack's speed with and without it: the offset a run
    carries lies between none and the largest calibrated, and one stack's apart from the
    other's (on servers of known speed the client added 1.0 ms to one stack's end-to-end latency
    and 1.4 ms to another's, where 1.8 ms was calibrated: a factor's truth lay outside the
    interval of both sides shifted alike).
    """
    missing = dict(missing or {})
    values = {s: _clean(speeds.get(s, {})) for s in chain}
    for stack in chain:
        if not values[stack] and stack not in missing:
            missing[stack] = "no successful run"
    pairs = est.common_runs(values) if paired and not missing else None
    if paired and not missing and not pairs:
        missing = {s: "no run index every stack of the chain measured cleanly" for s in chain}
    if missing:
        # Each factor whose two stacks were measured keeps its value; the total and the shares
        # need every stack.
        factors = [
            Factor(f"{b}/{a}", a, b, None)
            if a in missing or b in missing
            else attribute(
                [a, b], speeds, paired=paired, without_client=without_client, seed=seed, corrected=corrected
            ).factors[0]
            for a, b in zip(chain, chain[1:])
        ]
        for f in factors:
            f.share, f.share_ci = None, (None, None)
        return Attribution(chain, factors, None, share_note="a stack of the chain has no clean run", missing=missing)
    if pairs is not None:
        values = {s: {r: v[r] for r in pairs} for s, v in values.items()}
    shifted = {s: _clean(without_client.get(s, {})) for s in chain} if without_client else None
    if pairs is not None and shifted:
        shifted = {s: {r: v[r] for r in pairs if r in v} for s, v in shifted.items()}
    freed = {s: _clean(corrected.get(s, {})) for s in chain} if corrected else None
    if pairs is not None and freed:
        freed = {s: {r: v[r] for r in pairs if r in v} for s, v in freed.items()}
    # corrected only where every run is: else the factors would not telescope
    correct = bool(freed) and all(set(freed[s]) == set(values[s]) for s in chain)
    centre = freed if correct else values

    def step(a: str, b: str) -> tuple[est.Estimate, float | None]:
        """The step's estimate (its value corrected where it can be) and its raw value."""
        weights = {a: -1.0, b: 1.0}
        raw = est.contrast(values, weights, paired)
        e = est.contrast(centre, weights, paired) if correct else raw
        if shifted and all(shifted[s] for s in (a, b)):
            # each side as measured or shifted, apart: the four corners (and the raw estimate,
            # where the value is corrected)
            corners = [{a: va, b: vb} for va in (values[a], shifted[a]) for vb in (values[b], shifted[b])]
            others = [est.contrast(c, weights, paired) for c in corners]
            e = est.hull(e, *(c for c in others if c.lo is not None))  # a corner on one run has none
        return e, raw.value

    steps = [step(a, b) for a, b in zip(chain, chain[1:])]
    whole, whole_raw = step(chain[0], chain[-1])
    shares, note = log_shares([e.value for e, _ in steps])
    draws = est.mean_log_draws(centre, paired, seed=seed)
    lt = draws[chain[-1]] - draws[chain[0]] if draws is not None else None  # each draw's log total
    factors = []
    for i, (a, b) in enumerate(zip(chain, chain[1:])):
        share_ci = (None, None)
        if shares[i] is not None and lt is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                boot = np.where(np.abs(lt) >= MIN_ABS_LOG_TOTAL, (draws[b] - draws[a]) / lt, np.nan)
            share_ci = _pct(boot)
        e, raw = steps[i]
        factors.append(Factor(f"{b}/{a}", a, b, e.value, e.interval, shares[i], share_ci, e.runs, raw))
    return Attribution(
        chain, factors, whole.value, whole.interval, note, pairs=pairs, total_raw=whole_raw, corrected=correct
    )


def crossover(users: list[int], shares: list[float | None], level: float = 0.5) -> float | None:
    """Users at which a share first crosses `level`, interpolated on log(users); None if never."""
    pts = sorted((u, s) for u, s in zip(users, shares) if s is not None)
    for (u1, s1), (u2, s2) in zip(pts, pts[1:]):
        if s1 == level:
            return float(u1)
        if (s1 - level) * (s2 - level) < 0:
            x1, x2 = math.log(u1), math.log(u2)
            return float(math.exp(x1 + (level - s1) * (x2 - x1) / (s2 - s1)))
    if pts and pts[-1][1] == level:
        return float(pts[-1][0])
    return None


def spread(values: list[float]) -> dict:
    """Cross-model stability of one factor: min, max and (max - min) / mean in percent."""
    v = [x for x in values if x is not None]
    if not v:
        return {"n": 0, "min": None, "max": None, "spread_pct": None}
    return {"n": len(v), "min": min(v), "max": max(v), "spread_pct": 100.0 * (max(v) - min(v)) / (sum(v) / len(v))}
