"""Could a run's record have been measured at all? A number no measurement makes (negative or
not finite; a rate that does not fit the tokens in the wall time; a request longer than the
measured phase it lies in; more output than the client that measured it can read) marks a
record that was edited, corrupted or written by a bug. Such a run is flagged `implausible`,
the reasons said beside it, and counts in no factor: when it is measured (measuring/checks.py)
and again whenever results are aggregated, whoever wrote them (output/aggregate.py)."""

from __future__ import annotations

import math

from speedsplit.core.record import Distribution, RunResult

# Rates and counts agree to this share (a rate is written rounded; one token or request more).
AGREE = 0.01
# A run may be this much faster than the ceiling its host's client was calibrated at (the
# ceiling's load is fixed, 64 users by default, and a run of more users may read a little more).
OVER_CEILING = 1.5


def _numbers(res: RunResult) -> dict[str, float | None]:
    s = res.summary
    out = {
        "wall_s": s.wall_s,
        "output_tokens": s.output_tokens,
        "output_tok_s": s.output_tok_s,
        "request_s": s.request_s,
        "requests": s.requests,
        "completed": s.completed,
    }
    for name in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        dist: Distribution | None = getattr(s, name)
        for q in ("mean", "median", "p90", "p99"):
            out[f"{name}.{q}"] = getattr(dist, q) if dist else None
    return out


def reasons(res: RunResult) -> list[str]:
    """Why this ok run's numbers cannot be true (none: they can)."""
    s = res.summary
    if res.status != "ok" or s is None:
        return []
    bad = [k for k, v in _numbers(res).items() if v is not None and (not math.isfinite(v) or v < 0)]
    if bad:
        return [f"negative or not finite: {', '.join(bad)}"]  # the checks below would only repeat it
    out = []
    if s.completed > s.requests:
        out.append(f"{s.completed} requests completed of {s.requests} sent")
    for rate, count, unit in ((s.output_tok_s, s.output_tokens, "tokens"), (s.request_s, s.completed, "requests")):
        if rate is not None and abs(rate * s.wall_s - count) > AGREE * count + 1:
            out.append(
                f"{rate:.6g} {unit}/s over {s.wall_s:.6g} s is {rate * s.wall_s:.6g} {unit}, not the {count} counted"
            )
    e2e = s.e2e_s.p99 if s.e2e_s else None
    if e2e is not None and e2e > s.wall_s * (1 + AGREE) + 0.01:
        out.append(f"a request took {e2e:.6g} s (p99 E2E), longer than the {s.wall_s:.6g} s measured phase it lay in")
    ttft = s.ttft_s.p99 if s.ttft_s else None
    if ttft is not None and e2e is not None and ttft > e2e * (1 + AGREE) + 0.001:
        out.append(f"p99 TTFT {ttft:.6g} s is longer than p99 E2E {e2e:.6g} s")
    cal = res.calibration
    if cal and cal.ceiling_tok_s and s.output_tok_s and s.output_tok_s > OVER_CEILING * cal.ceiling_tok_s:
        out.append(
            f"{s.output_tok_s:.6g} tok/s is over {OVER_CEILING}x the {cal.ceiling_tok_s:.6g} tok/s its host's client "
            "can read (its calibrated ceiling)"
        )
    return out
