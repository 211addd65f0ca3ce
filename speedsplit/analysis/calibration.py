"""The client calibrations the runs were measured with (measuring/calibrate.py), as a frame."""

from __future__ import annotations

import polars as pl

from speedsplit.core.record import RunResult


CALIBRATION_SCHEMA = {
    "measured_at": pl.Utf8,
    "host_cpu": pl.Utf8,
    "reference": pl.Utf8,
    "users": pl.Int64,
    "requests": pl.Int64,
    "ttft_s": pl.Float64,
    "itl_s": pl.Float64,
    "tpot_s": pl.Float64,
    "e2e_s": pl.Float64,
    "e2e_p90_s": pl.Float64,
    "ttft_p99_s": pl.Float64,
    "tpot_p99_s": pl.Float64,
    "throughput_error": pl.Float64,
    "cycle_s": pl.Float64,
    "wait_s": pl.Float64,
    "carried_ttft_s": pl.Float64,
    "carried_itl_s": pl.Float64,
    "carried_tpot_s": pl.Float64,
    "carried_e2e_s": pl.Float64,
    "ceiling_tok_s": pl.Float64,
    "runs": pl.Int64,
}


def calibration_frame(results: list[RunResult]) -> pl.DataFrame:
    """Each client calibration the runs were measured with (speedsplit/measuring/calibrate.py),
    one row per number of users it measured at, with how many runs carry it; empty where none
    does (results from before calibration, or measured without the workflow)."""
    seen: dict[str, tuple] = {}
    for res in results:
        c = res.calibration
        if c is not None:
            key = c.model_dump_json()
            seen[key] = (c, seen.get(key, (c, 0))[1] + 1)
    rows = [
        {
            "measured_at": c.measured_at,
            "host_cpu": c.host_cpu,
            "reference": c.reference,
            **lv.model_dump(),
            "carried_ttft_s": c.ttft_s,
            "carried_itl_s": c.itl_s,
            "carried_tpot_s": c.tpot_s,
            "carried_e2e_s": c.e2e_s,
            "ceiling_tok_s": c.ceiling_tok_s,
            "runs": n,
        }
        for c, n in sorted(seen.values(), key=lambda cn: cn[0].measured_at)
        for lv in c.levels
    ]
    return pl.DataFrame(rows, schema=CALIBRATION_SCHEMA)
