"""analysis/compare.py: two result sets side by side, each stack's and each chain factor's B / A
of geometric means over runs, with Welch t intervals over each side's runs apart."""

import math

import pytest
from records import fake_result, write_result
from scipy import stats

from speedsplit.analysis import compare
from speedsplit.analysis.frames import clean_runs
from speedsplit.core.record import Distribution
from speedsplit.output import compare as page

T2, T4 = 4.302652729911275, 2.7764451051977987  # 97.5% points of Student's t, 2 and 4 degrees of freedom
K = 1.25  # each stack's two runs: x / K and x * K, so their geometric mean is x and log spread ln K
LATENCY = ["ttft_s_median", "tpot_s_median", "e2e_s_p99"]


def write_side(root, speeds, host="Test CPU", model="tiny", left_out=(), ttft=None):
    """Each stack's runs at these throughputs (run i the i-th); left_out: (stack, run, status,
    flags, tok_s) runs beside them; ttft: every run's TTFT (fake_result's is 0.1 s). Its runs frame."""
    runs = [(s, r, "ok", (), v) for s, values in speeds.items() for r, v in enumerate(values)]
    for stack, run, status, flags, tok_s in [*runs, *left_out]:
        res = fake_result(stack, 8, run, tok_s, status=status, flags=flags)
        res.model, res.provenance.hardware.host_cpu = model, host
        if ttft is not None and res.summary:
            res.summary.ttft_s = Distribution(mean=ttft, median=ttft, p90=ttft, p99=ttft)
        write_result(root / f"bench/{model}/{stack}/tp1/u8-wide-greedy/run{run}.json", res)
    return page.side(root)[0]


def row(frame, **where):
    (found,) = [r for r in frame.iter_rows(named=True) if all(r[k] == v for k, v in where.items())]
    return found


def test_a_stack_on_both_sides_gives_b_over_a_of_geometric_means_with_a_welch_interval(tmp_path):
    a = write_side(tmp_path / "a", {"s": [100 / K, 100 * K]})
    b = write_side(tmp_path / "b", {"s": [150 / K, 150 * K]}, ttft=0.05)
    frame = compare.stacks_frame(a, b)
    assert frame["metric"].to_list() == ["output_tok_s", *LATENCY]
    r = row(frame, metric="output_tok_s")
    assert (r["model"], r["stack"], r["topology"], r["cell"]) == ("tiny", "s", "tp1", "u8-wide-greedy")
    assert (r["a"], r["b"], r["b_over_a"]) == pytest.approx((100.0, 150.0, 1.5), rel=1e-12)
    # each side: log runs ln x ± ln K, sample variance 2 (ln K)^2, over 2 runs (ln K)^2; the two
    # sides' sum 2 (ln K)^2, Welch df (2v)^2 / (2 v^2 / 1) = 2: 1.5 × exp(± t2 √2 ln K)
    half = T2 * math.sqrt(2) * math.log(K)
    assert (r["lo"], r["hi"]) == pytest.approx((1.5 * math.exp(-half), 1.5 * math.exp(half)), rel=1e-9)
    assert (r["runs_a"], r["runs_b"]) == (2, 2)
    # a latency's ratio is B / A too (below 1: B is faster); runs that agree have a point interval
    r = row(frame, metric="ttft_s_median")
    assert (r["a"], r["b"], r["b_over_a"], r["lo"], r["hi"]) == pytest.approx((0.1, 0.05, 0.5, 0.5, 0.5))
    for metric, value in (("tpot_s_median", 0.1), ("e2e_s_p99", 0.3)):
        r = row(frame, metric=metric)
        assert (r["a"], r["b"], r["b_over_a"], r["lo"], r["hi"]) == pytest.approx((value, value, 1, 1, 1))


def test_sides_of_unequal_spread_and_run_count_take_welch_satterthwaite_degrees_of_freedom(tmp_path):
    e = math.exp
    a = write_side(tmp_path / "a", {"s": [100 * e(-0.1), 100.0, 100 * e(0.1)]})
    b = write_side(tmp_path / "b", {"s": [200 * e(-0.3), 200 * e(0.3)]})
    r = row(compare.stacks_frame(a, b), metric="output_tok_s")
    # A: log variance (0.01 + 0 + 0.01) / 2 = 0.01, over 3 runs 0.01/3; B: 0.18 over 2 runs 0.09
    va, vb = 0.01 / 3, 0.09
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 1)  # 1.0747
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert (r["a"], r["b"], r["b_over_a"]) == pytest.approx((100.0, 200.0, 2.0), rel=1e-12)
    assert (r["lo"], r["hi"]) == pytest.approx((2 * e(-half), 2 * e(half)), rel=1e-9)
    assert (r["runs_a"], r["runs_b"]) == (3, 2)


def test_a_stack_measured_on_one_side_only_has_no_row_and_makes_no_factor(tmp_path):
    a = write_side(tmp_path / "a", {"only-a": [100.0, 100.0], "both": [200.0, 200.0]})
    b = write_side(tmp_path / "b", {"both": [300.0, 300.0], "only-b": [400.0, 400.0]})
    frame = compare.stacks_frame(a, b)
    assert set(frame["stack"]) == {"both"} and frame.height == 4  # its four metrics
    assert row(frame, metric="output_tok_s")["b_over_a"] == 1.5  # 300 / 200, runs alike: exact
    factors = compare.factors_frame(a, b, {"c": ["only-a", "both", "only-b"]})
    assert factors.height == 0  # only-a → both: B lacks only-a; both → only-b: A lacks only-b


def test_failed_and_flagged_runs_are_kept_out_unless_their_flag_is_tolerated(tmp_path):
    left_out = [("s", 2, "server_died", (), None), ("s", 3, "ok", ("kernel_mismatch",), 1000.0)]
    left_out += [("gone", 0, "failed", (), None), ("gone", 1, "failed", (), None)]
    a = write_side(tmp_path / "a", {"s": [100 / K, 100 * K], "gone": [50.0, 50.0]}, left_out=left_out[:2])
    b = write_side(tmp_path / "b", {"s": [150 / K, 150 * K]}, left_out=left_out[2:])
    assert clean_runs(a)[1] == ["s run2: server_died", "s run3: kernel_mismatch"]
    assert clean_runs(b)[1] == ["gone run0: failed", "gone run1: failed"]
    # a stack every one of whose runs failed on one side is not compared
    r = row(compare.stacks_frame(a, b), metric="output_tok_s")  # one row: s's, not gone's
    assert r["stack"] == "s" and (r["runs_a"], r["a"], r["b_over_a"]) == pytest.approx((2, 100.0, 1.5), rel=1e-12)
    # the flag tolerated, run3 counts: A is (80 × 125 × 1000)^(1/3) = 10^(7/3) over 3 runs
    r = row(compare.stacks_frame(a, b, tolerate_flags=("kernel_mismatch",)), metric="output_tok_s")
    assert (r["runs_a"], r["a"], r["b_over_a"]) == pytest.approx((3, 10 ** (7 / 3), 150 / 10 ** (7 / 3)), rel=1e-12)


def test_a_chain_factor_is_b_to_over_from_against_a_with_its_four_run_lists_apart(tmp_path):
    a = write_side(tmp_path / "a", {"s1": [100 / K, 100 * K], "s2": [1000 / K, 1000 * K], "s3": [5.0, 5.0]})
    b = write_side(tmp_path / "b", {"s1": [100 / K, 100 * K], "s2": [1500 / K, 1500 * K]})
    # two chains share the step s1 → s2: one row (the first chain's); s2 → s3 is on A only
    factors = compare.factors_frame(a, b, {"one": ["s1", "s2"], "two": ["s1", "s2", "s3"]})
    (r,) = factors.iter_rows(named=True)
    assert (r["chain"], r["factor"], r["model"], r["topology"], r["cell"]) == (
        "one",
        "s2/s1",
        "tiny",
        "tp1",
        "u8-wide-greedy",
    )
    assert (r["a"], r["b"], r["b_over_a"]) == pytest.approx((10.0, 15.0, 1.5), rel=1e-12)
    # four groups of 2 runs, each (ln K)^2 over its runs: se^2 = 4 (ln K)^2, Welch df
    # (4v)^2 / (4 v^2 / 1) = 4: 1.5 × exp(± t4 × 2 ln K)
    half = T4 * 2 * math.log(K)
    assert (r["lo"], r["hi"]) == pytest.approx((1.5 * math.exp(-half), 1.5 * math.exp(half)), rel=1e-9)


def test_two_sides_of_other_models_compare_nothing_and_say_the_models_differ(tmp_path):
    a = write_side(tmp_path / "a", {"s1": [100.0, 100.0], "s2": [200.0, 200.0]})
    b = write_side(tmp_path / "b", {"s1": [100.0, 100.0], "s2": [300.0, 300.0]}, model="other")
    assert compare.stacks_frame(a, b).height == 0
    assert compare.factors_frame(a, b, {"c": ["s1", "s2"]}).height == 0
    assert page.nothing_to_compare(a, b) == (
        "nothing to compare: the models differ (A measured tiny; B measured other): "
        "compare two result sets of the same model"
    )


def test_two_sides_on_other_hardware_are_set_side_by_side_each_said_by_its_hardware(tmp_path):
    a = write_side(tmp_path / "a", {"s1": [100.0, 100.0], "s2": [200.0, 200.0]})
    b = write_side(tmp_path / "b", {"s1": [100.0, 100.0], "s2": [300.0, 300.0]}, host="Other CPU")
    assert row(compare.stacks_frame(a, b), stack="s2", metric="output_tok_s")["b_over_a"] == 1.5
    assert row(compare.factors_frame(a, b, {"c": ["s1", "s2"]}), factor="s2/s1")["b_over_a"] == 1.5
    prov = page.side(tmp_path / "b")[1]
    assert page.describe("A", "a", prov, a).startswith("A = a: CPU: Test CPU;")
    assert page.describe("B", "b", prov, b).startswith("B = b: CPU: Other CPU;")
