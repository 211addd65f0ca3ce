"""speedsplit host run / status (speedsplit/offline/steps.py): an evidence folder's steps run
by a runner of their own, each one's outcome recorded, a failing one named with its cause,
and the results packed. Rehearsed on the project's own tree (as a bundle unpacks it) with the
default config's calibration step, a real Snakemake run."""

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
        "  - {name: calibrate, configfile: config/config.yaml, target: results/hardware/calibration.json}\n"
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
    with pytest.raises(steps.StepsError, match=r"steps\[0\].configfile: .*config/b.yaml does not exist"):
        steps.read_steps(f, tmp_path)
    f.write_text("steps:\n  - {name: a, configfile: config/a.yaml, targets: x}\n")
    with pytest.raises(steps.StepsError, match=r"unknown keys \['targets'\]"):
        steps.read_steps(f, tmp_path)
    f.write_text("steps:\n  - {name: a, configfile: config/a.yaml, target: m, env: {X: 1}}\n")
    (s,) = steps.read_steps(f, tmp_path)
    assert steps.command(s, 2)[1:] == [
        "-m", "snakemake", "--cores", "all", "--resources", "gpu=2", "--configfile", "config/a.yaml", "--", "m"
    ] and s.env == {"X": "1"}  # fmt: skip
