"""The client calibrations the runs were measured with, as a frame (speedsplit/analysis/calibration.py):
one row per level of each distinct calibration, oldest first, with the offsets every factor
carried and how many runs carry it."""

import pytest
from records import fake_result

from speedsplit.analysis.calibration import CALIBRATION_SCHEMA, calibration_frame
from speedsplit.core.facts import Calibration, CalibrationLevel


def calibration(at: str, ttft_s: float) -> Calibration:
    def level(users, ttft):
        return CalibrationLevel(
            users=users, requests=8, ttft_s=ttft, itl_s=0.0002, tpot_s=0.0003, e2e_s=0.004, e2e_p90_s=0.006,
            throughput_error=-0.001, wait_s=0.05,
        )  # fmt: skip

    return Calibration(
        measured_at=at, host_cpu="Test CPU", reference="--ttft-s 0.05", levels=[level(1, 0.001), level(16, ttft_s)],
        ttft_s=ttft_s, itl_s=0.0002, tpot_s=0.0003, e2e_s=0.004, ceiling_tok_s=5000.0, ceiling_users=16,
    )  # fmt: skip


def test_each_calibration_once_a_row_a_level_with_the_runs_that_carry_it():
    older, newer = calibration("2026-12-01T00:00:00Z", 0.003), calibration("2026-12-02T00:00:00Z", 0.002)
    results = [fake_result("vllm-fp16", 8, run, 100.0) for run in range(3)] + [fake_result("vllm-fp16", 2, 0, 50.0)]
    for res, cal in zip(results, (newer, newer, older, None)):
        res.calibration = cal
    frame = calibration_frame(results)
    assert frame.schema == CALIBRATION_SCHEMA
    rows = frame.select("measured_at", "users", "runs", "ttft_s", "carried_ttft_s").rows()
    assert rows == [
        ("2026-12-01T00:00:00Z", 1, 1, 0.001, 0.003),
        ("2026-12-01T00:00:00Z", 16, 1, 0.003, 0.003),
        ("2026-12-02T00:00:00Z", 1, 2, 0.001, 0.002),
        ("2026-12-02T00:00:00Z", 16, 2, 0.002, 0.002),
    ]
    assert frame["ceiling_tok_s"].to_list() == pytest.approx([5000.0] * 4)


def test_runs_measured_without_a_calibration_make_an_empty_typed_frame():
    frame = calibration_frame([fake_result("vllm-fp16", 8, 0, 100.0)])
    assert frame.is_empty() and frame.schema == CALIBRATION_SCHEMA
