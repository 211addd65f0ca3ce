"""Values over repeated runs and their 95% intervals: the one estimator every table uses.

A value over runs is the geometric mean of the runs' values (the arithmetic mean where a value
is zero), so the factors of a chain multiply exactly to its total. Its interval is Student's t
across runs, on the log scale: it covers the spread between runs, each run one measurement
(its requests are not resampled; with two runs t has one degree of freedom, and the interval
is as wide as two runs warrant). A ratio, or any log-linear contrast of several stacks (a
factor, a total, a factorial effect), takes each side's runs apart (Welch-Satterthwaite
degrees of freedom) or, paired, the per-run contrasts of the run indices every side measured
(open loop: run r offers every stack the same arrivals, so its pairs share a schedule).
One run: no interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
N_DRAWS = 2000

Runs = Mapping[int, float] | Sequence[float]  # a stack's values by run index (or in run order)


@dataclass(frozen=True)
class Estimate:
    """A value over runs with its interval (None where there is none: one run)."""

    value: float | None
    lo: float | None = None
    hi: float | None = None
    runs: int = 0  # runs it rests on (paired: pairs)

    @property
    def interval(self) -> tuple[float | None, float | None]:
        return (self.lo, self.hi)


NONE = Estimate(None)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    tail = 0.5 * _ibeta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df (> 0, not necessarily whole) degrees of freedom."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _by_run(values: Runs) -> dict[int, float]:
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    return {int(r): float(v) for r, v in items if v is not None and math.isfinite(v)}


def _t_interval(centre: float, se: float, df: float) -> tuple[float, float]:
    if se == 0.0:
        return centre, centre
    half = t_quantile(0.5 + LEVEL / 2, df) * se
    return centre - half, centre + half


def geometric_mean(values) -> float:
    """exp(mean log value), exact where the values are all one value."""
    v = list(values)
    return v[0] if all(x == v[0] for x in v) else math.exp(math.fsum(math.log(x) for x in v) / len(v))


def over_runs(values: Runs) -> Estimate:
    """The geometric mean of a stack's runs (None skipped) and its 95% t interval on the log
    scale; where a value is not positive, the arithmetic mean and its t interval."""
    v = np.array(list(_by_run(values).values()))
    if v.size == 0:
        return NONE
    log = bool((v > 0).all())
    x = np.log(v) if log else v
    centre = float(x.mean())
    back = math.exp if log else float
    value = geometric_mean(v.tolist()) if log else float(v.mean())
    if v.size < 2:
        return Estimate(value, runs=1)
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return Estimate(value, value, value, int(v.size))
    lo, hi = _t_interval(centre, sd / math.sqrt(v.size), v.size - 1)
    return Estimate(value, back(lo), back(hi), int(v.size))


def common_runs(groups: Mapping[object, Runs]) -> list[int]:
    """The run indices every group measured, in order."""
    sets = [set(_by_run(v)) for v in groups.values()]
    return sorted(set.intersection(*sets)) if sets else []


def contrast(groups: Mapping[object, Runs], weights: Mapping[object, float], paired: bool = False) -> Estimate:
    """exp(sum of weight x mean log value) over the groups, with its 95% t interval: b / a is
    weights {a: -1, b: 1}. Unpaired: each group's runs apart, Welch-Satterthwaite degrees of
    freedom. Paired: the per-run contrasts over the runs every weighted group measured.
    None where a group has no positive value."""
    used = {k: _by_run(groups[k]) for k, w in weights.items() if w}
    if any(not v or min(v.values()) <= 0 for v in used.values()):
        return NONE
    if paired:
        runs = common_runs(used)
        if not runs:
            return NONE
        c = np.array([sum(w * math.log(used[k][r]) for k, w in weights.items() if w) for r in runs])
        value = math.prod(geometric_mean([used[k][r] for r in runs]) ** weights[k] for k in used)
        if c.size < 2:
            return Estimate(value, runs=1)
        sd = float(c.std(ddof=1))
        if sd == 0.0:
            return Estimate(value, value, value, int(c.size))
        lo, hi = _t_interval(float(c.mean()), sd / math.sqrt(c.size), c.size - 1)
        return Estimate(value, math.exp(lo), math.exp(hi), int(c.size))
    logs = {k: np.log(np.array(list(v.values()))) for k, v in used.items()}
    centre = sum(weights[k] * float(x.mean()) for k, x in logs.items())
    value = math.prod(geometric_mean(used[k].values()) ** weights[k] for k in used)
    fewest = min(x.size for x in logs.values())
    if fewest < 2:
        return Estimate(value, runs=fewest)
    parts = [weights[k] ** 2 * float(x.var(ddof=1)) / x.size for k, x in logs.items()]
    se2 = sum(parts)
    if se2 == 0.0:
        return Estimate(value, value, value, fewest)
    df = se2**2 / sum(p**2 / (x.size - 1) for p, x in zip(parts, logs.values()))
    lo, hi = _t_interval(centre, math.sqrt(se2), df)
    return Estimate(value, math.exp(lo), math.exp(hi), fewest)


def ratio(a: Runs, b: Runs, paired: bool = False) -> Estimate:
    """b / a over runs (see contrast)."""
    return contrast({"a": a, "b": b}, {"a": -1.0, "b": 1.0}, paired)


def hull(first: Estimate, *others: Estimate) -> Estimate:
    """first's value with an interval spanning every estimate's interval (where all have one):
    the same quantity estimated under assumptions that each may hold."""
    every = (first, *others)
    if any(e.lo is None or e.hi is None for e in every):
        return first
    return Estimate(first.value, min(e.lo for e in every), max(e.hi for e in every), first.runs)


def mean_log_draws(
    groups: Mapping[object, Runs], paired: bool = False, n: int = N_DRAWS, seed: int = 0
) -> dict[object, np.ndarray] | None:
    """Draws of each group's mean log value from its t sampling distribution (paired: jointly,
    over the common runs), for quantities that are not log-linear (log shares); None where a
    group has fewer than two runs."""
    rng = np.random.default_rng(seed)
    values = {k: _by_run(v) for k, v in groups.items()}
    if paired:
        runs = common_runs(values)
        if len(runs) < 2:
            return None
        x = np.log(np.array([[values[k][r] for k in values] for r in runs]))  # runs x groups
        dev = (x - x.mean(axis=0)) / math.sqrt(len(runs) * (len(runs) - 1))
        scale = np.sqrt((len(runs) - 1) / rng.chisquare(len(runs) - 1, size=(n, 1)))
        drawn = x.mean(axis=0) + (rng.standard_normal((n, len(runs))) @ dev) * scale
        return {k: drawn[:, j] for j, k in enumerate(values)}
    out = {}
    for k, v in values.items():
        x = np.log(np.array(list(v.values())))
        if x.size < 2:
            return None
        out[k] = x.mean() + x.std(ddof=1) / math.sqrt(x.size) * rng.standard_t(x.size - 1, size=n)
    return out
