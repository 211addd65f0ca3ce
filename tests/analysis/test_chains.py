import polars as pl
import pytest

from speedsplit.analysis import chains
from speedsplit.analysis.chains import run_speeds


def _runs(cycle, cell="u1-truth-greedy", load="closed"):
    return pl.DataFrame(
        {
            "cell": [cell],
            "load": [load],
            "wall_s": [2.0],
            "run": [0],
            "output_tok_s": [10.0],
            "e2e_s_median": [1.0],
            "client_e2e_s": [0.001],
            "client_cycle_s": [cycle],
        },
        schema_overrides={"client_cycle_s": pl.Float64},
    )


def test_a_closed_loop_rate_without_the_client_takes_out_its_cycle():
    # the cycle (end-to-end offset and the turn to the next request) where it was calibrated,
    # the end-to-end offset alone in an older calibration
    assert run_speeds(_runs(0.004), "output_tok_s", without_client="bound")[0] == pytest.approx(10.0 / 0.996)
    assert run_speeds(_runs(None), "output_tok_s", without_client="bound")[0] == pytest.approx(10.0 / 0.999)
    assert run_speeds(_runs(0.004), "output_tok_s")[0] == 10.0


def test_an_open_loop_rate_without_the_client_ends_its_wall_before_the_last_answers_offset():
    # its requests leave on schedule; its wall ends when the client saw the last answer end, one
    # end-to-end offset late (a trace window's throughput factor on a 2-core Xeon measured 0.90498
    # against a truth of 0.90528 while its two runs agreed to 0.01%: the interval missed it)
    for cell, load in (("r6-traffic-greedy", "open"), ("x4-trace-greedy", "trace")):
        runs = _runs(0.004, cell, load)
        assert run_speeds(runs, "output_tok_s", without_client="bound")[0] == pytest.approx(10.0 / (1 - 0.001 / 2.0))
        assert run_speeds(runs.with_columns(client_e2e_s=None), "output_tok_s", without_client="bound") == {}


def test_the_value_takes_out_the_uncontended_client_and_what_the_runs_own_records_show():
    """A closed loop of two users, two requests each, 2 s of wall: the records show the client
    held 6 ms (before its first request, after its last answer, between a user's answer and its
    next request), and each of the user's two requests carries the uncontended client's 1 ms
    end to end: the value is the rate over the 1.992 s the server took. An open loop's last
    answer carries one end-to-end offset. Without the records' part (older results), the
    uncontended cycle stands for it."""
    runs = _runs(0.004).with_columns(
        users=pl.lit(2),
        completed=pl.lit(4),
        client_least_e2e_s=pl.lit(0.001),
        client_least_cycle_s=pl.lit(0.002),
        client_wall_s=pl.lit(0.006),
    )
    assert run_speeds(runs, "output_tok_s", without_client="value")[0] == pytest.approx(10.0 * 2.0 / 1.992)
    open_loop = runs.with_columns(cell=pl.lit("r6-traffic-greedy"), load=pl.lit("open"))
    assert run_speeds(open_loop, "output_tok_s", without_client="value")[0] == pytest.approx(10.0 * 2.0 / 1.993)
    older = runs.with_columns(client_wall_s=None)
    assert run_speeds(older, "output_tok_s", without_client="value")[0] == pytest.approx(10.0 / 0.998)
    latency = runs.with_columns(ttft_s_median=pl.lit(0.5), client_least_ttft_s=pl.lit(0.0012))
    assert run_speeds(latency, "ttft_s_median", False, without_client="value")[0] == pytest.approx(1 / 0.4988)


ROW = {
    "tpot_s_median": 0.0100,
    "tpot_s_p99": 0.0110,
    "client_least_tpot_s": 0.000005,  # the uncontended client's median offset
    "client_tpot_s": 0.000013,  # the largest level's median offset
    "client_tpot_p99_s": 0.000040,  # the largest level's p99 offset
}


def test_a_p99s_far_side_is_the_clients_own_tail():
    # the value takes the uncontended median out, a p99 as a median
    assert chains.client_free(ROW, "tpot_s_p99") == pytest.approx(0.0110 - 0.000005)
    # the interval's far side: a p99 less the client's largest p99 offset, a median less its median's
    assert chains.client_free(ROW, "tpot_s_p99", bound=True) == pytest.approx(0.0110 - 0.000040)
    assert chains.client_free(ROW, "tpot_s_median", bound=True) == pytest.approx(0.0100 - 0.000013)


def test_a_calibration_without_its_tail_bounds_a_p99_by_its_median():
    older = {**ROW, "client_tpot_p99_s": None}  # calibrated before the tail was measured
    assert chains.client_free(older, "tpot_s_p99", bound=True) == pytest.approx(0.0110 - 0.000013)
    # a tail below the median's offset never narrows the bound
    assert chains.client_free({**ROW, "client_tpot_p99_s": 0.0}, "tpot_s_p99", bound=True) == pytest.approx(
        0.0110 - 0.000013
    )
