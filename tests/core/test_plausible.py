"""Numbers no measurement makes are flagged `implausible`, with the reason, and count in no
factor, whoever wrote the record (speedsplit/core/plausible.py)."""

import polars as pl
import pytest
from records import fake_result, write_result

from speedsplit.analysis import answer
from speedsplit.core import plausible
from speedsplit.core.record import Calibration
from speedsplit.core.facts import CalibrationLevel
from speedsplit.output import aggregate


def test_a_measured_record_is_plausible():
    assert plausible.reasons(fake_result("vllm-fp16", 4, 0, 123.4)) == []
    assert plausible.reasons(fake_result("vllm-fp16", 4, 0, None, status="server_died")) == []


def _edited(**summary):
    res = fake_result("vllm-fp16", 4, 0, 100.0)
    for k, v in summary.items():
        setattr(res.summary, k, v)
    return res


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"output_tok_s": -100.0}, "negative or not finite: output_tok_s"),
        ({"wall_s": float("nan")}, "negative or not finite: wall_s"),
        # 1220 times the tokens the wall time holds
        ({"output_tok_s": 122000.0}, "122000 tokens/s over 2 s is 244000 tokens, not the 200 counted"),
        ({"request_s": 20.0}, "20 requests/s over 2 s is 40 requests, not the 4 counted"),
        ({"completed": 5, "request_s": 2.5}, "5 requests completed of 4 sent"),
    ],
)
def test_an_edited_summary_says_what_cannot_be(edit, says):
    assert says in "; ".join(plausible.reasons(_edited(**edit)))


def test_a_request_longer_than_its_measured_phase_or_a_first_token_after_the_last():
    res = _edited()
    res.summary.e2e_s = res.summary.e2e_s.model_copy(update={"p99": 3.5})
    assert "a request took 3.5 s (p99 E2E), longer than the 2 s measured phase" in plausible.reasons(res)[0]
    res = _edited()
    res.summary.ttft_s = res.summary.ttft_s.model_copy(update={"p99": 0.9})
    assert plausible.reasons(res) == ["p99 TTFT 0.9 s is longer than p99 E2E 0.3 s"]


def test_faster_than_the_client_that_measured_it_can_read():
    res = fake_result("vllm-fp16", 4, 0, 100.0)
    level = CalibrationLevel(
        users=1, requests=8, ttft_s=0.001, itl_s=0.0, tpot_s=0.0, e2e_s=0.002, e2e_p90_s=0.002, throughput_error=0.0
    )
    res.calibration = Calibration(
        measured_at="2026-12-03T00:00:00Z",
        host_cpu="Test CPU",
        reference="--ttft-s 0.1",
        levels=[level],
        ttft_s=0.001,
        itl_s=0.0,
        tpot_s=0.0,
        e2e_s=0.002,
        ceiling_tok_s=60.0,
        ceiling_users=64,
    )
    assert plausible.reasons(res) == [
        "100 tok/s is over 1.5x the 60 tok/s its host's client can read (its calibrated ceiling)"
    ]
    res.calibration.ceiling_tok_s = 70.0  # within 1.5x: the ceiling's own load is not every load
    assert plausible.reasons(res) == []


def test_aggregation_flags_an_implausible_run_names_it_and_leaves_it_out_of_the_factors(tmp_path, capsys):
    paths = []
    for stack, tok_s in (("hf-fp16", 100.0), ("vllm-fp16", 200.0)):
        for run in (0, 1):
            res = fake_result(stack, 4, run, tok_s * (1 + run / 100))
            if stack == "vllm-fp16" and run == 1:
                res.summary.output_tok_s = 244000.0  # a bug's number: 1220x the tokens its wall time holds
            paths.append(write_result(tmp_path / f"{stack}-{run}.json", res))
    frames = aggregate.build_frames(paths, {"study": ["hf-fp16", "vllm-fp16"]})
    said = capsys.readouterr().err
    assert f"speedsplit: {paths[3]}: implausible, in no factor: 244000 tokens/s over 2 s" in said
    runs = frames["runs"].filter(pl.col("flags").list.contains("implausible"))
    assert runs.select("stack", "run").rows() == [("vllm-fp16", 1)]
    factor = frames["attribution"].filter(pl.col("factor") == "vllm-fp16/hf-fp16").row(0, named=True)
    assert factor["value"] == pytest.approx(200 / (100 * 101) ** 0.5)  # vllm-fp16's run 0 alone
    said = " ".join(answer.qualifiers(frames["runs"], frames["attribution"]))  # the first screen's
    assert "1 run(s) hold numbers no measurement makes" in said and "vllm-fp16 u4-wide-greedy run1" in said


def test_an_implausible_run_is_listed_with_its_reasons_among_the_runs_to_measure_again(tmp_path):
    from speedsplit.output.failed import failed_results

    good = write_result(
        tmp_path / "bench/tiny/vllm-fp16/tp1/u4-wide-greedy/run0.json", fake_result("vllm-fp16", 4, 0, 100.0)
    )
    res = fake_result("vllm-fp16", 4, 1, 100.0)
    res.summary.output_tok_s = -100.0
    bad = write_result(tmp_path / "bench/tiny/vllm-fp16/tp1/u4-wide-greedy/run1.json", res)
    assert failed_results(tmp_path / "bench") == [(bad, "implausible: negative or not finite: output_tok_s")]
    assert good.exists()
