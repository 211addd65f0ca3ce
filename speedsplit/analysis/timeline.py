"""One run's requests on a time axis, for each stack of a chain at one cell: when each was sent
(and due, open loop), when its first token came, when it ended. The chosen run: run 0 of the
first chain's stacks at its first headline cell (else the first cell it measured)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from speedsplit.core.requestlog import read_requests, requests_path

MAX_REQUESTS = 400  # per stack: a timeline of more is a smear
SCHEMA = {
    "model": pl.Utf8,
    "stack": pl.Utf8,
    "topology": pl.Utf8,
    "cell": pl.Utf8,
    "run": pl.Int64,
    "request": pl.Int64,
    "user": pl.Int64,
    "due": pl.Float64,
    "sent": pl.Float64,
    "first_token": pl.Float64,
    "end": pl.Float64,
    "output_tokens": pl.Int64,
    "error": pl.Utf8,
}


def choose(attribution: pl.DataFrame, runs: pl.DataFrame, chains: dict[str, list[str]]) -> tuple | None:
    """(model, topology, cell, stacks) of the run to draw, or None when no chain was measured."""
    for chain, stacks in chains.items():
        rows = attribution.filter(pl.col("chain") == chain) if attribution.height else attribution
        head = rows.filter(pl.col("headline")) if "headline" in rows.columns else rows
        for df in (head, rows):
            if df.height:
                r = df.row(0, named=True)
                return r["model"], r["topology"], r["cell"], stacks
        mine = runs.filter(pl.col("stack").is_in(stacks))
        if mine.height:
            r = mine.row(0, named=True)
            return r["model"], r["topology"], r["cell"], stacks
    return None


def timeline_frame(paths: dict[tuple, Path], where: tuple | None) -> pl.DataFrame:
    """The chosen run's measured requests per stack (`paths`: (model, stack, topology, cell,
    run) -> result file), sorted by send time; at most MAX_REQUESTS each."""
    rows = []
    if where is not None:
        model, topology, cell, stacks = where
        for stack in stacks:
            path = paths.get((model, stack, topology, cell, 0))
            if path is None or not (req := requests_path(path)).is_file():
                continue
            measured = sorted((r for r in read_requests(req) if r.phase == "measured"), key=lambda r: r.sent)
            for i, r in enumerate(measured[:MAX_REQUESTS]):
                rows.append(
                    {
                        "model": model, "stack": stack, "topology": topology, "cell": cell, "run": 0,
                        "request": i, "user": r.user, "due": r.due, "sent": r.sent,
                        "first_token": r.first_token, "end": r.end, "output_tokens": r.output_tokens,
                        "error": r.error,
                    }
                )  # fmt: skip
    return pl.DataFrame(rows, schema=SCHEMA)
