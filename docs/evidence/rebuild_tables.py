"""Rewrite every evidence folder's tables from its raw results, the way
tests/workflow/test_evidence.py rebuilds and compares them (after a change to what a table
holds); with --all, its plots and report too (as `speedsplit aggregate`, its README's command).
Run it from the repository's root (the reports name their folders from there). A folder keeps
its tables as CSV (what the test compares and the READMEs quote) and markdown: the typed parquet
copies the plots are drawn from are not kept (the tree a GPU host copies is held to 64 MiB).

    python docs/evidence/rebuild_tables.py [--all] [FOLDER ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from speedsplit.core.formats import write_frames
from speedsplit.output import analyses
from speedsplit.output.aggregate import aggregate_folders, evidence_frames

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def rebuild(folder: Path, everything: bool = False) -> str:
    how = yaml.safe_load((folder / "evidence.yaml").read_text())
    if how.get("rebuild") is False:
        return f"{folder.name}: not rebuilt ({how['why']})"
    frames, cfg = evidence_frames(folder)
    if everything:
        here = folder.relative_to(REPO)
        aggregate_folders(cfg, [here / "results"], here)
        for drawn_from in (folder / "tables").glob("*.parquet"):
            drawn_from.unlink()
    names = analyses.table_names(cfg)
    for stale in (folder / "tables").glob("*.csv"):  # a table its analyses no longer write
        if stale.stem not in names:
            stale.unlink()
    write_frames(
        {n: f for n, f in frames.items() if n in names}, folder / "tables", markdown=("attribution",), parquet=False
    )
    return f"{folder.name}: {len(names)} tables"


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--all"]
    folders = [Path(a) for a in args] or sorted(p for p in HERE.iterdir() if (p / "evidence.yaml").is_file())
    for f in folders:
        print(rebuild(f.resolve(), "--all" in sys.argv), flush=True)
