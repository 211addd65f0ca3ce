"""Open-loop schedules: the arrival patterns have the statistics they claim, the schedule is a
function of the seed alone, and bad settings fail in one line naming them."""

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from speedsplit.core import traffic as T

N = 20_000


def test_poisson_gaps_are_exponential_at_the_rate():
    g = T.gaps("poisson", 5.0, N, random.Random(1))
    assert statistics.fmean(g) == pytest.approx(0.2, rel=0.03)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.05)
    # Kolmogorov-Smirnov against the exponential: within the 99% bound
    s = sorted(g)
    d = max(
        max(abs((i + 1) / N - (1 - math.exp(-5 * x))), abs(i / N - (1 - math.exp(-5 * x)))) for i, x in enumerate(s)
    )
    assert d < 1.63 / math.sqrt(N)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_keep_the_rate_and_spread_as_their_burstiness_says(burstiness):
    g = T.gaps("gamma", 2.0, N, random.Random(2), burstiness)
    assert statistics.fmean(g) == pytest.approx(0.5, rel=0.04)
    # coefficient of variation of a gamma of shape k: 1 / sqrt(k)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)


def test_constant_arrivals_and_a_duration_or_a_count():
    assert T.due_times("constant", 4.0, random.Random(0), requests=5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    due = T.due_times("poisson", 10.0, random.Random(0), duration_s=30.0)
    assert due[0] == 0.0 and due[-1] < 30.0 and len(due) == pytest.approx(300, rel=0.15)
    assert due == sorted(due)


def test_the_schedule_is_the_seeds_alone_and_lognormal_lengths_keep_their_mean():
    arrival = {"pattern": "poisson", "rate_rps": 3.0, "requests": 4000}
    mix = {"kind": "lognormal", "prompt_spread": 0.5, "output_spread": 0.8}
    a = T.schedule(arrival, mix, 256, 128, seed=7, max_model_len=100_000)
    assert a == T.schedule(arrival, mix, 256, 128, seed=7, max_model_len=100_000)
    assert a != T.schedule(arrival, mix, 256, 128, seed=8, max_model_len=100_000)
    assert statistics.fmean(x.prompt_tokens for x in a) == pytest.approx(256, rel=0.05)
    assert statistics.fmean(x.output_tokens for x in a) == pytest.approx(128, rel=0.08)
    assert statistics.stdev(math.log(x.prompt_tokens) for x in a) == pytest.approx(0.5, rel=0.08)
    assert min(x.prompt_tokens for x in a) >= 1


def test_an_empirical_mix_draws_its_pairs(tmp_path):
    f = tmp_path / "mix.txt"
    f.write_text("# prompt output\n100 10\n2000, 50\n")
    a = T.schedule({"pattern": "constant", "rate_rps": 1, "requests": 200}, {"kind": "file", "path": f}, 1, 1, 0, 4096)
    assert {(x.prompt_tokens, x.output_tokens) for x in a} == {(100, 10), (2000, 50)}


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: T.gaps("poisson", 0, 3, random.Random(0)), "rate must be above 0"),
        (lambda: T.gaps("gamma", 1, 3, random.Random(0), burstiness=0), "burstiness must be above 0"),
        (lambda: T.gaps("weibull", 1, 3, random.Random(0)), "unknown arrival pattern 'weibull'"),
        (lambda: T.due_times("poisson", 1, random.Random(0)), "either a request count or a duration"),
        (lambda: T.read_length_pairs("/nonexistent/mix.txt"), "length file not found: /nonexistent/mix.txt"),
        (
            lambda: T.schedule({"pattern": "constant", "rate_rps": 1, "requests": 2}, {}, 900, 200, 0, 1024),
            r"request 0 of the length mix needs 900 \+ 200 tokens, beyond the model's context \(1024\)",
        ),
    ],
)
def test_bad_settings_fail_in_one_line_naming_them(call, message):
    with pytest.raises(T.TrafficError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_a_malformed_length_file_names_its_line(tmp_path):
    f = tmp_path / "mix.txt"
    f.write_text("100 10\n100 x\n")
    with pytest.raises(T.TrafficError, match="mix.txt line 2: expected two positive token counts"):
        T.read_length_pairs(f)


TRACE = Path(__file__).resolve().parents[1] / "data/mooncake-conversation-excerpt.jsonl"


def test_a_trace_window_replays_its_arrivals_faster_and_fits_the_context():
    whole, _ = T.read_trace(T.TraceWindow(str(TRACE), requests=60), max_model_len=200_000)
    assert len(whole) == 60 and whole[0].due_s == 0.0 and whole[-1].due_s == 15.0
    assert whole[1].blocks[:1] == whole[0].blocks[:1] == (0,)  # the shared first block
    fast, _ = T.read_trace(T.TraceWindow(str(TRACE), requests=60, speedup=2.0), max_model_len=200_000)
    assert [a.due_s for a in fast] == [a.due_s / 2 for a in whole]
    window, _ = T.read_trace(T.TraceWindow(str(TRACE), start_s=3.0, duration_s=6.0), max_model_len=200_000)
    assert window[0].due_s == 0.0 and max(a.due_s for a in window) < 6.0
    skip, counts = T.read_trace(T.TraceWindow(str(TRACE), requests=60), max_model_len=8192)
    assert counts["skipped"] == sum(1 for a in whole if a.prompt_tokens + a.output_tokens > 8192) > 0
    assert counts["capped"] == 0 and len(skip) == 60 - counts["skipped"]
    cap, counts = T.read_trace(T.TraceWindow(str(TRACE), requests=60, over_context="cap"), max_model_len=8192)
    assert counts["capped"] > 0 and len(cap) == 60 - counts["skipped"]
    assert all(a.prompt_tokens + a.output_tokens <= 8192 and len(a.blocks) == -(-a.prompt_tokens // 512) for a in cap)


def test_a_trace_scaled_down_keeps_its_sharing():
    """length_scale shrinks every length and the block size alike: a prompt keeps its blocks."""
    small, _ = T.read_trace(T.TraceWindow(str(TRACE), requests=10, length_scale=0.01), max_model_len=1024)
    full, _ = T.read_trace(T.TraceWindow(str(TRACE), requests=10), max_model_len=200_000)
    assert [a.blocks for a in small] == [a.blocks for a in full]
    assert [a.prompt_tokens for a in small] == [max(1, round(a.prompt_tokens * 0.01)) for a in full]


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2: not a trace record"),
        (
            '{"timestamp": 5, "input_length": 1000, "output_length": 5, "hash_ids": [1]}',
            "line 2: 1 hash ids do not fit input_length 1000",
        ),
    ],
)
def test_a_bad_trace_line_is_named(tmp_path, line, message):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n' + line + "\n")
    with pytest.raises(T.TrafficError, match=message):
        T.read_trace(T.TraceWindow(str(f), requests=5), 4096)
    with pytest.raises(T.TrafficError, match="trace not found"):
        T.read_trace(T.TraceWindow(str(tmp_path / "none.jsonl"), requests=5), 4096)


def test_a_gz_trace_that_is_not_gzip_or_is_cut_short_is_named(tmp_path):
    import gzip

    lines = "".join(
        json.dumps({"timestamp": i, "input_length": 10, "output_length": 5, "hash_ids": [i]}) + "\n" for i in range(200)
    )
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text(lines)  # named .gz, never compressed
    with pytest.raises(T.TrafficError, match=r"trace .*plain.jsonl.gz: unreadable after line 0 \(gzip stream: "):
        T.read_trace(T.TraceWindow(str(plain), requests=5), 4096)
    whole = gzip.compress(lines.encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a download cut short
    with pytest.raises(T.TrafficError, match=r"trace .*cut.jsonl.gz: unreadable after line \d+ \(gzip stream: "):
        T.read_trace(T.TraceWindow(str(cut), requests=500), 4096)
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(whole)
    assert len(T.read_trace(T.TraceWindow(str(good), requests=50), 4096)[0]) == 50
