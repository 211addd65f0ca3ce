"""Re-measure exactly the cells whose runs failed.

    speedsplit failed                 # list failed runs (status other than ok, or numbers no measurement makes)
    speedsplit failed --flagged       # ... and runs carrying an honesty flag
    speedsplit failed --rerun         # move them aside, then run snakemake as usual
    speedsplit failed --rerun -- --cores all --resources gpu=4 --configfile my.yaml

`--rerun` moves each listed result and its request records under results/failed/<time>/
(kept: a failure is evidence too) and, when Snakemake arguments follow `--`, runs Snakemake
twice with them: first with those results as its targets (exactly those cells are measured),
then for everything (the tables, plots and report). Why two runs: Snakemake alone would not
notice a missing result once the report that used it is up to date, and asked for both at
once it also reruns the job after each one in its lane (an `ancient()` input still counts as
"updated by another job" within one run). The first run's closing summary says only that it
re-measured (its tables are not rebuilt yet); the second's is the answer, and its exit the
command's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from speedsplit.core import plausible
from speedsplit.core.record import ResultError, read_result
from speedsplit.core.requestlog import requests_path


def failed_results(results_dir: str | Path, flagged: bool = False) -> list[tuple[Path, str]]:
    """(result file, why) for every run that failed (or, with flagged, carries a flag); a file
    that cannot be read at all, or whose numbers no measurement makes (core/plausible.py),
    counts as failed. A capacity level skipped past the cliff did
    not fail: it is not listed (see skipped_above)."""
    out = []
    for path in sorted(Path(results_dir).rglob("run*.json")):
        try:
            res = read_result(path)
        except ResultError as exc:
            out.append((path, f"unreadable: {exc}"))
            continue
        if res.status == "skipped":
            continue
        if res.status != "ok":
            error = res.cause or ""
            out.append((path, f"{res.status}{': ' + error.splitlines()[0] if error else ''}"))
        elif why := plausible.reasons(res):  # numbers no measurement makes: measure it again
            out.append((path, "implausible: " + "; ".join(why)))
        elif flagged and res.flags:
            out.append((path, "flagged: " + ",".join(res.flags)))
    return out


def skipped_above(results_dir: str | Path, rerun: list[Path]) -> list[tuple[Path, str]]:
    """Capacity levels skipped because of levels now being re-measured: judged again after them."""
    again = {p.resolve() for p in rerun}
    out = []
    for path in sorted(Path(results_dir).rglob("run*.json")):
        with contextlib.suppress(ResultError):
            res = read_result(path)
            below = {(path.parent.parent / name / path.name).resolve() for name in res.job.cell.capacity_below}
            if res.status == "skipped" and below & again:
                out.append((path, "skipped past levels now re-measured"))
    return out


def move_aside(paths: list[Path], results_root: Path, into: Path) -> None:
    """Move result files (and their request records) from results_root/... to into/..., losing
    nothing whenever it is interrupted: each pair is first linked into `into` (both files kept
    in both places), then removed from results, the result before its records (a result
    without records is re-measured, and the rerun's records replace the linked ones only in
    results)."""
    for path in paths:
        pair = [f for f in (path, requests_path(path)) if f.exists()]
        for f in pair:
            dest = into / f.relative_to(results_root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.link(f, dest)
        for f in pair:
            f.unlink()


def aside_folder(results_root: Path) -> Path:
    """A new folder under results/failed/ of its own (two reruns in one second never share one)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    while True:
        into = results_root / "failed" / f"{stamp}-{uuid.uuid4().hex[:6]}"
        try:
            into.mkdir(parents=True)
            return into
        except FileExistsError:
            continue


# Set for the first of --rerun's two Snakemake runs (output/summary.close_run reads it).
REMEASURE_ENV = "SPEEDSPLIT_REMEASURE_ONLY"


def run(results: str | Path, flagged: bool, rerun: bool, snakemake_args: list[str] | None) -> int:
    """List the failed runs under a results folder (with their causes); with rerun, move them
    aside and, given snakemake's arguments, re-measure them and rebuild the tables."""
    root = Path(results)
    found = failed_results(root / "bench", flagged)
    found += skipped_above(root / "bench", [p for p, _ in found])
    for path, why in found:
        print(f"{path}: {why}")
    if not found:
        print("no failed runs")
        return 0
    if not rerun:
        print(f"{len(found)} run(s); re-measure them with: speedsplit failed --rerun -- <snakemake args>")
        return 0
    into = aside_folder(root)
    move_aside([p for p, _ in found], root, into)
    print(f"moved {len(found)} result(s) to {into}")
    targets = [str(p) for p, _ in found]
    if snakemake_args is None:
        print("re-measure them with: snakemake " + " ".join(targets) + " <your usual arguments>")
        print("then rebuild the tables and report: snakemake <your usual arguments>")
        return 0
    # targets first: options such as --resources take every word after them; the first run's
    # closing summary would read the tables before they are rebuilt: it says only what it did
    first = subprocess.call(
        [sys.executable, "-m", "snakemake", *targets, *snakemake_args], env={**os.environ, REMEASURE_ENV: "1"}
    )
    if first:
        print(f"re-measuring ended with exit {first}; rebuilding the tables and report with what there is")
    # the second run retries whatever the first could not finish: its exit is the answer
    return subprocess.call([sys.executable, "-m", "snakemake", *snakemake_args])
