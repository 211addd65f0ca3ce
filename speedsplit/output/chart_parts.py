"""The pieces the charts of plots and of output/analyses are built from: a title naming the
model and hardware, 1-2-5 log ticks, ratios with their intervals vs users, the workload's marks.
"""

from __future__ import annotations

import altair as alt
import polars as pl

ERRORBARS = "error bars: 95% t interval over runs"
# a dash legend drawn as strokes (as points, every entry is the same dot)
DASH_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeWidth=2, symbolSize=300, symbolStrokeColor="#333")
# the workload: a dash along its line and a shape at its points (one legend, of shapes: a cell
# alone on its line has no dash to show)
DASHED_WORKLOAD = alt.StrokeDash("workload:N", legend=None)
WORKLOAD_SHAPE = alt.Shape("workload:N")


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks between low and high, 1 always among them: a log axis a reader can place 1 on."""
    out = []
    for exp in range(-3, 5):
        for m in (1, 2, 5):
            v = m * 10.0**exp
            if low <= v <= high:
                out.append(v)
    return sorted(set(out) | {1.0})


def cell_label(users: int, workload: str, topology: str) -> str:
    """A cell as a panel title says it: '64 users, h200-wide (tp1)'."""
    return f"{users} users, {workload} ({topology})"


def title(text: str, cells: pl.DataFrame, intervals: bool = True) -> alt.TitleParams:
    models = ", ".join(sorted(set(cells["model"].to_list()))) if "model" in cells.columns else ""
    hardware = "; ".join(sorted(set(cells["hardware"].to_list()))) if "hardware" in cells.columns else ""
    subtitle = [f"model: {models} | hardware: {hardware}"] + ([ERRORBARS] if intervals else [])
    return alt.TitleParams(text, subtitle=subtitle, anchor="start")


def ratios_vs_users(df, y_title: str, tooltip: list, **channels) -> alt.LayerChart:
    """Ratios (value, lo, hi) against users on log axes: a line with its interval bars."""
    base = alt.Chart(df).encode(x=alt.X("users:Q", scale=alt.Scale(type="log"), title="concurrent users"), **channels)
    line = base.mark_line(point=True).encode(
        y=alt.Y("value:Q", scale=alt.Scale(type="log"), title=y_title), tooltip=tooltip
    )
    return line + base.mark_errorbar().encode(y=alt.Y("lo:Q", title=y_title), y2="hi:Q")


RATIO_TIPS = [alt.Tooltip(f"{c}:Q", format=".3f") for c in ("value", "lo", "hi")]
