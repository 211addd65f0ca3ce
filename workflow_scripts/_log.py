"""Shared by every workflow script: send this job's stderr and stdout to its log file."""

import sys


def to_log(snakemake) -> None:
    if snakemake.log:
        log = open(snakemake.log[0], "a", buffering=1)
        sys.stderr = sys.stdout = log
