import polars as pl
import pytest

from speedsplit.analysis.chains import run_speeds


def _runs(cycle):
    return pl.DataFrame(
        {
            "cell": ["u1-truth-greedy"],
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
