"""Shared by every workflow script: make the speedsplit package importable (also from a
conda env that lacks it) and send the job's stdout and stderr to its log file."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def to_log(snakemake) -> None:
    """The job's output to its log; a mistake in what the user gave (a UserError: a corrupt
    result, a bad trace, a config key) also as one line on the terminal, its traceback in the
    log only."""
    if snakemake.log:
        log = open(snakemake.log[0], "a", buffering=1)
        sys.stderr = sys.stdout = log
    sys.excepthook = _one_line


def _one_line(kind, exc, tb) -> None:
    from speedsplit.core.errors import UserError, one_line

    sys.__excepthook__(kind, exc, tb)  # to the log, where there is one
    if isinstance(exc, UserError):
        print(one_line(exc), file=sys.__stderr__, flush=True)
