"""Re-measure exactly the cells whose runs failed.

    python -m speedsplit.failed                 # list failed runs (status other than ok)
    python -m speedsplit.failed --flagged       # ... and runs carrying an honesty flag
    python -m speedsplit.failed --rerun         # move them aside, then run snakemake as usual
    python -m speedsplit.failed --rerun -- --cores all --resources gpu=4 --configfile my.yaml

`--rerun` moves each listed result and its request records under results/failed/<time>/
(kept: a failure is evidence too) and, when Snakemake arguments follow `--`, runs Snakemake
twice with them: first with those results as its targets (exactly those cells are measured),
then for everything (the tables, plots and report). Why two runs: Snakemake alone would not
notice a missing result once the report that used it is up to date, and asked for both at
once it also reruns the job after each one in its lane (an `ancient()` input still counts as
"updated by another job" within one run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from speedsplit.record import ResultError, read_result, requests_path


def failed_results(results_dir: str | Path, flagged: bool = False) -> list[tuple[Path, str]]:
    """(result file, why) for every run that failed (or, with flagged, carries a flag); a file
    that cannot be read at all counts as failed."""
    out = []
    for path in sorted(Path(results_dir).rglob("run*.json")):
        try:
            res = read_result(path)
        except ResultError as exc:
            out.append((path, f"unreadable: {exc}"))
            continue
        if res.status != "ok":
            error = (res.server and res.server.error) or (res.error and res.error.message) or ""
            out.append((path, f"{res.status}{': ' + error.splitlines()[0] if error else ''}"))
        elif flagged and res.flags:
            out.append((path, "flagged: " + ",".join(res.flags)))
    return out


def move_aside(paths: list[Path], results_root: Path, into: Path) -> None:
    """Move result files (and their request records) from results_root/... to into/..."""
    for path in paths:
        for f in (path, requests_path(path)):
            if f.exists():
                dest = into / f.relative_to(results_root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    snakemake_args = argv[argv.index("--") + 1 :] if "--" in argv else None
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description="List, and re-measure, the cells whose runs failed.")
    p.add_argument("--results", default="results", help="the workflow's results folder (default: results)")
    p.add_argument("--flagged", action="store_true", help="also runs that carry an honesty flag")
    p.add_argument("--rerun", action="store_true", help="move them aside so that snakemake re-measures them")
    args = p.parse_args(argv)
    root = Path(args.results)
    found = failed_results(root / "bench", args.flagged)
    for path, why in found:
        print(f"{path}: {why}")
    if not found:
        print("no failed runs")
        return 0
    if not args.rerun:
        print(f"{len(found)} run(s); re-measure them with: python -m speedsplit.failed --rerun -- <snakemake args>")
        return 0
    into = root / "failed" / time.strftime("%Y%m%dT%H%M%S")
    move_aside([p for p, _ in found], root, into)
    print(f"moved {len(found)} result(s) to {into}")
    targets = [str(p) for p, _ in found]
    if snakemake_args is None:
        print("re-measure them with: snakemake " + " ".join(targets) + " <your usual arguments>")
        print("then rebuild the tables and report: snakemake <your usual arguments>")
        return 0
    # targets first: options such as --resources take every word after them
    rc = subprocess.call([sys.executable, "-m", "snakemake", *targets, *snakemake_args])
    return rc or subprocess.call([sys.executable, "-m", "snakemake", *snakemake_args])


if __name__ == "__main__":
    sys.exit(main())
