"""speedsplit bundle, host and pack as a user types them (speedsplit/cli_offline.py): pack's
request files turned columnar and what it says, and every mistake in what they are given (a
folder or file not there, records that are none, a run's records twice, a part size or Python
version it cannot use) refused in one line before anything is touched. Building a bundle fetches
from the package index (tests/offline/test_bundle.py); the host's steps run in test_host.py."""

import gzip
import json
import subprocess
import sys

import pytest

from conftest import REPO
from speedsplit import cli
from speedsplit.core.requestlog import read_requests

RECORD = {"user": 0, "index": 0, "phase": "measured", "url": "http://127.0.0.1:1", "sent": 0.5, "gaps": [0.25]}
RUN = "bench/tiny/hf-fp16/tp1/u8-wide-greedy"


def _lines(n: int, url: str = "http://127.0.0.1:1") -> str:
    return "".join(
        json.dumps({**RECORD, "index": i, "url": url, "sent": i / 7, "gaps": [i / 3] * 8}) + "\n" for i in range(n)
    )


def _run(capsys, *argv) -> tuple[int, str, str]:
    return cli.main([str(a) for a in argv]), *capsys.readouterr()


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pack_turns_every_runs_request_lines_columnar_and_says_how_much_smaller(tmp_path, capsys):
    run = tmp_path / RUN
    run.mkdir(parents=True)
    (run / "run0.requests.jsonl").write_text(_lines(4000))
    (run / "run1.requests.jsonl.gz").write_bytes(gzip.compress(_lines(3, url="http://127.0.0.1:2").encode()))
    kept = {"run0.json": b"{}", "run2.requests.parquet": b"packed before", "notes.requests.jsonl": b"not a run's"}
    for name, data in kept.items():
        (run / name).write_bytes(data)
    before = (run / "run0.requests.jsonl").stat().st_size + (run / "run1.requests.jsonl.gz").stat().st_size
    expected = {n: read_requests(run / n) for n in ("run0.requests.jsonl", "run1.requests.jsonl.gz")}
    code, out, err = _run(capsys, "pack", "--results", tmp_path)
    after = (run / "run0.requests.parquet").stat().st_size + (run / "run1.requests.parquet").stat().st_size
    assert (code, err) == (0, "")
    assert out == f"2 request files: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, every record read back equal\n"
    assert before > 10 * after and after / 1e6 < 0.1 < before / 1e6  # the line says something
    assert read_requests(run / "run0.requests.parquet") == expected["run0.requests.jsonl"]
    assert read_requests(run / "run1.requests.parquet") == expected["run1.requests.jsonl.gz"]
    assert sorted(p.name for p in run.iterdir()) == sorted([*kept, "run0.requests.parquet", "run1.requests.parquet"])
    assert all((run / n).read_bytes() == data for n, data in kept.items())
    assert _run(capsys, "pack", "--results", tmp_path) == (
        0, "0 request files: 0.0 MB -> 0.0 MB, every record read back equal\n", "",
    )  # fmt: skip


def test_pack_of_a_folder_that_is_not_there_says_so_in_one_line(tmp_path, capsys):
    """It answered that 0 request files had been packed, every record read back equal."""
    for missing in (tmp_path / "results", tmp_path / "file"):
        if missing.name == "file":
            missing.write_text("")
        said = f"speedsplit: no results folder at {missing} (--results names a folder of request records)\n"
        assert _run(capsys, "pack", "--results", missing) == (2, "", said)


def test_pack_refuses_a_run_whose_records_are_there_twice_and_packs_nothing(tmp_path, capsys):
    """Both packed to run0.requests.parquet: the gzipped lines, packed last, replaced the
    lines a reader takes first (the ones the bench job had written), and both were deleted."""
    run = tmp_path / RUN
    run.mkdir(parents=True)
    (run / "run0.requests.jsonl").write_text(_lines(2, url="http://127.0.0.1:9"))
    (run / "run0.requests.jsonl.gz").write_bytes(gzip.compress(_lines(2).encode()))
    (run / "run1.requests.jsonl").write_text(_lines(2))
    before = _files(tmp_path)
    code, out, err = _run(capsys, "pack", "--results", tmp_path)
    lines, gz = run / "run0.requests.jsonl", run / "run0.requests.jsonl.gz"
    assert (code, out, err) == (2, "", f"speedsplit: {lines} and {gz} are both run0's request records: keep one\n")
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    "name, data, why",
    [
        ("run1.requests.jsonl", json.dumps({**RECORD, "phase": "cooldown"}) + "\n",
         "holds no request records (phase: Input should be 'warmup' or 'measured')"),
        ("run1.requests.jsonl", '{"user": 0, "ind', "holds no request records (Invalid JSON: EOF while parsing a string at line 1 column 16)"),
        ("run1.requests.jsonl", json.dumps({**RECORD, "status": "ok"}) + "\n", "holds no request records (status: Extra inputs are not permitted)"),
        ("run1.requests.jsonl.gz", _lines(1), "cannot be packed (Not a gzipped file (b'{\"'))"),
    ],
)  # fmt: skip
def test_pack_names_a_file_that_holds_no_request_records_in_one_line_and_leaves_it(tmp_path, capsys, name, data, why):
    """It ended in a traceback (pydantic's, or gzip's)."""
    run = tmp_path / RUN
    run.mkdir(parents=True)
    (run / "run0.requests.jsonl").write_text(_lines(2))
    (run / name).write_text(data)
    assert _run(capsys, "pack", "--results", tmp_path) == (2, "", f"speedsplit: {run / name} {why}\n")
    assert (run / name).read_text() == data and not (run / "run1.requests.parquet").exists()
    assert len(read_requests(run / "run0.requests.parquet")) == 2  # the run before it: packed whole


def _bundle_dir(folder):
    """A bundle an earlier `speedsplit bundle` wrote (what --out would empty)."""
    folder.mkdir()
    (folder / "SHA256SUMS").write_text(f"{'0' * 64}  bundle.tar.part000\n")
    (folder / "bundle.tar.part000").write_bytes(b"the bundle that took an hour to fetch")
    return folder


@pytest.mark.parametrize("flag", ["--requirements", "--have", "--omit", "--lock"])
def test_bundle_refuses_a_file_that_is_not_there_in_one_line_before_emptying_out(tmp_path, capsys, flag):
    """It emptied --out, then ended in a traceback (FileNotFoundError)."""
    out = _bundle_dir(tmp_path / "bundle")
    (tmp_path / "req.txt").write_text("")
    given = {"--requirements": tmp_path / "req.txt", flag: tmp_path / "absent.txt"}
    argv = [a for kv in given.items() for a in kv]
    before = _files(out)
    said = f"speedsplit: {flag} {tmp_path}/absent.txt: no such file\n"
    assert _run(capsys, "bundle", *argv, "--out", out) == (2, "", said)
    assert _files(out) == before


def test_bundle_names_a_freeze_line_it_cannot_read_in_one_line(tmp_path, capsys):
    (tmp_path / "req.txt").write_text("")
    (tmp_path / "have.txt").write_text("numpy==2.0\nnot a requirement!\n")
    argv = ["bundle", "--requirements", tmp_path / "req.txt", "--have", tmp_path / "have.txt"]
    said = f"speedsplit: {tmp_path}/have.txt: 'not a requirement!' is not a `pip freeze` line\n"
    assert _run(capsys, *argv, "--out", tmp_path / "bundle") == (2, "", said)


@pytest.mark.parametrize(
    "flag, value, why",
    [("--part-mib", "0", "is not a size in MiB above 0"),  # it was taken as the default, 58
     ("--part-mib", "-1", "is not a size in MiB above 0"),  # these failed only after every wheel was fetched
     ("--part-mib", "nan", "is not a size in MiB above 0"),
     ("--part-mib", "inf", "is not a size in MiB above 0"),
     ("--part-mib", "1e-9", "is not a size in MiB above 0"),  # parts of 0 bytes: a bundle of none
     ("--part-mib", "58MB", "is not a size in MiB above 0"),
     ("--python-version", "3", "is not a Python version as major.minor (3.12)"),  # markers read as Python 3.0
     ("--python-version", "3.12.1", "is not a Python version as major.minor (3.12)"),
     ("--python-version", "py3.12", "is not a Python version as major.minor (3.12)")],
)  # fmt: skip
def test_bundle_refuses_a_part_size_or_python_version_it_cannot_use_before_anything(tmp_path, capsys, flag, value, why):
    (tmp_path / "req.txt").write_text("")
    (tmp_path / "have.txt").write_text("not a requirement!\n")  # what stops the build, were the flag taken
    argv = ["bundle", "--requirements", tmp_path / "req.txt", "--have", tmp_path / "have.txt", "--out", tmp_path / "b"]
    with pytest.raises(SystemExit) as exc:
        _run(capsys, *argv, flag, value)
    assert exc.value.code == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("usage: speedsplit bundle ")
    assert said[-1] == f"speedsplit bundle: error: argument {flag}: {value!r} {why}"
    assert not (tmp_path / "b").exists()


def test_bundle_takes_a_part_of_a_byte_or_more_and_a_python_as_major_minor():
    args = cli.parser().parse_args(["bundle", "--part-mib", str(2**-20), "--python-version", "3.13"])
    assert (args.part_mib, args.python_version) == (2**-20, "3.13")
    args = cli.parser().parse_args(["bundle", "--part-mib", "0.25"])
    assert (args.part_mib, args.python_version, args.requirements) == (0.25, "3.12", ["requirements/gpu.txt"])


def test_host_install_names_a_folder_that_is_no_bundle_in_one_line_and_needs_one(tmp_path, capsys):
    said = f"speedsplit: {tmp_path}/SHA256SUMS: missing (is {tmp_path} a speedsplit bundle?)\n"
    assert _run(capsys, "host", "install", "--bundle", tmp_path, "--target", tmp_path / "site") == (2, "", said)
    assert _run(capsys, "host", "install") == (2, "", "speedsplit: speedsplit host install needs --bundle DIR\n")
    assert not (tmp_path / "site").exists() and not (tmp_path / "unpacked").exists()


def test_the_commands_answer_from_the_command_line_in_one_line_and_list_themselves(tmp_path):
    cmd = [sys.executable, "-m", "speedsplit.cli"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*cmd, "pack", "--results", str(tmp_path / "r")], capture_output=True, text=True, env=env)
    said = f"speedsplit: no results folder at {tmp_path / 'r'} (--results names a folder of request records)\n"
    assert (done.returncode, done.stdout, done.stderr) == (2, "", said)
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0
    listed = " ".join(done.stdout.split())
    for name in ("bundle", "host", "pack"):
        assert f"{name} {' '.join(cli.COMMANDS[name][0].split())}" in listed
