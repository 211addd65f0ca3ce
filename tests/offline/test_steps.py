"""speedsplit host run / status (speedsplit/offline/steps.py): an evidence folder's steps run
by a runner of their own, each one's outcome recorded, a failing one named with its cause,
and the results packed. Rehearsed on the project's own tree (as a bundle unpacks it) with the
default config's calibration step, a real Snakemake run; command steps with real commands."""

import json
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
from conftest import REPO

from speedsplit.offline import bundle, steps


@pytest.fixture
def project(tmp_path):
    tree = tmp_path / "unpacked" / "project"
    for f in bundle.project_files(REPO):
        (tree / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, tree / f)
    (tmp_path / "unpacked" / "manifest.json").write_text(json.dumps({"commit": "0123abc"}))
    return tree


@pytest.mark.slow
def test_steps_run_in_turn_a_failing_one_is_named_and_the_results_pack(project, tmp_path):
    (tmp_path / "evidence.yaml").write_text(
        "config: [config/config.yaml]\n"
        "steps:\n"
        "  - {name: calibrate, configfile: config/config.yaml, target: results/hardware/calibration.json,\n"
        "     snakemake: [--scheduler, greedy]}\n"
        "  - {name: typo, configfile: [config/config.yaml], target: no-such-target}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "speedsplit.cli", "host", "run", "--steps", str(tmp_path / "evidence.yaml"),
         "--project", str(project)], capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0 and "started 2 steps" in out.stdout, out.stderr
    deadline = time.monotonic() + 300
    while steps.read_record(project)["steps"][-1]["exit_code"] is None:
        lines = steps.status_lines(project)
        assert time.monotonic() < deadline and not lines[0].startswith("the runner has ended"), lines
        time.sleep(1)
    first, second = steps.status_lines(project)[:2]
    assert first.startswith("calibrate: done in"), first
    assert second.startswith("typo: FAILED (exit 1): ") and "no-such-target" in second, second
    assert json.loads((project / "results/hardware/calibration.json").read_text())["levels"]
    packed = steps.pack(project, tmp_path / "out")
    with tarfile.open(packed) as tar:
        names = set(tar.getnames())
    assert {"results/hardware/calibration.json", "results/host/steps.json", "results/host/typo.out"} <= names
    assert not any(n.startswith("results/cache") for n in names)


def test_a_steps_file_with_a_missing_config_or_no_steps_is_refused_in_one_line(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/a.yaml").write_text("{}\n")
    f = tmp_path / "e.yaml"
    f.write_text("config: [config/a.yaml]\n")
    with pytest.raises(steps.StepsError, match="no steps"):
        steps.read_steps(f, tmp_path)
    f.write_text("steps:\n  - {name: a, configfile: config/b.yaml}\n")
    with pytest.raises(steps.StepsError, match=r"steps\[0\] \(a\)\.configfile: .*config/b.yaml does not exist"):
        steps.read_steps(f, tmp_path)
    f.write_text("steps:\n  - {name: a, configfile: config/a.yaml, targets: x}\n")
    with pytest.raises(steps.StepsError, match=r"unknown keys \['targets'\]"):
        steps.read_steps(f, tmp_path)
    f.write_text("steps:\n  - {name: a, configfile: config/a.yaml, target: m, env: {X: 1}}\n")
    (s,) = steps.read_steps(f, tmp_path)
    assert steps.command(s, 2)[1:] == [
        "-m", "snakemake", "--cores", "all", "--resources", "gpu=2", "--configfile", "config/a.yaml", "--", "m"
    ] and s.env == {"X": "1"}  # fmt: skip


def _run_until_done(steps_file, project) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "speedsplit.cli", "host", "run", "--steps", str(steps_file), "--project", str(project)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0 and "started" in out.stdout, out.stderr
    deadline = time.monotonic() + 120
    while steps.read_record(project)["steps"][-1]["exit_code"] is None:
        lines = steps.status_lines(project)
        assert time.monotonic() < deadline and not lines[0].startswith("the runner has ended"), lines
        time.sleep(0.2)
    return steps.status_lines(project)


@pytest.mark.slow
def test_command_steps_run_in_the_project_are_recorded_and_a_failing_one_does_not_stop_the_next(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "evidence.yaml").write_text(
        "steps:\n"
        "  - name: hello\n"
        "    command: [python3, -c, 'import os, sys; print(sys.executable, os.getcwd(), os.environ[\"GREETING\"])']\n"
        "    env: {GREETING: 64}\n"
        "  - {name: fails, command: [bash, -c, 'echo going wrong; exit 3']}\n"
        "  - {name: absent, command: [no-such-program-anywhere, --flag]}\n"
        "  - {name: after, command: [speedsplit, host, --help]}\n"
    )
    lines = _run_until_done(tmp_path / "evidence.yaml", project)
    assert [ln.split(":")[0] for ln in lines] == ["hello", "fails", "absent", "after"], lines
    assert lines[0].startswith("hello: done in") and lines[3].startswith("after: done in"), lines
    assert lines[1].startswith("fails: FAILED (exit 3): going wrong"), lines[1]
    assert lines[2].startswith("absent: FAILED (exit 127): cannot run 'no-such-program-anywhere'"), lines[2]
    records = {s["name"]: s for s in steps.read_record(project)["steps"]}
    assert [records[n]["exit_code"] for n in ("hello", "fails", "absent", "after")] == [0, 3, 127, 0]
    assert records["fails"]["command"] == ["bash", "-c", "echo going wrong; exit 3"]
    assert all(r["started"] <= r["ended"] for r in records.values())
    out = project / "results/host"
    # python3 is the runner's own Python, run in the project folder, with the step's environment
    assert (out / "hello.out").read_text().split() == [sys.executable, str(project.resolve()), "64"]
    assert "going wrong" in (out / "fails.out").read_text()
    assert "usage: speedsplit host" in (out / "after.out").read_text()


def test_a_step_needs_exactly_one_of_configfile_or_command_and_says_so_in_one_line(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/a.yaml").write_text("{}\n")
    f = tmp_path / "e.yaml"
    refused = {
        "{name: a, configfile: config/a.yaml, command: [true]}": r"steps\[0\] \(a\) needs exactly one of .* both",
        "{name: a, env: {X: 1}}": r"steps\[0\] \(a\) needs exactly one of configfile .* or command: it has neither",
        "{name: a, command: 'echo hi'}": r"steps\[0\] \(a\)\.command: a list of arguments",
        "{name: a, command: []}": r"steps\[0\] \(a\)\.command: a list of arguments, got \[\]",
        "{name: a, command: [echo, {x: 1}]}": r"steps\[0\] \(a\)\.command: .* got \{'x': 1\} in it",
        "{name: a, command: [echo], target: m}": r"steps\[0\] \(a\)\.target: only a configfile step",
        "{name: a, command: [echo], snakemake: [-n]}": r"steps\[0\] \(a\)\.snakemake: only a configfile step",
        "{name: a, configfile: config/a.yaml, snakemake: greedy}": r"\(a\)\.snakemake: options, .* got 'greedy' first",
        "{name: a, configfile: config/a.yaml, snakemake: [--configfile, x]}": r"\(a\)\.snakemake: .* under configfile",
        "{name: a/b, command: [echo]}": r"steps\[0\] \(a/b\)\.name: letters, digits",
        "{name: a, command: [echo], env: [X]}": r"steps\[0\] \(a\)\.env: a mapping",
    }
    for step, message in refused.items():
        f.write_text(f"steps:\n  - {step}\n")
        with pytest.raises(steps.StepsError, match=message) as exc:
            steps.read_steps(f, tmp_path)
        assert "\n" not in str(exc.value), step
    f.write_text(
        "steps:\n"
        "  - {name: b, command: [speedsplit, ceiling, --users, 64]}\n"
        "  - {name: c, command: [python, x.py]}\n"
        "  - {name: d, command: [bash, -c, 'echo hi'], env: {A: b}}\n"
        "  - {name: e, configfile: config/a.yaml, target: [x, y], snakemake: [--scheduler, greedy]}\n"
    )
    b, c, d, e = steps.read_steps(f, tmp_path)
    assert steps.command(b, 1) == [sys.executable, "-m", "speedsplit.cli", "ceiling", "--users", "64"]
    assert steps.command(c, 1) == [sys.executable, "x.py"]
    assert steps.command(d, 1) == ["bash", "-c", "echo hi"] and d.env == {"A": "b"}
    assert steps.command(e, 2)[3:] == [
        "--cores", "all", "--resources", "gpu=2", "--scheduler", "greedy", "--configfile", "config/a.yaml", "--", "x", "y"
    ]  # fmt: skip
