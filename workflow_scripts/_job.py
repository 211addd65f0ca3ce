"""Shared by every workflow script: make the speedsplit package importable (also from a
conda env that lacks it) and send the job's stdout and stderr to its log file."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def to_log(snakemake) -> None:
    if snakemake.log:
        log = open(snakemake.log[0], "a", buffering=1)
        sys.stderr = sys.stdout = log
