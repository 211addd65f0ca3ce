"""Latency objectives: whether a run met them, and its goodput (requests that met them per
second). Defaults from MLPerf Inference's Llama-3.1-8B server scenario: p99 TTFT at most 2 s,
p99 TPOT at most 100 ms, and no failed request.
"""

from __future__ import annotations

from speedsplit.core.record import Slo, Summary
from speedsplit.core.requestlog import RequestRecord


def tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first: (last token - first token) / (output tokens - 1),
    the last token's time from the gaps between chunks (the stream's end comes after it: its
    closing usage chunk took ~0.5 ms more here, 3% of a 4-token answer's TPOT at 10 ms a token).
    Records without gaps (from before they were kept) use the stream's end."""
    if r.first_token is None or r.end is None or not r.output_tokens or r.output_tokens < 2:
        return None
    last = r.first_token + sum(r.gaps) if r.gaps else r.end
    return (last - r.first_token) / (r.output_tokens - 1)


def assess(records: list[RequestRecord], summary: Summary, ttft_p99_s: float, tpot_p99_s: float) -> Slo:
    """The measured phase against the objectives: met when no request failed and the p99s
    hold; `violations` says which did not, in words. A request is good when it completed
    with its own TTFT and TPOT within the objectives; goodput = good requests / wall time."""
    measured = [r for r in records if r.phase == "measured"]
    good = 0
    for r in measured:
        t = tpot(r)
        if (
            r.ok
            and r.first_token is not None
            and r.first_token - r.sent <= ttft_p99_s
            and (t is None or t <= tpot_p99_s)
        ):
            good += 1
    violations = []
    if summary.failed:
        causes = ", ".join(f"{k} {v}" for k, v in sorted(summary.failures.items()))
        violations.append(f"{summary.failed} of {summary.requests} requests failed ({causes})")
    if summary.ttft_s.p99 is not None and summary.ttft_s.p99 > ttft_p99_s:
        violations.append(f"p99 TTFT {summary.ttft_s.p99:.3g} s > {ttft_p99_s:g} s")
    if summary.tpot_s.p99 is not None and summary.tpot_s.p99 > tpot_p99_s:
        violations.append(f"p99 TPOT {summary.tpot_s.p99 * 1000:.3g} ms > {tpot_p99_s * 1000:g} ms")
    if summary.completed == 0:
        violations.append("no request completed")
    return Slo(
        ttft_p99_s=ttft_p99_s,
        tpot_p99_s=tpot_p99_s,
        met=not violations,
        violations=violations,
        good_requests=good,
        goodput_rps=good / summary.wall_s if summary.wall_s > 0 else None,
    )


# A run with one of these flags did not measure what its level asks (another kernel, another
# platform, other lengths): it cannot show that the stack sustains the level.
INVALIDATING_FLAGS = (
    "kernel_mismatch",
    "platform_mismatch",
    "output_length_mismatch",
    "prompt_length_mismatch",
    "over_memory_cap",
    "usage_mismatch",
)


def level_failure(status: str, met: bool | None, violations: list[str], flags: list[str] = ()) -> str | None:
    """Why one run fails a capacity level (its status, a flag that says it measured something
    else, or the objectives it missed), or None when it passes: status ok, no such flag, and
    the objectives met. The stop rule (bench) and the capacity table (analysis) both judge a
    level by it."""
    if status != "ok":
        return status
    wrong = [f for f in flags if f in INVALIDATING_FLAGS]
    reasons = ["flagged " + ", ".join(wrong)] if wrong else []
    if met is not True:  # every reason, not only the first kind found
        reasons += violations or ([] if wrong else ["not judged against the objectives"])
    return "; ".join(reasons) or None
