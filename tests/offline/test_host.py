"""speedsplit host (speedsplit/offline/host.py, the bundle's install.py, and the run and status
it drives through speedsplit/offline/steps.py): a hand-made bundle of one wheel installed from
its checked parts, steps run by a runner of their own on short commands, their records read back."""

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
from conftest import REPO

from speedsplit import cli
from speedsplit.core.requestlog import RequestRecord, read_requests
from speedsplit.offline import host, steps

WHEEL = "sitemark-1.0-py3-none-any.whl"
INFO = "sitemark-1.0.dist-info/"
WHEEL_FILES = {
    "sitemark.py": "HERE = 'site'\n",
    INFO + "METADATA": "Metadata-Version: 2.1\nName: sitemark\nVersion: 1.0\n",
    INFO + "WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    INFO + "RECORD": "sitemark.py,,\n" + "".join(f"{INFO}{n},,\n" for n in ("METADATA", "WHEEL", "RECORD")),
}


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in WHEEL_FILES.items():
            z.writestr(name, text)
    return buf.getvalue()


def _bundle(d, wheel: bytes, listed_sha: str | None = None):
    """A bundle as `speedsplit bundle` lays one out: its archive in two parts, SHA256SUMS, install.py."""
    shadow = {"name": "sitemark", "bundled": "1.0", "host": "0.9", "why": "older"}
    manifest = {"wheels": [{"file": WHEEL, "sha256": listed_sha or hashlib.sha256(wheel).hexdigest()}]}
    content = {"manifest.json": json.dumps({**manifest, "shadows": [shadow]}).encode(), f"wheels/{WHEEL}": wheel}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {**content, "project/Snakefile": b"\n"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    whole = buf.getvalue()
    named = {"bundle.tar.part000": whole[:5000], "bundle.tar.part001": whole[5000:], "bundle.tar": whole}
    d.mkdir()
    (d / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in named.items()))
    for name in ("bundle.tar.part000", "bundle.tar.part001"):
        (d / name).write_bytes(named[name])
    shutil.copy(host.__file__, d / "install.py")
    return d


def _ended(pid: int, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # a runner that start() began in this process is reaped here
        try:
            if open(f"/proc/{pid}/stat").read().split(") ")[-1][0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(autouse=True)
def runners_end(tmp_path, monkeypatch):
    """The runner's environment made exact; every runner a test started gone by its end."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    for name in ("HF_HUB_OFFLINE", "SPEEDSPLIT_WORKFLOW_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    yield
    left = [int(p.read_text()) for p in tmp_path.rglob("runner.pid") if not _ended(int(p.read_text()))]
    for pid in left:
        os.killpg(pid, signal.SIGKILL)
    assert not left, f"runners still running at the test's end: {left}"


def _host(capsys, *args) -> tuple[int, str, str]:
    return cli.main(["host", *map(str, args)]), *capsys.readouterr()


def _project(tmp_path, *step_lines: str):
    """The project as a bundle unpacks it (its commit in the manifest beside it); e.yaml its steps."""
    project = tmp_path.resolve() / "unpacked" / "project"
    project.mkdir(parents=True)
    (tmp_path / "unpacked" / "manifest.json").write_text('{"commit": "0123abc"}')
    (tmp_path / "e.yaml").write_text("steps:\n" + "".join(f"  - {s}\n" for s in step_lines))
    return project


def _seconds(lines: list[str]) -> list[str]:
    """Status lines with their durations as N (what a loaded machine may stretch)."""
    return [re.sub(r"\b\d+ s\b", "N s", ln) for ln in lines]


def _finish(project) -> list[str]:
    assert _ended(int((project / "results/host/runner.pid").read_text()))
    return steps.status_lines(project)


@pytest.mark.slow
def test_the_bundles_install_py_alone_checks_the_parts_and_installs_the_listed_wheels_into_the_target(tmp_path):
    d = _bundle(tmp_path / "bundle", _wheel())
    site = tmp_path / "site"
    argv = [sys.executable, "-I", str(d / "install.py"), "install", "--target", str(site)]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env={})
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout.splitlines() == [
        f"installed 1 wheels from {d} into {site}",
        f"the workflow: {d / 'unpacked/project'}",
        "  sitemark 1.0 shadows the host's 0.9 (older)",
    ]
    assert (site / "sitemark.py").read_text() == "HERE = 'site'\n"
    assert (d / "unpacked/project/Snakefile").is_file() and not (d / "bundle.tar").exists()


def test_install_names_a_missing_or_damaged_part_or_wheel_in_one_line_and_installs_nothing(tmp_path, capsys):
    site = tmp_path / "site"
    a = _bundle(tmp_path / "a", _wheel(), listed_sha="0" * 64)
    b = _bundle(tmp_path / "b", _wheel())
    (b / "bundle.tar.part001").write_bytes((b / "bundle.tar.part001").read_bytes() + b"x")
    c = _bundle(tmp_path / "c", _wheel())
    (c / "bundle.tar.part000").unlink()
    refused = {
        a: f"{a}/unpacked/wheels/{WHEEL}: missing or altered (the manifest lists its sha256)",
        b: f"{b}/bundle.tar.part001: its sha256 differs from SHA256SUMS (damaged in transfer?)",
        c: f"{c}/bundle.tar.part000: missing (the bundle has 2 parts)",
        tmp_path: f"{tmp_path}/SHA256SUMS: missing (is {tmp_path} a speedsplit bundle?)",
    }
    for bundle, message in refused.items():
        assert host.main(["install", "--bundle", str(bundle), "--target", str(site)]) == 2
        assert capsys.readouterr().err == f"install: {message}\n"
    assert _host(capsys, "install", "--bundle", c) == (2, "", f"speedsplit: {refused[c]}\n")
    assert not site.exists()


@pytest.mark.slow
def test_a_wheel_pip_refuses_is_reported_with_pips_own_last_line(tmp_path):
    d = _bundle(tmp_path / "bundle", b"not a zip")
    with pytest.raises(host.BundleError) as exc:
        host.install(d, tmp_path / "site")
    wheel = d / "unpacked/wheels" / WHEEL
    assert str(exc.value) == f"pip install failed: ERROR: Wheel 'sitemark' located at {wheel} is invalid."


def test_host_refuses_a_missing_steps_file_or_flag_and_a_project_never_run_in_one_line(tmp_path, capsys):
    no, here = tmp_path / "no.yaml", tmp_path.resolve()
    absent = f"speedsplit: {no}: [Errno 2] No such file or directory: '{no}'\n"
    assert _host(capsys, "run", "--steps", no) == (2, "", absent)
    assert _host(capsys, "run") == (2, "", "speedsplit: speedsplit host run needs --steps FILE\n")
    assert _host(capsys, "install") == (2, "", "speedsplit: speedsplit host install needs --bundle DIR\n")
    never = f"speedsplit: {here}/results/host/steps.json: no steps have run in {here} (speedsplit host run)\n"
    assert _host(capsys, "status", "--project", tmp_path) == (2, "", never)
    with pytest.raises(SystemExit) as exc:
        _host(capsys, "stop")
    assert exc.value.code == 2
    choices = r"invalid choice: 'stop' \(choose from '?install'?, '?run'?, '?status'?\)\n$"  # quoted before 3.12.8
    assert re.search(r"speedsplit host: error: argument action: " + choices, capsys.readouterr().err)
    assert not (tmp_path / "results").exists()


PROBE = """import os, sys, sitemark
print(sys.executable, os.getcwd(), *(os.environ[k] for k in ("PYTHONPATH", "HF_HUB_OFFLINE",
      "SPEEDSPLIT_WORKFLOW_COMMIT")), sitemark.__file__)
"""


@pytest.mark.slow
def test_run_returns_at_once_and_its_runner_runs_python_steps_on_its_own_python_with_the_site_first(tmp_path, capsys):
    gate = "{name: gate, command: [bash, -c, 'until [ -e go ]; do sleep 0.05; done']}"
    project = _project(tmp_path, gate, "{name: probe, command: [python, probe.py]}")
    (project / "probe.py").write_text(PROBE)
    site = tmp_path.resolve() / "site"
    site.mkdir()
    (site / "sitemark.py").write_text("")
    code, out, err = _host(capsys, "run", "--steps", tmp_path / "e.yaml", "--project", project, "--site", site)
    pid = int((project / "results/host/runner.pid").read_text())
    started = f"started 2 steps in {project} (runner pid {pid}): speedsplit host status --project {project}\n"
    assert (code, out, err) == (0, started, "")
    assert os.getsid(pid) == pid  # a session of its own: it outlives the shell that started it
    deadline = time.monotonic() + 20
    while steps.read_record(project)["steps"][0]["started"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _seconds(steps.status_lines(project)) == ["gate: running for N s: ", "probe: waiting"]
    (project / "go").touch()
    assert _seconds(_finish(project)) == ["gate: done in N s", "probe: done in N s"]
    said = (project / "results/host/probe.out").read_text().split()
    assert said == [sys.executable, str(project), f"{site}:{project}:{REPO}", "1", "0123abc", str(site / "sitemark.py")]


@pytest.mark.slow
def test_a_relative_site_is_the_folder_where_run_was_given(tmp_path, capsys, monkeypatch):
    project = _project(tmp_path, "{name: probe, command: [python, -c, 'import sitemark']}")
    (tmp_path / "site").mkdir()
    (tmp_path / "site/sitemark.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert _host(capsys, "run", "--steps", "e.yaml", "--project", project, "--site", "site")[0] == 0
    assert _seconds(_finish(project)) == ["probe: done in N s"]


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["project", "site"])
def test_run_refuses_a_missing_project_or_site_folder_in_one_line_and_starts_nothing(tmp_path, capsys, missing):
    _project(tmp_path, "{name: a, command: [bash, -c, 'echo hi']}")
    folders = {"project": tmp_path / "unpacked/project", "site": tmp_path, missing: tmp_path / "absent"}
    args = ["--project", folders["project"], "--site", folders["site"]]
    code, out, err = _host(capsys, "run", "--steps", tmp_path / "e.yaml", *args)
    assert (code, out, err.count("\n")) == (2, "", 1) and str(tmp_path / "absent") in err
    assert not (tmp_path / "absent").exists() and not list(tmp_path.rglob("runner.pid"))


@pytest.mark.slow
def test_status_says_the_runner_ended_with_steps_unfinished_and_where_each_stood(tmp_path, capsys):
    die = "{name: die, command: [bash, -c, 'echo about to go; kill -9 $PPID']}"
    project = _project(tmp_path, die, "{name: next, command: [bash, -c, 'echo never']}")
    assert _host(capsys, "run", "--steps", tmp_path / "e.yaml", "--project", project)[0] == 0
    assert _seconds(_finish(project)) == [
        "the runner has ended with steps unfinished: ",
        "die: running for N s: about to go",
        "next: waiting",
    ]
    assert not (project / "results/host/next.out").exists()


RECORD = '{"user": 0, "index": 0, "phase": "measured", "url": "u", "sent": 0.5, "gaps": [0.25]}\n'
RESULTS = {
    "bench/m/run0.json": '{"status": "ok"}',
    "bench/m/run1.json": '{"status": "failed"}',
    "bench/m/run2.json": "{",
    "bench/m/run0.requests.jsonl": RECORD,
    "tables/t.csv": "a\n",
    "cache/x": "",
    "traces/y.json": "",
}


@pytest.mark.slow
def test_status_pack_counts_cells_and_archives_results_but_caches_and_traces_with_requests_packed(tmp_path, capsys):
    project = _project(tmp_path, "{name: fails, command: [bash, -c, 'echo first; echo gone wrong; exit 3']}")
    assert _host(capsys, "run", "--steps", tmp_path / "e.yaml", "--project", project)[0] == 0
    _finish(project)
    for name, text in RESULTS.items():
        (project / "results" / name).parent.mkdir(parents=True, exist_ok=True)
        (project / "results" / name).write_text(text)
    code, out, err = _host(capsys, "status", "--project", project, "--pack", tmp_path / "out")
    assert (code, err) == (0, "")
    assert _seconds(out.splitlines()) == [
        "fails: FAILED (exit 3): gone wrong in N s",
        "cells: 1 failed, 1 ok, 1 unreadable",
        f"packed: {tmp_path / 'out/results.tar.gz'}",
    ]
    with tarfile.open(tmp_path / "out/results.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    bench = ["run0.json", "run0.requests.parquet", "run1.json", "run2.json"]
    host_files = ["fails.out", "runner.out", "runner.pid", "steps.json"]
    expected = [f"bench/m/{n}" for n in bench] + [f"host/{n}" for n in host_files] + ["tables/t.csv"]
    assert names == [f"results/{n}" for n in expected]
    packed = read_requests(project / "results/bench/m/run0.requests.parquet")
    assert packed == [RequestRecord.model_validate_json(RECORD)]
    assert not (project / "results/bench/m/run0.requests.jsonl").exists()
