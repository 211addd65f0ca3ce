"""Values over runs and their intervals: Student's t (against published quantiles), the
geometric mean that makes factors telescope, pairing by run, and coverage: a 95% interval holds
the truth about 95% of the time, where a bootstrap over two runs held it about half the time."""

import math

import numpy as np
import pytest

from speedsplit.analysis import run_estimates as E


@pytest.mark.parametrize(("df", "q"), [(1, 12.7062), (2, 4.3027), (5, 2.5706), (30, 2.0423), (1000, 1.9623)])
def test_t_quantiles_are_the_published_ones(df, q):
    assert E.t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert E.t_quantile(0.025, df) == pytest.approx(-q, abs=1e-4)


def test_a_value_over_runs_is_their_geometric_mean_and_one_run_has_no_interval():
    e = E.over_runs([100.0, 121.0])
    assert e.value == pytest.approx(110.0) and e.lo < 110.0 < e.hi and e.runs == 2
    assert E.over_runs([5.0]) == E.Estimate(5.0, None, None, 1)
    assert E.over_runs([7.0, 7.0, 7.0]) == E.Estimate(7.0, 7.0, 7.0, 3)
    assert E.over_runs([0.0, 2.0]).value == 1.0  # a zero: the arithmetic mean
    assert E.over_runs([]) == E.NONE


def test_a_ratio_pairs_runs_by_index_when_asked():
    a = {0: 100.0, 1: 200.0}  # two schedules, one twice as fast as the other
    b = {0: 150.0, 1: 300.0}  # the same 1.5x on each
    paired, apart = E.ratio(a, b, paired=True), E.ratio(a, b)
    assert paired.value == pytest.approx(1.5) and apart.value == pytest.approx(1.5)
    assert paired.hi - paired.lo < 1e-9  # each pair says 1.5
    assert apart.lo < 0.5 and apart.hi > 4  # apart, the schedules' spread is all there is
    # a run one side lacks drops out of the pairs
    assert E.ratio({0: 100.0, 1: 200.0, 2: 50.0}, {0: 150.0, 1: 300.0}, paired=True).runs == 2


def test_a_contrast_of_four_groups_is_a_ratio_of_ratios():
    g = {"a": [10.0, 10.1], "b": [20.0, 20.2], "c": [10.0, 9.9], "d": [30.0, 29.7]}
    e = E.contrast(g, {"a": 1.0, "b": -1.0, "c": -1.0, "d": 1.0})
    assert e.value == pytest.approx(
        (30.0 * 29.7) ** 0.5 / (10.0 * 9.9) ** 0.5 / ((20.0 * 20.2) ** 0.5 / (10.0 * 10.1) ** 0.5)
    )
    assert e.lo < e.value < e.hi


def test_the_hull_spans_both_estimates():
    h = E.hull(E.Estimate(2.0, 1.9, 2.1, 2), E.Estimate(2.05, 1.95, 2.2, 2))
    assert (h.value, h.lo, h.hi) == (2.0, 1.9, 2.2)
    assert E.hull(E.Estimate(2.0, 1.9, 2.1, 2), E.Estimate(2.0)) == E.Estimate(2.0, 1.9, 2.1, 2)


def test_two_runs_make_an_interval_that_covers_the_truth_as_often_as_it_says():
    """Each stack's runs scatter 2% about its truth; the factor's truth is 2.0. Over many
    draws the 95% t interval holds it about 95% of the time; the bootstrap of medians the
    tables used before held it about half of the time (with two runs it spans their range)."""
    rng = np.random.default_rng(7)
    hits_t = hits_boot = 0
    trials = 2000
    for _ in range(trials):
        a = 100.0 * np.exp(rng.normal(0, 0.02, 2))
        b = 200.0 * np.exp(rng.normal(0, 0.02, 2))
        e = E.ratio(list(a), list(b))
        hits_t += e.lo <= 2.0 <= e.hi
        boot = np.median(b[rng.integers(0, 2, (400, 2))], axis=1) / np.median(a[rng.integers(0, 2, (400, 2))], axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        hits_boot += lo <= 2.0 <= hi
    assert 0.93 <= hits_t / trials <= 0.99  # Welch with one degree of freedom a side is a little conservative
    assert hits_boot / trials < 0.7


def test_shares_draw_from_the_runs_own_spread():
    draws = E.mean_log_draws({"a": [100.0, 102.0], "b": [200.0, 199.0]}, seed=1)
    assert set(draws) == {"a", "b"} and abs(float(np.mean(draws["a"])) - math.log(101.0)) < 0.01
    assert E.mean_log_draws({"a": [100.0], "b": [200.0, 199.0]}) is None  # one run: none
    paired = E.mean_log_draws({"a": {0: 100.0, 1: 102.0}, "b": {0: 200.0, 1: 204.0}}, paired=True)
    assert np.allclose(paired["b"] - paired["a"], math.log(2.0))  # every pair the same ratio
