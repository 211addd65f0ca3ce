"""A mistake in what the user gave is one line naming it, never a traceback: from speedsplit's
commands (exit 2) and from a workflow job (the line on the terminal, the traceback in its log)."""

import subprocess
import sys

from conftest import REPO, fill
from records import fake_result, write_result

from speedsplit import cli


def _said(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_a_truncated_result_is_one_line_naming_its_file(tmp_path, capsys):
    path = write_result(
        tmp_path / "bench/tiny/hf-fp16/tp1/u8-wide-greedy/run0.json", fake_result("hf-fp16", 8, 0, 100.0)
    )
    path.write_text(path.read_text()[:200])  # a copy cut short
    assert cli.main(["aggregate", "--results", str(tmp_path)]) == 2
    said = _said(capsys)[-1]  # after what the config's chain lacks (vllm-fp16, vllm-marlin)
    assert said.startswith(f"speedsplit: result file {path} is corrupt or truncated (Unterminated string")


def test_a_config_whose_chains_name_none_of_the_stacks_measured_is_one_line(tmp_path, capsys):
    for stack in ("mine-a", "mine-b"):
        write_result(tmp_path / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run0.json", fake_result(stack, 8, 0, 100.0))
    assert cli.main(["aggregate", "--results", str(tmp_path)]) == 2
    said = _said(capsys)
    assert said == [
        "speedsplit: the config's chains (study) name none of the stacks these results hold (mine-a, mine-b): "
        "give the config they were measured with (--configfile)"
    ]


def test_aggregate_says_which_chains_its_results_leave_undecomposed(tmp_path, capsys):
    for stack in ("hf-fp16", "vllm-fp16"):
        for run in (0, 1):
            write_result(
                tmp_path / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run{run}.json", fake_result(stack, 8, run, 100.0)
            )
    (tmp_path / "more.yaml").write_text("chains: {references: [hf-generate, hf-generate-b64]}\n")
    assert cli.main(["aggregate", "--results", str(tmp_path), "--configfile", str(tmp_path / "more.yaml")]) == 0
    said = capsys.readouterr().err
    assert "speedsplit: chain study: no results of vllm-marlin; its factors through them are undefined" in said
    assert "speedsplit: chains with no stack measured here, not in the tables: references" in said


def test_checking_a_report_that_is_not_there_or_without_chromium_is_one_line(tmp_path, capsys, monkeypatch):
    assert cli.main(["check-report", str(tmp_path / "report.html")]) == 2
    assert _said(capsys) == [
        f"speedsplit: no report at {tmp_path / 'report.html'} (the workflow or `speedsplit aggregate` writes one)"
    ]
    (tmp_path / "report.html").write_text("<html></html>")
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium on it
    assert cli.main(["check-report", str(tmp_path / "report.html")]) == 2
    assert _said(capsys) == [
        "speedsplit: checking a report needs headless Chromium, not installed here (Debian: apt-get install chromium)"
    ]


def test_a_job_that_meets_a_users_mistake_says_it_in_one_line_and_logs_the_traceback(tmp_path):
    """As a workflow script does: to_log(snakemake), then the library raises."""
    log = tmp_path / "job.log"
    bad = tmp_path / "run0.json"
    bad.write_text("{")
    script = f"""
import sys
sys.path.insert(0, {str(REPO / "workflow_scripts")!r})
from _job import to_log
class Job:
    log = [{str(log)!r}]
to_log(Job())
from speedsplit.core.record import read_result
read_result({str(bad)!r})
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"speedsplit: result file {bad} is corrupt or truncated (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    ]
    logged = log.read_text()
    assert "Traceback (most recent call last)" in logged and "ResultError" in logged


def test_a_config_file_that_is_not_yaml_is_one_line_naming_its_line(tmp_path, capsys):
    bad = tmp_path / "mine.yaml"
    bad.write_text("grid:\n  runs: 2\n  cells: [{users: 1\n")  # the flow mapping never closed
    assert cli.main(["estimate", "--configfile", str(bad)]) != 0
    said = _said(capsys)
    assert said == [
        f"speedsplit: config file {bad} line 4, column 1 is not valid YAML: expected ',' or '}}', but got '<stream end>'"
    ]


def test_a_job_whose_log_is_on_a_full_disk_still_ends_as_its_work_did(tmp_path, small_disk):
    """The job's log on a full filesystem: the job's exit is its own (Python's "lost
    sys.stderr" made it 120, and Snakemake deleted the result the job had written), and what
    it prints reaches the terminal with one line saying why."""
    log = small_disk / "job.log"
    script = f"""
import sys
sys.path.insert(0, {str(REPO / "workflow_scripts")!r})
from _job import to_log
class Job:
    log = [{str(log)!r}]
to_log(Job())
print("the cell's finished line")
sys.stdout.write("a line without its end")
open({str(tmp_path / "result.json")!r}, "w").write("{{}}")
"""
    fill(small_disk, 0)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = out.stderr.splitlines()
    assert (
        said[0]
        == f"[speedsplit] the job's log {log} cannot be written (No space left on device): its output follows here"
    )
    assert said[1:] == ["the cell's finished line", "a line without its end"]
    assert (tmp_path / "result.json").read_text() == "{}"


def test_failed_and_summary_of_a_folder_that_is_not_there_say_so_in_one_line(tmp_path, capsys):
    """Not 'no failed runs' with exit 0 about a folder that does not exist (or holds no results)."""
    missing = tmp_path / "no/such/folder"
    for command in ("failed", "summary"):
        assert cli.main([command, "--results", str(missing)]) == 2
        assert _said(capsys) == [
            f"speedsplit: no results folder at {missing} (--results names the folder the workflow wrote)"
        ]
    (tmp_path / "empty").mkdir()
    assert cli.main(["failed", "--results", str(tmp_path / "empty")]) == 2
    assert _said(capsys) == [
        f"speedsplit: {tmp_path / 'empty'} is no results folder: it holds neither bench/ nor tables/"
    ]
