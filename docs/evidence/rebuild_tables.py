"""Rewrite every evidence folder's tables from its raw results, the way
tests/workflow/test_evidence.py rebuilds and compares them (after a change to what a table
holds). Plots and reports: each folder's README gives its `speedsplit aggregate` command.

    python docs/evidence/rebuild_tables.py [FOLDER ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from speedsplit.core.formats import write_frames
from speedsplit.output import analyses
from speedsplit.output.aggregate import QUANTIZE_REPORTS, build_frames
from speedsplit.planning import config as C

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def rebuild(folder: Path) -> str:
    how = yaml.safe_load((folder / "evidence.yaml").read_text())
    if how.get("rebuild") is False:
        return f"{folder.name}: not rebuilt ({how['why']})"
    cfg = C.load(*[REPO / c for c in how["config"]])
    frames = build_frames(
        sorted(folder.glob(how["results"])),
        bandwidth_json=folder / how["bandwidth"],
        link_json=folder / how["link"] if how.get("link") else None,
        profile_paths=sorted(folder.glob(how["profiles"])) if how.get("profiles") else [],
        quantize_paths=sorted(folder.glob(f"results/{QUANTIZE_REPORTS}")),
        **analyses.analysis_spec(cfg),
    )
    names = analyses.table_names(cfg)
    write_frames({n: f for n, f in frames.items() if n in names}, folder / "tables", markdown=("attribution",))
    return f"{folder.name}: {len(names)} tables"


if __name__ == "__main__":
    folders = [Path(a) for a in sys.argv[1:]] or sorted(p for p in HERE.iterdir() if (p / "evidence.yaml").is_file())
    for f in folders:
        print(rebuild(f.resolve()), flush=True)
