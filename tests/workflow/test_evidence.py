"""Committed evidence rebuilds: each evidence folder's tables come out of its own raw results
exactly as committed, and every path its README names exists."""

import re

import pytest
import yaml
from conftest import REPO

from speedsplit.core.record import read_result
from speedsplit.core.requestlog import requests_path
from speedsplit.output import analyses
from speedsplit.core.formats import write_frames
from speedsplit.output.aggregate import evidence_frames

EVIDENCE = sorted(p for p in (REPO / "docs/evidence").iterdir() if p.is_dir())
FILE_LIKE = re.compile(r"\.(json|jsonl|csv|md|html|yaml|yml|sh|png|svg|parquet|log|py|txt)$")
# What a folder's README may name without committing it: its plots and report page, drawn from
# its raw results by `python docs/evidence/rebuild_tables.py --all FOLDER` (.gitignore says why)
DRAWN = r"((E/)?report\.html|plots/.*)"


def named_paths(readme: str) -> list[str]:
    """Paths a README names in `backticks` outside code blocks (templates and globs skipped)."""
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    out = []
    for token in re.findall(r"`([^`\s]+)`", prose):
        if (
            any(c in token for c in "*{}<>…")
            or token.startswith(("/", "~", "-", "http"))
            or (token.startswith(".") and "/" not in token)
        ):
            continue
        if "/" in token or FILE_LIKE.search(token):
            out.append(token)
    return out


@pytest.mark.parametrize("folder", EVIDENCE, ids=lambda p: p.name)
def test_every_path_the_readme_names_exists(folder):
    readme = (folder / "README.md").read_text()
    missing = [
        p
        for p in named_paths(readme)
        if not (folder / p).exists() and not (REPO / p).exists() and not re.fullmatch(DRAWN, p)
    ]
    assert not missing, f"{folder.name}/README.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("folder", EVIDENCE, ids=lambda p: p.name)
def test_the_steps_that_measured_a_folder_can_run_again(folder):
    """`speedsplit host run --steps` takes every folder's steps as they are written."""
    from speedsplit.offline import steps

    if "steps" in yaml.safe_load((folder / "evidence.yaml").read_text()):
        assert steps.read_steps(folder / "evidence.yaml", REPO)


@pytest.mark.parametrize("folder", EVIDENCE, ids=lambda p: p.name)
def test_tables_rebuild_from_the_committed_raw_results(folder, tmp_path):
    how = yaml.safe_load((folder / "evidence.yaml").read_text())
    if how.get("rebuild") is False:
        # allowed only where the README says so up front, with the reason
        assert how["why"] and "cannot be rebuilt" in (folder / "README.md").read_text()
        return
    results = sorted(folder.glob(how["results"]))
    assert results, f"{folder.name}: no raw results match {how['results']}"
    for path in results:
        read_result(path)
        assert requests_path(path).is_file(), path
    frames, cfg = evidence_frames(folder)  # as docs/evidence/rebuild_tables.py builds them
    write_frames(frames, tmp_path, parquet=False)
    for name in analyses.table_names(cfg):
        rebuilt, committed = (tmp_path / f"{name}.csv").read_text(), (folder / "tables" / f"{name}.csv").read_text()
        assert rebuilt == committed, f"{folder.name}: tables/{name}.csv differs from its rebuild"


def test_no_evidence_file_is_ignored_by_git():
    import subprocess

    tracked_or_not = subprocess.run(
        ["git", "status", "--ignored", "--porcelain", "docs"], cwd=REPO, capture_output=True, text=True
    )
    if tracked_or_not.returncode != 0:
        pytest.skip("not a git checkout")
    # The ignored kinds: the plots and report page a folder's raw results draw
    rebuilt = re.compile(rf"!! docs/evidence/[^/]+/{DRAWN}")
    ignored = [ln for ln in tracked_or_not.stdout.splitlines() if ln.startswith("!!") and not rebuilt.fullmatch(ln)]
    assert not ignored, ignored
    probe = subprocess.run(
        ["git", "check-ignore", "docs/evidence/x/results/bench/x/run0.json", "docs/evidence/x/logs/a.log"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert probe.stdout == ""


def test_the_tree_a_gpu_host_copies_leaves_room_for_a_bundle_part():
    """A GPU host takes at most 64 MiB a transfer: the working tree (tracked files and untracked
    ones git does not ignore) and one bundle part. The evidence folders' raw results together
    pass that (66 MiB on 2026-12-07), so a run on a card is made from the tree without them
    (docs/evidence/README.md); what is left must leave a part its room."""
    import subprocess

    from speedsplit.offline.bundle import PART_MIB

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    evidence = {p.relative_to(REPO).as_posix() + "/" for p in EVIDENCE}
    paths = [REPO / p for p in listed.stdout.decode().split("\0") if p and not any(p.startswith(e) for e in evidence)]
    mib = sum(p.stat().st_size for p in paths if p.is_file()) / 2**20
    assert mib + PART_MIB < 64, (
        f"the tree a GPU host copies, less its evidence, is {mib:.1f} MiB: with a {PART_MIB:g} MiB bundle part over 64"
    )
