"""Where tensor parallelism loses time: each profiled tp<k> decode step split into compute,
communication, copies and gaps against tp1 (config `coordination`, rule profile)."""

from __future__ import annotations

import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, html_section


def build(b: Basis) -> dict[str, pl.DataFrame]:
    import json

    from speedsplit.analysis import topology

    if not b.profile_paths:
        return {}
    return {"coordination": topology.coordination_frame([json.loads(p.read_text()) for p in b.profile_paths])}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "coordination" not in frames:
        return ""
    coordination = frames["coordination"]
    return html_section(
        "Where tensor parallelism loses time",
        "From profiler traces of steady decode (results/profile/): per decode step, "
        "tp<i>k</i> against tp1. Shortfall = step time - ideal (tp1 step / <i>k</i>); each excess_ "
        "column is that part at tp<i>k</i> minus its ideal share, and they add up to the shortfall. "
        "coordination_share = (communication + idle gaps) / shortfall. The profiler itself slows "
        "the steps it records; the split, not the absolute step time, is the point.",
        html_table(coordination) if coordination.height else "<p>No tp<i>k</i> was profiled beside tp1.</p>",
    )


ANALYSIS = Analysis(
    "coordination",
    order=30,
    tables=("coordination",),
    enabled=lambda config: config.coordination.enabled,
    build=build,
    section=section,
)
