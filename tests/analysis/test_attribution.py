import math

import pytest

from speedsplit.analysis import attribution as A


def test_headline_cell_factors_multiply_exactly():
    # The study's headline cell: runtime 1.90 x kernel+quant 1.36 = 2.58 total.
    tp = {"hf-fp16": [100.0, 99.0, 101.0], "vllm-fp16": [190.0, 188.1, 191.9], "vllm-marlin": [258.4, 255.8, 261.0]}
    a = A.attribute(["hf-fp16", "vllm-fp16", "vllm-marlin"], tp)
    runtime, kernel = a.factors
    assert runtime.name == "vllm-fp16/hf-fp16" and runtime.value == pytest.approx(1.90)
    assert kernel.value == pytest.approx(1.36)
    assert math.prod(f.value for f in a.factors) == pytest.approx(a.total, rel=1e-12)
    assert a.total == pytest.approx(2.584)
    # log share of the runtime factor: ln 1.90 / ln 2.584 = 0.676 (the study: about 68%)
    assert runtime.share == pytest.approx(math.log(1.9) / math.log(2.584))
    assert runtime.share + kernel.share == pytest.approx(1.0)
    for f in a.factors:
        assert f.ci[0] <= f.value <= f.ci[1]
        assert f.share_ci[0] <= f.share <= f.share_ci[1]
    assert a.total_ci[0] <= a.total <= a.total_ci[1]


def test_intervals_narrow_with_agreeing_runs_and_widen_with_noise():
    steady = A.attribute(["a", "b"], {"a": [100.0] * 3, "b": [200.0] * 3})
    noisy = A.attribute(["a", "b"], {"a": [80.0, 100.0, 120.0], "b": [150.0, 200.0, 260.0]})
    assert steady.factors[0].ci == pytest.approx((2.0, 2.0))
    lo, hi = noisy.factors[0].ci
    assert lo < 2.0 < hi and hi - lo > 0.5


def test_longer_chain_telescopes():
    tp = {"hf": [10.0], "vfp16": [30.0], "gptq": [36.0], "marlin": [45.0]}
    a = A.attribute(list(tp), tp)
    assert [round(f.value, 6) for f in a.factors] == [3.0, 1.2, 1.25]
    assert math.prod(f.value for f in a.factors) == pytest.approx(4.5, rel=1e-12) == a.total
    assert sum(f.share for f in a.factors) == pytest.approx(1.0)


def test_shares_undefined_when_total_is_near_one():
    a = A.attribute(["a", "b", "c"], {"a": [100.0], "b": [150.0], "c": [102.0]})
    assert a.total == pytest.approx(1.02)
    assert all(f.share is None for f in a.factors)
    assert "undefined" in a.share_note
    assert a.factors[0].value == pytest.approx(1.5)  # factors themselves stay meaningful


def test_missing_stack_gives_no_numbers_and_says_why():
    a = A.attribute(["a", "b"], {"a": [100.0], "b": []}, missing={"b": "startup_failed"})
    assert a.total is None and a.factors[0].value is None
    assert a.missing == {"b": "startup_failed"}
    # in a longer chain the factors between measured stacks keep their values
    a = A.attribute(["a", "b", "c"], {"a": [100.0], "b": [200.0], "c": []}, missing={"c": "no clean run"})
    assert a.factors[0].value == 2.0 and a.factors[0].share is None and a.factors[1].value is None


def test_crossover_interpolates_on_log_users():
    users = [8, 16, 32, 64, 128]
    shares = [0.2, 0.3, 0.45, 0.68, 0.75]
    u = A.crossover(users, shares)
    expected = math.exp(math.log(32) + (0.5 - 0.45) * (math.log(64) - math.log(32)) / (0.68 - 0.45))
    assert u == pytest.approx(expected)
    assert 32 < u < 64
    assert A.crossover(users, [0.1, 0.2, 0.3, 0.4, 0.45]) is None
    assert A.crossover([8, 16], [None, 0.7]) is None


def test_spread_across_models():
    s = A.spread([1.36, 1.35, 1.37])
    assert s["n"] == 3 and s["spread_pct"] == pytest.approx(100 * 0.02 / 1.36)
    assert A.spread([None])["spread_pct"] is None


def test_each_stack_carries_its_own_client_offset():
    # Servers of known speed (1.1 s and 0.44 s a request; the truth 2.5), one user: the client
    # added 1.2 ms to each of the slow one's request cycles and 1.7 ms to the fast one's, where
    # 1.77 ms was calibrated (seen so on a 2-core Xeon). Each stack's offset lies between none
    # and the calibrated one, apart from the other's.
    true_s, added, calibrated = {"slow": 1.1, "fast": 0.44}, {"slow": 0.0012, "fast": 0.0017}, 0.00177
    jitter = (0.0, 0.00001)
    speeds = {s: [1.0 / (true_s[s] + added[s] + j) for j in jitter] for s in true_s}
    shifted = {s: [v / (1.0 - calibrated * v) for v in speeds[s]] for s in true_s}
    a = A.attribute(["slow", "fast"], speeds, without_client=shifted)
    lo, hi = a.factors[0].ci
    assert lo <= 2.5 <= hi and hi - lo < 0.02
    # both shifted alike, the interval would have missed it
    alike = A.est.hull(
        A.est.contrast(speeds, {"slow": -1, "fast": 1}), A.est.contrast(shifted, {"slow": -1, "fast": 1})
    )
    assert alike.hi < 2.5


def test_a_corner_on_one_shifted_run_does_not_keep_the_others_from_widening():
    # stack b's client offset was calibrated on one run only: the corners that take it shifted
    # have no interval, the corner with a shifted and b as measured still widens the factor
    speeds = {"a": [100.0, 101.0, 99.0], "b": [200.0, 202.0, 198.0]}
    shifted = {"a": [95.0, 96.0, 94.0], "b": [190.0]}
    alone = A.attribute(["a", "b"], speeds).factors[0].ci
    lo, hi = A.attribute(["a", "b"], speeds, without_client=shifted).factors[0].ci
    assert hi > alone[1] and lo == pytest.approx(alone[0])
