"""Cost per token: each stack's dollars per million tokens at every cell and each chain step's
cost factor (speedsplit/analysis/cost.py), where the config prices an hour (analysis.cost)."""

from __future__ import annotations

import polars as pl

from speedsplit.analysis import cost
from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, html_section


def build(b: Basis) -> dict[str, pl.DataFrame]:
    if b.spec is None:  # no price in the config
        return {}
    per_cell = cost.cost_frame(b.cells, b.spec)
    attribution = b.attribution if b.attribution is not None else b.by_throughput
    return {"cost": per_cell, "cost_steps": cost.step_frame(attribution, per_cell, b.chains)}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    per_cell, steps = frames.get("cost"), frames.get("cost_steps")
    if per_cell is None:
        return ""
    return html_section(
        "Cost per token",
        "An hour of each stack's cards (analysis.cost.card_hour_usd, or the stack's own price) divided over "
        "the tokens it served in that hour: dollars per million output tokens, and per million tokens in and "
        "out together, with the throughput's 95% interval. A step's cost factor is its hour's price over the "
        "step before's, divided by its throughput factor: below 1 the step makes a token cheaper.",
        html_table(per_cell) if per_cell.height else "<p>No priced stack was measured.</p>",
        html_table(steps) if steps is not None and steps.height else "",
    )


ANALYSIS = Analysis(
    "cost",
    order=12,
    tables=("cost", "cost_steps"),
    enabled=lambda config: config.analysis.cost.priced(),
    build=build,
    spec=lambda config: config.analysis.cost.model_dump(mode="json"),
    section=section,
)
