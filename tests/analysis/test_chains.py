import polars as pl
import pytest

from speedsplit.analysis.chains import run_speeds


def _runs(cycle, cell="u1-truth-greedy"):
    return pl.DataFrame(
        {
            "cell": [cell],
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
    assert run_speeds(_runs(0.004), "output_tok_s", without_client=True)[0] == pytest.approx(10.0 / 0.996)
    assert run_speeds(_runs(None), "output_tok_s", without_client=True)[0] == pytest.approx(10.0 / 0.999)
    assert run_speeds(_runs(0.004), "output_tok_s")[0] == 10.0


def test_an_open_loop_rate_without_the_client_ends_its_wall_before_the_last_answers_offset():
    # its requests leave on schedule; its wall ends when the client saw the last answer end, one
    # end-to-end offset late (a trace window's throughput factor on a 2-core Xeon measured 0.90498
    # against a truth of 0.90528 while its two runs agreed to 0.01%: the interval missed it)
    for cell in ("r6-traffic-greedy", "x4-trace-greedy"):
        runs = _runs(0.004, cell)
        assert run_speeds(runs, "output_tok_s", without_client=True)[0] == pytest.approx(10.0 / (1 - 0.001 / 2.0))
        assert run_speeds(runs.with_columns(client_e2e_s=None), "output_tok_s", without_client=True) == {}
