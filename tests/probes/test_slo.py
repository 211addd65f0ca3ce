"""Latency objectives and goodput on constructed requests with known latencies."""

import pytest

from speedsplit.core.record import Distribution, Summary
from speedsplit.core.requestlog import RequestRecord
from speedsplit.probes import slo


def req(i, ttft, tpot, tokens=11, error=None):
    end = None if error else ttft + tpot * (tokens - 1)
    return RequestRecord(
        user=i,
        index=0,
        phase="measured",
        url="u",
        sent=0.0,
        first_token=None if error else ttft,
        end=end,
        output_tokens=None if error else tokens,
        error=error,
    )


def summary(records, wall_s=10.0):
    ok = [r for r in records if r.ok]
    ttfts = sorted(r.first_token - r.sent for r in ok)
    tpots = sorted(slo.tpot(r) for r in ok)
    d = lambda v: Distribution(mean=None, median=None, p90=None, p99=v[-1] if v else None)  # noqa: E731
    failed = len(records) - len(ok)
    return Summary(
        requests=len(records),
        completed=len(ok),
        failed=failed,
        failures={"http_503": failed} if failed else {},
        wall_s=wall_s,
        output_tokens=11 * len(ok),
        output_tok_s=None,
        request_s=None,
        ttft_s=d(ttfts),
        itl_s=d([]),
        tpot_s=d(tpots),
        e2e_s=d([]),
        wrong_output_length=0,
        wrong_prompt_length=0,
        warmup_s=0.0,
        warmup_failed=0,
    )


def test_a_run_within_the_objectives_is_met_and_all_its_requests_are_good():
    records = [req(i, 0.5, 0.05) for i in range(20)]
    v = slo.assess(records, summary(records), 2.0, 0.1)
    assert v.met and v.violations == [] and v.good_requests == 20 and v.goodput_rps == pytest.approx(2.0)


def test_a_slow_tail_fails_the_p99_and_only_good_requests_count():
    records = [req(i, 0.5, 0.05) for i in range(18)] + [req(18, 3.0, 0.05), req(19, 0.5, 0.2)]
    v = slo.assess(records, summary(records), 2.0, 0.1)
    assert not v.met and v.good_requests == 18 and v.goodput_rps == pytest.approx(1.8)
    assert v.violations == ["p99 TTFT 3 s > 2 s", "p99 TPOT 200 ms > 100 ms"]


def test_one_failed_request_fails_the_level():
    records = [req(i, 0.5, 0.05) for i in range(19)] + [req(19, 0, 0, error="http_503")]
    v = slo.assess(records, summary(records), 2.0, 0.1)
    assert not v.met and v.violations == ["1 of 20 requests failed (http_503 1)"] and v.good_requests == 19
