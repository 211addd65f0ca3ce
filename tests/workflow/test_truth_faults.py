"""The truth tier's faults: servers of known speed that each go wrong one way
(tests/config/truth-faults.yaml): HTTP errors, cut connections, short answers, a request held
silent below the stall timeout, usage that disagrees with the stream. Each must be flagged with
its cause and reach no factor and no answer."""

import shutil

import polars as pl
import pytest
from conftest import REPO, run_snakemake

from speedsplit.output import truth
from speedsplit.core.formats import read_frame
from speedsplit.core.record import read_result
from speedsplit.output import analyses
from speedsplit.planning import config as C


@pytest.fixture(scope="module")
def faults_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("truth-faults")
    shutil.copy(REPO / "tests/config/truth-faults.yaml", wd / "faults.yaml")
    out = run_snakemake(["--configfile", "faults.yaml", "--cores", "2", "--resources", "gpu=3"], wd, timeout=900)
    (wd / "snakemake.out").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    cfg = C.load(wd / "faults.yaml")
    table = truth.compare(sorted((wd / "results/bench").rglob("run*.json")), **analyses.analysis_spec(cfg))
    return wd, table


@pytest.mark.slow
@pytest.mark.snakemake
def test_each_fault_is_flagged_with_its_cause_and_kept_out_of_every_number(faults_run):
    wd, table = faults_run
    faults = table.filter(pl.col("kind") == "fault")
    assert sorted(set(faults["metric"])) == [
        "drop_every", "error_every", "overclaim_every", "short_every", "stall_every", "usage_factor"
    ]  # fmt: skip
    assert faults["within"].all(), faults.select("what", "note").to_dicts()
    # the causes in the records: HTTP 500 answers, cut connections, short answers, a request held
    # silent far longer than its length predicts, usage that says twice what was streamed
    causes = {}
    for path in sorted((wd / "results/bench/tiny").glob("ref-*/tp1/u8-truth-greedy/run*.json")):
        res = read_result(path)
        causes.setdefault(res.stack, set()).update(res.summary.failures)
        if res.stack == "ref-stall":
            assert res.summary.latency_outliers >= 1 and res.summary.failed == 0
        if res.stack == "ref-usage":
            assert res.summary.usage_mismatch == res.summary.completed
            assert res.summary.output_tokens == res.summary.completed * res.job.cell.output_tokens  # from the stream
        if res.stack == "ref-overclaim":  # no running count: its text says 12 where usage claims 16
            assert res.summary.usage_mismatch >= 1 and res.summary.wrong_output_length == res.summary.usage_mismatch
    assert causes["ref-error"] == {"http_500"} and causes["ref-drop"] == {"connection"}
    # nothing of them reaches a number: the chain of faults is not decomposed, each reason said
    answer = read_frame(wd / "results/tables/answer.parquet")
    said = answer.filter(pl.col("chain") == "faults")["sentence"].to_list()
    assert said and all("not decomposable" in s for s in said)
    for stack, flag in (
        ("ref-error", "request_failures"),
        ("ref-drop", "request_failures"),
        ("ref-short", "output_length_mismatch"),
        ("ref-stall", "latency_outlier"),
        ("ref-usage", "usage_mismatch"),
    ):
        assert f"{stack}: no clean run (run0: {flag}, run1: {flag})" in said[0]
    overclaim = said[0].split("ref-overclaim: no clean run (")[1].split(")")[0]
    assert overclaim.count("usage_mismatch") == 2, overclaim  # both runs, beside the lengths it got wrong
    attribution = read_frame(wd / "results/tables/attribution.parquet")
    assert attribution.filter(pl.col("chain") == "faults")["value"].drop_nulls().is_empty()
    out = (wd / "snakemake.out").read_text()
    assert "had a request far slower than its length predicts" in out  # the terminal says so


@pytest.mark.slow
@pytest.mark.snakemake
def test_a_run_that_fails_for_its_undecomposed_chain_ends_on_the_reason_not_a_traceback(faults_run):
    """The same finished run, with benchmark.fail_on_undecomposed on: nothing reruns, the run
    fails, and its terminal's last line is the reason (not Snakemake's trace of an exception
    raised in onsuccess)."""
    wd, _ = faults_run
    (wd / "strict.yaml").write_text("benchmark: {fail_on_undecomposed: true}\n")
    before = {p: p.stat().st_mtime_ns for p in (wd / "results/bench").rglob("run*.json")}
    out = run_snakemake(
        ["--configfile", "faults.yaml", "strict.yaml", "--cores", "2", "--resources", "gpu=3"], wd, timeout=300
    )
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 1, said[-20:]
    assert said[-1] == (
        "speedsplit: not every chain could be decomposed (see above); benchmark.fail_on_undecomposed: false accepts that"
    )
    assert "Traceback" not in out.stderr and "WorkflowError" not in out.stderr
    assert {p: p.stat().st_mtime_ns for p in (wd / "results/bench").rglob("run*.json")} == before  # none reran
