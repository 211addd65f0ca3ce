"""Task accuracy beside speed: per chain step and lm-evaluation-harness task metric, both stacks'
values and their difference (the quality records' `tasks`, probes/quality_tasks.py)."""

from __future__ import annotations

import math

import polars as pl

from speedsplit.analysis.quality import STEP_KEYS, Z95
from speedsplit.core.quality import QualityRecord, TaskScore

TASK_SCHEMA = STEP_KEYS | {
    "task": pl.String,
    "metric": pl.String,
    "samples": pl.Int64,
    "from_value": pl.Float64,
    "from_stderr": pl.Float64,
    "to_value": pl.Float64,
    "to_stderr": pl.Float64,
    "difference": pl.Float64,
    "difference_lo": pl.Float64,
    "difference_hi": pl.Float64,
    "note": pl.String,
}


def difference(x: TaskScore | None, y: TaskScore | None) -> tuple[float | None, float | None, float | None]:
    """y's value less x's and its 95% interval from their standard errors (normal, the two
    scored apart); None where a side or a standard error is missing."""
    if x is None or y is None:
        return None, None, None
    d = y.value - x.value
    if x.stderr is None or y.stderr is None:
        return d, None, None
    half = Z95 * math.sqrt(x.stderr**2 + y.stderr**2)
    return d, d - half, d + half


def tasks_frame(
    steps: pl.DataFrame, records: dict[tuple[str, str, str], tuple[QualityRecord, str | None]]
) -> pl.DataFrame:
    """Per chain step and task metric (lm-evaluation-harness): both stacks' values and the
    difference, its 95% interval from their standard errors (normal, the two sides apart)."""
    rows = []
    for step in steps.iter_rows(named=True):
        key = (step["model"], step["topology"])
        a, b = records.get((*key, step["from_stack"])), records.get((*key, step["to_stack"]))
        if a is None or b is None or not (a[0].tasks or b[0].tasks or a[0].tasks_error or b[0].tasks_error):
            continue
        ta = {(t.task, t.metric): t for t in a[0].tasks}
        tb = {(t.task, t.metric): t for t in b[0].tasks}
        why = "; ".join(
            f"{s}: {r[0].tasks_error}" for s, r in ((step["from_stack"], a), (step["to_stack"], b)) if r[0].tasks_error
        )
        for task, metric in sorted(ta.keys() | tb.keys()) or [(None, None)]:
            x, y = ta.get((task, metric)), tb.get((task, metric))
            row = {k: step[k] for k in STEP_KEYS}
            row |= {"task": task, "metric": metric, "note": why}
            row |= {"samples": (y or x).samples if (x or y) else None}
            row |= {
                "from_value": x and x.value,
                "from_stderr": x and x.stderr,
                "to_value": y and y.value,
                "to_stderr": y and y.stderr,
            }
            row |= dict(zip(("difference", "difference_lo", "difference_hi"), difference(x, y)))
            rows.append(row)
    return pl.DataFrame(rows, schema=TASK_SCHEMA)
