"""Decompose an end-to-end speedup along a chain of stacks into factors that multiply exactly,
with bootstrap intervals, log shares, the runtime-share crossover and cross-model spread.

Pure functions over plain numbers: throughputs per stack, one value per run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Below this |ln total| (a total within about 5% of 1) log shares divide by almost zero.
MIN_ABS_LOG_TOTAL = math.log(1.05)
N_BOOT = 2000


@dataclass
class Factor:
    """The speedup from one stack to the next in a chain."""

    name: str  # "vllm-fp16/hf-fp16"
    frm: str
    to: str
    value: float | None
    ci: tuple[float | None, float | None] = (None, None)
    share: float | None = None
    share_ci: tuple[float | None, float | None] = (None, None)


@dataclass
class Attribution:
    """A chain's decomposition at one cell."""

    chain: list[str]
    factors: list[Factor]
    total: float | None
    total_ci: tuple[float | None, float | None] = (None, None)
    share_note: str = ""
    missing: dict[str, str] = field(default_factory=dict)


def _median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def _pct(samples: np.ndarray, level: float = 0.95) -> tuple[float | None, float | None]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (None, None)
    lo, hi = np.percentile(samples, [50 * (1 - level), 100 - 50 * (1 - level)])
    return (float(lo), float(hi))


def bootstrap_medians(values, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of n_boot resamples (with replacement) of values: the one bootstrap of the
    analysis, for cell intervals and for factors alike."""
    v = np.asarray(values, dtype=float)
    return np.median(v[rng.integers(0, v.size, size=(n_boot, v.size))], axis=1)


def median_ratio(a, b, rng: np.random.Generator, n_boot: int = N_BOOT) -> tuple[float, float | None, float | None]:
    """median(b) / median(a) with its 95% bootstrap interval (runs resampled within each side):
    two result sets compared, or a stack set against a reference."""
    boot = bootstrap_medians(b, n_boot, rng) / bootstrap_medians(a, n_boot, rng)
    return float(np.median(b) / np.median(a)), *_pct(boot)


def median_ci(values, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """Median of values (None skipped) with its 95% bootstrap interval; Nones if empty."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None, None
    lo, hi = _pct(bootstrap_medians(v, n_boot, np.random.default_rng(seed)))
    return _median(v), lo, hi


def log_shares(factors: list[float]) -> tuple[list[float | None], str]:
    """ln(f)/ln(total) per factor, or None everywhere with the reason when total is near 1."""
    total = math.prod(factors)
    if total <= 0 or abs(math.log(total)) < MIN_ABS_LOG_TOTAL:
        return [None] * len(factors), (
            f"total speedup {total:.3f} is within 5% of 1: log shares are undefined (they divide by ln(total) ~ 0)"
        )
    lt = math.log(total)
    return [math.log(f) / lt for f in factors], ""


def attribute(
    chain: list[str],
    throughput: dict[str, list[float]],
    n_boot: int = N_BOOT,
    seed: int = 0,
    missing: dict[str, str] | None = None,
) -> Attribution:
    """Factors between neighbours of `chain` from per-run throughputs of each stack.

    Factor i is median(T[i+1]) / median(T[i]), so the factors telescope and their product is
    exactly median(T[last]) / median(T[first]). Intervals resample runs within each stack.
    """
    missing = dict(missing or {})
    for stack in chain:
        runs = [t for t in throughput.get(stack, []) if t is not None and t > 0]
        if not runs and stack not in missing:
            missing[stack] = "no successful run"
    if missing:
        # Each factor whose two stacks were measured keeps its value; the total and the shares
        # need every stack.
        factors = [
            Factor(f"{b}/{a}", a, b, None)
            if a in missing or b in missing
            else attribute([a, b], throughput, n_boot, seed).factors[0]
            for a, b in zip(chain, chain[1:])
        ]
        for f in factors:
            f.share, f.share_ci = None, (None, None)
        return Attribution(chain, factors, None, share_note="a stack of the chain has no clean run", missing=missing)
    med = [_median(throughput[s]) for s in chain]
    values = [med[i + 1] / med[i] for i in range(len(chain) - 1)]
    shares, note = log_shares(values)
    total = med[-1] / med[0]

    rng = np.random.default_rng(seed)
    boot_med = np.empty((n_boot, len(chain)))
    for j, stack in enumerate(chain):
        boot_med[:, j] = bootstrap_medians(throughput[stack], n_boot, rng)
    boot_f = boot_med[:, 1:] / boot_med[:, :-1]
    boot_total = boot_med[:, -1] / boot_med[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        lt = np.log(boot_total)
        defined = np.abs(lt) >= MIN_ABS_LOG_TOTAL
        boot_share = np.where(defined[:, None], np.log(boot_f) / lt[:, None], np.nan)

    factors = []
    for i, (a, b) in enumerate(zip(chain, chain[1:])):
        factors.append(
            Factor(
                name=f"{b}/{a}",
                frm=a,
                to=b,
                value=values[i],
                ci=_pct(boot_f[:, i]),
                share=shares[i],
                share_ci=_pct(boot_share[:, i]) if shares[i] is not None else (None, None),
            )
        )
    return Attribution(chain, factors, total, _pct(boot_total), note)


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
