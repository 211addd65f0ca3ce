"""The steps an evidence folder is measured with, run on the host from an installed bundle:

    speedsplit host run --steps docs/evidence/NAME/evidence.yaml [--project DIR] [--site SITE]
    speedsplit host status [--project DIR] [--pack OUT]

`steps:` in the file lists what to run, one after another: a Snakemake run, with its config
files, its target or targets (default: the workflow's default), Snakemake's own options beyond
`--cores all --resources gpu=<the host's cards>` (a later option wins) and its environment, or a
command, an argument list with its environment (a step is one or the other):

    steps:
      - name: fp8
        configfile: [config/h200-smoke.yaml, config/h200-fp8.yaml]
        target: measurements
        snakemake: [--scheduler, greedy]
        env: {VLLM_USE_FLASHINFER_SAMPLER: "0"}
      - name: ceiling
        command: [speedsplit, ceiling, --users, 64]

A command runs as given, in the project folder, but for its first word: `python` and `python3`
are the runner's own Python (the one its Snakemake runs on) and `speedsplit` is
`python -m speedsplit.cli` on it (inside a `bash -c` line, `python3` is whichever the PATH
finds). Either kind of step is recorded the same way (below).

`run` returns at once: a runner in its own session (it outlives the shell that started it)
runs the steps in the project folder and records each one's start, end and exit code in
results/host/steps.json, its output in results/host/<name>.out. A failing step is recorded
and the next one runs. `status` says what each step did or is doing (its output's last line)
and how the cells stand; with --pack, it packs the request records (`speedsplit pack`) and
writes results (no caches, no models) and the step records to OUT/results.tar.gz.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from speedsplit.core.errors import UserError
from speedsplit.core.results import write_json_atomic

RECORDS = Path("results/host")
LEFT_BEHIND = (
    "results/cache",
    "results/traces",
)  # compile caches (large, rebuilt by any server) and raw profiler traces (their splits are in the results)


class StepsError(UserError, ValueError):
    """A steps file that cannot be run, and why (one line)."""


KEYS = {"name", "configfile", "command", "target", "snakemake", "env"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # its output is results/host/<name>.out


@dataclass
class Step:
    """A Snakemake run (configfile, target: targets, snakemake: its options) or a command (its
    argv), never both."""

    name: str
    configfile: list[str] = field(default_factory=list)
    target: list[str] = field(default_factory=list)
    snakemake: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None


def read_steps(path: str | Path, project: Path) -> list[Step]:
    """The file's steps, each config file checked to exist in the project."""
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise StepsError(f"{path}: {exc}") from None
    raw = doc.get("steps")
    if not isinstance(raw, list) or not raw:
        raise StepsError(f"{path}: no steps (a list under 'steps:')")
    steps, names = [], set()
    for i, s in enumerate(raw):
        step = _step(f"{path}: steps[{i}]", s, project)
        if step.name in names:
            raise StepsError(f"{path}: steps[{i}]: a second step named {step.name!r}")
        names.add(step.name)
        steps.append(step)
    return steps


def _words(where: str, value, what: str) -> list[str]:
    """A string or a list of strings (numbers read as YAML gives them: 64 is '64')."""
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not words:
        raise StepsError(f"{where}: {what}, got {value!r}")
    for w in words:
        if isinstance(w, bool) or not isinstance(w, str | int | float):
            raise StepsError(f"{where}: {what}, got {w!r} in it")
    return [str(w) for w in words]


def _step(where: str, s, project: Path) -> Step:
    """One entry of steps:, checked; where names it (file and index) in every error."""
    if not isinstance(s, dict) or not s.get("name"):
        raise StepsError(f"{where} needs a name, and a configfile or a command")
    where = f"{where} ({s['name']})"
    unknown = set(s) - KEYS
    if unknown:
        raise StepsError(f"{where} has unknown keys {sorted(unknown)}")
    if not NAME.fullmatch(str(s["name"])):
        raise StepsError(f"{where}.name: letters, digits, '.', '_' and '-' only (it names results/host/NAME.out)")
    kinds = [k for k in ("configfile", "command") if s.get(k) is not None]
    if len(kinds) != 1:
        got = "both" if kinds else "neither"
        raise StepsError(f"{where} needs exactly one of configfile (a Snakemake run) or command: it has {got}")
    env = s.get("env") or {}
    if not isinstance(env, dict):
        raise StepsError(f"{where}.env: a mapping of variable to value, got {env!r}")
    env = {str(k): str(v) for k, v in env.items()}
    if s.get("command") is not None:
        if isinstance(s["command"], str):
            raise StepsError(f"{where}.command: a list of arguments ([bash, -c, LINE] for a shell line), not a string")
        for key in ("target", "snakemake"):
            if s.get(key) is not None:
                raise StepsError(f"{where}.{key}: only a configfile step has one (a command names its own)")
        return Step(str(s["name"]), command=_words(f"{where}.command", s["command"], "a list of arguments"), env=env)
    files = _words(f"{where}.configfile", s["configfile"], "a file or a list of files")
    for f in files:
        if not (project / f).is_file():
            raise StepsError(f"{where}.configfile: {project / f} does not exist")
    target = [] if s.get("target") is None else _words(f"{where}.target", s["target"], "a target or a list of them")
    options = [] if s.get("snakemake") is None else _words(f"{where}.snakemake", s["snakemake"], "a list of options")
    if options and not options[0].startswith("-"):
        raise StepsError(f"{where}.snakemake: options, starting with one ('--scheduler'), got {options[0]!r} first")
    if {"--configfile", "--configfiles"} & {o.split("=")[0] for o in options}:
        raise StepsError(f"{where}.snakemake: the step's config files go under configfile, not --configfile")
    return Step(str(s["name"]), configfile=files, target=target, snakemake=options, env=env)


def _record(project: Path, steps: list[Step], **extra) -> None:
    write_json_atomic(project / RECORDS / "steps.json", {"steps": [asdict(s) for s in steps], **extra})


def read_record(project: Path) -> dict:
    path = project / RECORDS / "steps.json"
    if not path.is_file():
        raise StepsError(f"{path}: no steps have run in {project} (speedsplit host run)")
    return json.loads(path.read_text())


def _commit(project: Path) -> str | None:
    """The measured commit: the bundle's manifest beside the project (its copy has no .git)."""
    manifest = project.parent / "manifest.json"
    return json.loads(manifest.read_text()).get("commit") if manifest.is_file() else None


def environment(project: Path, site: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, str(project), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    if not (project / ".git").exists() and _commit(project):
        env.setdefault("SPEEDSPLIT_WORKFLOW_COMMIT", _commit(project))
    return env


def _gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))


def command(step: Step, gpus: int) -> list[str]:
    """What a step runs: Snakemake on its config files, or its command (speedsplit and python
    on the runner's own Python)."""
    if step.command:
        first, rest = step.command[0], step.command[1:]
        if first == "speedsplit":
            return [sys.executable, "-m", "speedsplit.cli", *rest]
        return [sys.executable, *rest] if first in ("python", "python3") else list(step.command)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "all", "--resources", f"gpu={gpus}"]
    cmd += [*step.snakemake, "--configfile", *step.configfile]
    return cmd + (["--", *step.target] if step.target else [])


def start(steps_file: str | Path, project: str | Path, site: str | None = None) -> Path:
    """Check the steps and start their runner in its own session; the folder of its records."""
    project = Path(project).resolve()
    if not project.is_dir():
        raise StepsError(f"the project folder {project} does not exist: give --project the checkout to run in")
    if site is not None:  # read from where run was given, not from the project the runner runs in
        site = str(Path(site).resolve())
        if not Path(site).is_dir():
            raise StepsError(f"the site folder {site} does not exist: give --site the folder the bundle installed into")
    steps = read_steps(steps_file, project)
    records = project / RECORDS
    records.mkdir(parents=True, exist_ok=True)
    _record(project, steps, steps_file=str(steps_file), runner=None)
    with open(records / "runner.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "speedsplit.offline.steps", str(Path(steps_file).resolve()), str(project)],
            cwd=project,
            env=environment(project, site),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (records / "runner.pid").write_text(f"{proc.pid}\n")
    print(
        f"started {len(steps)} steps in {project} (runner pid {proc.pid}): speedsplit host status --project {project}"
    )
    return records


def run_all(steps_file: str | Path, project: Path) -> int:
    """The runner: every step in turn, each one's start, end and exit code recorded."""
    steps = read_steps(steps_file, project)
    gpus = _gpus()
    for step in steps:
        step.started = time.time()
        _record(project, steps, steps_file=str(steps_file), runner=os.getpid())
        with open(project / RECORDS / f"{step.name}.out", "ab") as out:
            env = {**os.environ, **step.env}
            argv = command(step, gpus)
            try:
                code = subprocess.run(argv, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            except OSError as exc:  # a command that cannot start: recorded as a shell would
                out.write(f"cannot run {argv[0]!r}: {exc}\n".encode())
                code = 127
        step.ended, step.exit_code = time.time(), code
        _record(project, steps, steps_file=str(steps_file), runner=os.getpid())
    return 0 if all(s.exit_code == 0 for s in steps) else 1


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _runner_alive(project: Path) -> bool:
    try:
        pid = int((project / RECORDS / "runner.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:  # a zombie (its parent has not reaped it yet) has ended
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return True


def status_lines(project: str | Path) -> list[str]:
    project = Path(project).resolve()
    rec = read_record(project)
    now, lines = time.time(), []
    unfinished = any(s["exit_code"] is None for s in rec["steps"])
    if unfinished and not _runner_alive(project):
        lines.append(f"the runner has ended with steps unfinished: {_last_line(project / RECORDS / 'runner.out')}")
    for s in rec["steps"]:
        out = project / RECORDS / f"{s['name']}.out"
        if s["exit_code"] is not None:
            how = "done" if s["exit_code"] == 0 else f"FAILED (exit {s['exit_code']}): {_last_line(out)}"
            lines.append(f"{s['name']}: {how} in {s['ended'] - s['started']:.0f} s")
        elif s["started"] is not None:
            lines.append(f"{s['name']}: running for {now - s['started']:.0f} s: {_last_line(out)}")
        else:
            lines.append(f"{s['name']}: waiting")
    counts = Counter()
    for path in (project / "results/bench").rglob("run*.json"):
        try:
            counts[json.loads(path.read_text()).get("status", "?")] += 1
        except (OSError, ValueError):
            counts["unreadable"] += 1
    if counts:
        lines.append("cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return lines


def pack(project: str | Path, out: str | Path) -> Path:
    """The results so far (request records packed, no caches or models) as OUT/results.tar.gz."""
    from speedsplit.core.requestlog import pack as pack_requests

    project = Path(project).resolve()
    for p in sorted((project / "results").rglob("run*.requests.jsonl")):
        pack_requests(p)
    Path(out).mkdir(parents=True, exist_ok=True)
    dest = Path(out) / "results.tar.gz"
    part = dest.with_name(dest.name + ".partial")
    with tarfile.open(part, "w:gz") as tar:
        tar.add(project / "results", "results", filter=lambda t: None if t.name.startswith(LEFT_BEHIND) else t)
    part.replace(dest)
    return dest


if __name__ == "__main__":  # the runner (start): steps file, project
    sys.exit(run_all(sys.argv[1], Path(sys.argv[2])))
