"""The run's closing summary: the answer, every failed run with its cause, and a failed run
when a chain could not be decomposed."""

from records import fake_result, write_result

from speedsplit.core.record import ErrorInfo
from speedsplit.output import aggregate, summary

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}


def results_dir(tmp_path, marlin_status="ok"):
    root = tmp_path / "results"
    paths = []
    for stack, tok_s in (("hf-fp16", 100.0), ("vllm-fp16", 200.0), ("vllm-marlin", 300.0)):
        for run in (0, 1):
            ok = stack != "vllm-marlin" or marlin_status == "ok"
            res = fake_result(stack, 8, run, tok_s + run if ok else None, status="ok" if ok else marlin_status)
            if not ok:
                res.error = ErrorInfo(type="ServerError", message="4 x http_500 (http_500: no cpu_gemm_wna16)")
                res.server.error = None  # the session served; its requests failed
            paths.append(write_result(root / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run{run}.json", res))
    aggregate.write_tables(paths, root / "tables", chains=CHAINS)
    return root


def test_a_decomposed_run_says_its_answer_and_passes(tmp_path, capsys):
    root = results_dir(tmp_path)
    assert summary.close_run(root) is None
    err = capsys.readouterr().err
    assert (
        "study (hf-fp16 → vllm-fp16 → vllm-marlin)" in err
        and "NOT DECOMPOSED" not in err
        and "did not measure" not in err
    )


def test_a_chain_with_a_failed_stack_names_the_cause_and_fails_the_run(tmp_path, capsys):
    root = results_dir(tmp_path, marlin_status="server_error")
    reason = summary.close_run(root)
    err = capsys.readouterr().err
    assert reason and "not every chain could be decomposed" in reason
    assert "NOT DECOMPOSED: study at u8-wide-greedy" in err
    assert "vllm-marlin: 2 run(s); server_error: 4 x http_500 (http_500: no cpu_gemm_wna16)" in err
    assert summary.close_run(root, fail_on_undecomposed=False) is None


def test_a_failed_run_is_answered_with_the_command_that_remeasures_it(tmp_path, capsys):
    root = results_dir(tmp_path, marlin_status="server_error")
    summary.close_run(root, fail_on_undecomposed=False, run_args=["--configfile", "my run.yaml", "--cores", "all"])
    err = capsys.readouterr().err
    assert "re-measure them: speedsplit failed --rerun -- --configfile 'my run.yaml' --cores all" in err
    assert "a plain rerun measures nothing again" in err
    cli = ["/x/bin/snakemake", "results/report.html", "--cores", "2", "--resources", "gpu=1"]
    assert summary.snakemake_args(cli) == ["--cores", "2", "--resources", "gpu=1"]  # its targets left out
    assert summary.snakemake_args(["/usr/lib/python3/site-packages/snakemake/__main__.py", "-n"]) == ["-n"]
    assert summary.snakemake_args(["pytest", "-q"]) is None


def test_the_first_of_two_rerun_runs_leaves_the_summary_to_the_second(tmp_path, capsys, monkeypatch):
    from speedsplit.output.failed import REMEASURE_ENV

    root = results_dir(tmp_path, marlin_status="server_error")
    monkeypatch.setenv(REMEASURE_ENV, "1")
    assert summary.close_run(root) is None  # the stale tables fail nothing
    err = capsys.readouterr().err
    assert "re-measured; the tables, report and summary follow" in err and "NOT DECOMPOSED" not in err
