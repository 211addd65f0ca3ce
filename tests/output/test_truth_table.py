"""The truth table (speedsplit/output/truth.py) of result files written by hand: reference
stacks' runs measured at chosen numbers, each set beside what its server's rules make."""

import math

import polars as pl
import pytest
from records import fake_result, with_wall, write_result

from speedsplit.core.record import Distribution
from speedsplit.core.requestlog import RequestRecord
from speedsplit.core.results import write_lines_atomic
from speedsplit.output import truth
from speedsplit.serving.reference_speed import Faults, Speed

REF = "python -m speedsplit.serving.reference"
# One user sends 2 requests of 16 tokens back to back (fake_result's u1 cell). ref-slow: each
# 0.2 s + 15 x 0.02 s = 0.5 s, so 32 tokens in 1.0 s = 32 tok/s; ref-fast: 0.1 s + 15 x 0.01 s
# = 0.25 s, 32 tokens in 0.5 s = 64 tok/s. The true factor ref-fast/ref-slow is 2.
SLOW, FAST = f"{REF} --ttft-s 0.2 --itl-s 0.02", f"{REF} --ttft-s 0.1 --itl-s 0.01"
SLOW_LATENCY, FAST_LATENCY = (0.2, 0.02, 0.5), (0.1, 0.01, 0.25)  # TTFT, TPOT, E2E
T_975_ONE_DF = 12.706204736174698  # the 95% t quantile of one degree of freedom


def bench(root, stack, run, argv, tok_s, latency, flags=(), ttft_median=None):
    """A run of the u1 cell measured at tok_s (its wall what 32 tokens take there), its latencies
    as given (the TTFT's median apart where given), and its request records."""
    res = with_wall(fake_result(stack, 1, run, tok_s, flags=flags), 32 / tok_s)
    res.server.argv = argv
    s = res.summary
    s.requests = s.completed = 2
    s.request_s = 2 / s.wall_s
    ttft, tpot, e2e = (Distribution(mean=x, median=x, p90=x, p99=x) for x in latency)
    s.ttft_s, s.tpot_s, s.e2e_s = ttft, tpot, e2e
    if ttft_median is not None:
        s.ttft_s = Distribution(mean=latency[0], median=ttft_median, p90=latency[0], p99=latency[0])
    path = write_result(root / f"bench/tiny/{stack}/tp1/u1-wide-greedy/run{run}.json", res)
    requests = [("warmup", 0), ("measured", 0), ("measured", 1)]  # times the truth does not read
    records = [RequestRecord(user=0, index=i, phase=p, url="http://x", sent=0.0) for p, i in requests]
    write_lines_atomic(path.with_name(f"run{run}.requests.jsonl"), [r.model_dump(mode="json") for r in records])
    return path


def rows(table) -> dict:
    return {(r["what"], r["metric"]): r for r in table.iter_rows(named=True)}


def test_each_run_and_factor_of_a_clean_pair_is_set_beside_its_truth_and_judged_by_its_bar(tmp_path):
    paths = [
        bench(tmp_path, "ref-slow", 0, SLOW, 32.0, SLOW_LATENCY),
        bench(tmp_path, "ref-slow", 1, SLOW, 32.0, SLOW_LATENCY, ttft_median=0.2042),
        bench(tmp_path, "ref-fast", 0, FAST, 63.0, FAST_LATENCY),
        bench(tmp_path, "ref-fast", 1, FAST, 65.0, FAST_LATENCY),
    ]
    table = truth.compare(paths, chains={"study": ["ref-slow", "ref-fast"]})
    got = rows(table)
    assert table.filter(pl.col("kind") == "run").height == 2 * 2 * 4  # stacks x runs x metrics
    want = {  # (truth, measured, error, within)
        ("ref-slow u1-wide-greedy run0", "throughput"): (32.0, 32.0, 0.0, True),
        ("ref-slow u1-wide-greedy run0", "E2E p50"): (0.5, 0.5, 0.0, True),
        ("ref-slow u1-wide-greedy run1", "TPOT p50"): (0.02, 0.02, 0.0, True),
        # 0.2042 / 0.2 - 1 = 2.1%: just over the 2% a run's number may be off
        ("ref-slow u1-wide-greedy run1", "TTFT p50"): (0.2, 0.2042, 0.021, False),
        ("ref-fast u1-wide-greedy run0", "throughput"): (64.0, 63.0, -1 / 64, True),  # -1.5625%
        ("ref-fast u1-wide-greedy run1", "throughput"): (64.0, 65.0, 1 / 64, True),
        ("ref-fast u1-wide-greedy run1", "TTFT p50"): (0.1, 0.1, 0.0, True),
        # the mechanism of the step: E2E 0.5 s -> 0.25 s (latency 2x), 0.1 s of the 0.25 s saved
        # before the first token; in flight 2 x E2E / wall: 1.0 truly, measured 63/64 and 65/64
        ("mechanism study u1-wide-greedy ref-fast/ref-slow", "latency factor"): (2.0, 2.0, 0.0, True),
        ("mechanism study u1-wide-greedy ref-fast/ref-slow", "TTFT share"): (0.4, 0.4, 0.0, True),
        ("mechanism study u1-wide-greedy ref-fast/ref-slow", "decode share"): (0.6, 0.6, 0.0, True),
    }
    flight = math.sqrt(63 * 65) / 64
    want[("mechanism study u1-wide-greedy ref-fast/ref-slow", "in-flight factor")] = (1.0, flight, flight - 1, True)
    for key, (t, m, error, within) in want.items():
        r = got[key]
        assert (r["truth"], r["measured"], r["error"], r["within"]) == (
            pytest.approx(t, rel=1e-12),
            pytest.approx(m, rel=1e-12),
            pytest.approx(error, abs=1e-12),
            within,
        ), key
    # the factor: the geometric mean of 63 and 65 over 32 = 1.99976 (-0.012%); its interval
    # (Welch, one degree of freedom: ref-slow's runs agree) is exp(+-12.706 x ln(65/63) / 2) about it
    value, half = math.sqrt(63 * 65) / 32, T_975_ONE_DF * math.log(65 / 63) / 2
    for factor in ("ref-fast/ref-slow", "total"):
        r = got[(f"attribution study u1-wide-greedy {factor}", "throughput")]
        assert (r["truth"], r["measured"], r["raw"], r["error"]) == pytest.approx((2.0, value, value, value / 2 - 1))
        assert (r["lo"], r["hi"]) == pytest.approx((value * math.exp(-half), value * math.exp(half)), rel=1e-9)
        assert r["within"] is True and r["covered"] is True  # [1.640, 2.439] holds 2
    s = truth.summary(table)
    assert s == {"run": (15, 16), "factor": (2, 2), "mechanism": (4, 4), "fault": (0, 0), "covered": (2, 2)}
    assert not truth.holds(table)  # the one TTFT off its truth
    lines = truth.text(table).splitlines()
    assert len(lines) == 1 + table.height + 1
    assert lines[-1] == (
        "runs within 2%: 15/16; factors within 1.0% (p99 2.5%): 2/2; mechanisms within 2%: 4/4; "
        "truth inside the interval: 2/2; faults flagged and left out: 0/0"
    )
    ttft_off = [line for line in lines if "run1" in line and "TTFT p50" in line and "ref-slow" in line]
    assert ttft_off == [
        f"{'run':<10}{'ref-slow u1-wide-greedy run1':<58}{'TTFT p50':<17}{'0.2':>11}{'0.2042':>11}"
        "   2.10%   2.10%    OFF"
    ]
    factor = [line for line in lines if "attribution study u1-wide-greedy total" in line]
    assert factor[0].endswith("  -0.01%  -0.01%  [1.64, 2.439] holds it")


def test_faulty_and_foreign_stacks_are_kept_out_and_a_factor_off_its_truth_misses_it(tmp_path):
    paths = [
        bench(tmp_path, "ref-slow", 0, SLOW, 32.0, SLOW_LATENCY),
        bench(tmp_path, "ref-slow", 1, SLOW, 32.0, SLOW_LATENCY),
        bench(tmp_path, "ref-fast", 0, FAST, 64.7, FAST_LATENCY),
        bench(tmp_path, "ref-fast", 1, FAST, 64.7, FAST_LATENCY),
        bench(tmp_path, "hf", 0, "python -m server", 10.0, SLOW_LATENCY),  # no known speed: no truth
        bench(tmp_path, "ref-error", 0, f"{SLOW} --error-every 3", 30.0, SLOW_LATENCY, flags=["request_failures"]),
        bench(tmp_path, "ref-short", 0, f"{SLOW} --short-every 2", 32.0, SLOW_LATENCY),  # its short answers unseen
    ]
    table = truth.compare(paths, chains={"study": ["ref-slow", "ref-fast"], "faults": ["ref-slow", "ref-error"]})
    faults = table.filter(pl.col("kind") == "fault")
    assert faults.select("what", "metric", "within", "note").rows() == [
        (
            "ref-error u1-wide-greedy run0 fault",
            "error_every",
            True,
            "expects request_failures; got status ok, flags request_failures",
        ),
        ("ref-short u1-wide-greedy run0 fault", "short_every", False, "expects output_length_mismatch; got status ok, flags none"),
    ]  # fmt: skip
    # neither faulty stack nor the foreign one has a run row; the faults chain has no factor
    judged = table.filter(pl.col("kind") != "fault")
    assert {w.split()[0] for w in judged.filter(pl.col("kind") == "run")["what"]} == {"ref-slow", "ref-fast"}
    assert judged.filter(pl.col("kind") != "run")["what"].str.contains(" study ").all()
    # 64.7 / 64 - 1 = 1.09375%: each run within 2%; the factor 64.7 / 32 = 2.021875 is 1.09375%
    # off (over the 1% a factor may be), and with every run alike its interval is that one point
    r = rows(table)[("ref-fast u1-wide-greedy run1", "throughput")]
    assert (r["truth"], r["measured"], r["within"]) == (pytest.approx(64.0), 64.7, True)
    assert r["error"] == pytest.approx(0.0109375, abs=1e-12)
    r = rows(table)[("attribution study u1-wide-greedy ref-fast/ref-slow", "throughput")]
    assert (r["truth"], r["measured"], r["lo"], r["hi"]) == pytest.approx((2.0, 2.021875, 2.021875, 2.021875))
    assert (r["error"], r["within"], r["covered"]) == (pytest.approx(0.0109375, abs=1e-12), False, False)
    assert truth.summary(table) == {
        "run": (16, 16), "factor": (0, 2), "mechanism": (4, 4), "fault": (1, 2), "covered": (0, 2)
    }  # fmt: skip
    text = truth.text(table)
    assert text.splitlines()[1:3] == [
        f"{'fault':<10}{'ref-error u1-wide-greedy run0 fault':<58}{'error_every':<17}  "
        "flagged: expects request_failures; got status ok, flags request_failures",
        f"{'fault':<10}{'ref-short u1-wide-greedy run0 fault':<58}{'short_every':<17}  "
        "NOT FLAGGED: expects output_length_mismatch; got status ok, flags none",
    ]
    assert "   1.09%   1.09%  [2.022, 2.022] MISSES it  OFF\n" in text
    assert text.endswith("truth inside the interval: 0/2; faults flagged and left out: 1/2")


def table_of(covered: int, judged: int, fault_flagged: bool = True) -> pl.DataFrame:
    """Factors all within their bar, `covered` of `judged` intervals holding the truth, one fault."""
    factor = dict(kind="factor", what="f", metric="throughput", truth=2.0, measured=2.0, error=0.0, within=True)
    rows = [{**factor, "lo": 1.9, "hi": 2.1, "covered": i < covered} for i in range(judged)]
    rows.append(dict(kind="fault", what="x fault", metric="error_every", within=fault_flagged, note=""))
    return pl.DataFrame(rows, schema=truth.TABLE_SCHEMA)


def test_the_tier_holds_with_the_truth_inside_95_percent_of_intervals_and_every_fault_flagged():
    assert truth.summary(table_of(19, 20))["covered"] == (19, 20)
    assert truth.holds(table_of(19, 20))  # 19/20 = 95%
    assert not truth.holds(table_of(18, 20))  # 90%
    assert not truth.holds(table_of(20, 20, fault_flagged=False))


def test_an_open_loops_true_requests_wait_for_a_free_slot_as_the_server_serves_them():
    res = fake_result("ref-cap", 1, 0, 10.0)
    speed = Speed(ttft_s=0.1, itl_s=0.01, max_concurrency=1)
    asked = [(0.0, 11), (0.05, 6)]  # due, output tokens
    measured = [RequestRecord(user=0, index=0, phase="warmup", url="u", sent=0.0, due=0.0)] + [
        RequestRecord(user=0, index=i, phase="measured", url="u", sent=due + 0.003, due=due, asked_output_tokens=n)
        for i, (due, n) in enumerate(asked)
    ]
    out, records = truth.true_result(res, measured, speed)
    # the first: 0.1 s to its first token, 10 x 0.01 s to its end (0.2 s); the second, due at
    # 0.05 s, waits for the one slot until 0.2 s: first token 0.3 s, end 0.3 + 5 x 0.01 = 0.35 s
    assert [(r.sent, r.due, r.first_token, r.end, r.output_tokens, r.chunks) for r in records] == [
        (0.0, 0.0, pytest.approx(0.1), pytest.approx(0.2), 11, 11),
        (0.05, 0.05, pytest.approx(0.3), pytest.approx(0.35), 6, 6),
    ]
    assert records[1].gaps == pytest.approx([0.01] * 5)
    # 17 tokens over 0.35 s; TTFTs 0.1 and 0.25 s (median 0.175), E2Es 0.2 and 0.3 s
    s = out.summary
    assert (s.output_tokens, s.output_tok_s, s.ttft_s.median, s.e2e_s.median) == (
        17, pytest.approx(17 / 0.35), pytest.approx(0.175), pytest.approx(0.25)
    )  # fmt: skip
    assert out.calibration is None and res.summary.output_tok_s == 10.0  # the measured run untouched


def test_a_reference_servers_speed_and_faults_come_from_its_command_line_and_no_other_has_them():
    res = fake_result("ref", 1, 0, 10.0)
    res.server.argv = f"{REF} --ttft-s 0.3 --itl-s 0.004 --max-concurrency 2 --stall-every 5 --stall-s 1.5"
    assert truth.settings(res) == (Speed(0.3, 0.004, max_concurrency=2), Faults(stall_every=5, stall_s=1.5))
    res.server.argv = "python -m server"
    assert truth.settings(res) is None
    res.server = None
    assert truth.settings(res) is None


def test_a_number_whose_truth_is_zero_is_shown_off_instead_of_breaking_the_table(tmp_path):
    # --ttft-s 0 (no prefill): the true TTFT is 0 s, so _row leaves its error None, within False
    zero = f"{REF} --ttft-s 0 --itl-s 0.02"
    table = truth.compare([bench(tmp_path, "ref-zero", 0, zero, 32.0, (0.001, 0.02, 0.3))], chains={})
    r = rows(table)[("ref-zero u1-wide-greedy run0", "TTFT p50")]
    assert (r["truth"], r["measured"], r["error"], r["within"]) == (0.0, 0.001, None, False)
    assert [line for line in truth.text(table).splitlines() if "TTFT p50" in line][0].endswith("OFF")


def test_a_faulty_run_whose_flag_is_tolerated_is_not_counted_as_left_out(tmp_path):
    paths = [
        bench(tmp_path, "ref-slow", 0, SLOW, 32.0, SLOW_LATENCY),
        bench(tmp_path, "ref-error", 0, f"{SLOW} --error-every 3", 30.0, SLOW_LATENCY, flags=["request_failures"]),
    ]
    table = truth.compare(paths, chains={"faults": ["ref-slow", "ref-error"]}, tolerate_flags=["request_failures"])
    # the faulty run reaches the factor (30 / 32 = 0.9375), so it was not left out
    reached = rows(table)[("attribution faults u1-wide-greedy ref-error/ref-slow", "throughput")]
    assert reached["measured"] == pytest.approx(0.9375)
    assert rows(table)[("ref-error u1-wide-greedy run0 fault", "error_every")]["within"] is False
