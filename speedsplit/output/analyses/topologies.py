"""Topologies: throughput per GPU and per user of every topology, the factors between them
(tensor parallelism against independent instances) and how busy the cards were (packing)."""

from __future__ import annotations

import altair as alt
import polars as pl

from speedsplit.core.formats import flat, html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, times
from speedsplit.output.plots import RATIO_TIPS, ratios_vs_users, title


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis import topology

    return {
        "topologies": topology.topology_frame(b.cells),
        "scaling": topology.scaling_frame(b.runs, b.tolerate_flags),
        "packing": topology.packing_frame(b.runs),
    }


def topology_chart(topologies: pl.DataFrame, cells: pl.DataFrame) -> alt.Chart:
    """Throughput per GPU against each user's rate: one point per topology and cell. Up is
    cheaper per card, right is faster per user."""
    df = topologies.filter(pl.col("output_tok_s").is_not_null()).to_pandas()
    return (
        alt.Chart(df)
        .mark_point(filled=True, size=80)
        .encode(
            x=alt.X("tok_s_per_user:Q", scale=alt.Scale(type="log"), title="output tokens/s per user (log)"),
            y=alt.Y("tok_s_per_gpu:Q", scale=alt.Scale(type="log"), title="output tokens/s per GPU (log)"),
            color=alt.Color("topology:N"),
            shape=alt.Shape("stack:N"),
            tooltip=[
                "stack",
                "topology",
                "cell",
                "gpus",
                alt.Tooltip("output_tok_s:Q", format=".1f"),
                alt.Tooltip("tok_s_per_gpu:Q", format=".1f"),
                alt.Tooltip("tok_s_per_user:Q", format=".2f"),
            ],
        )
        .properties(width=360, height=260)
        .facet(column=alt.Column("model:N"))
        .properties(title=title("Per GPU vs per user, every topology and cell", cells))
    )


def scaling_chart(scaling: pl.DataFrame, cells: pl.DataFrame) -> alt.Chart:
    """Each topology comparison vs users, with intervals; 1 = no gain."""
    df = scaling.filter(pl.col("value").is_not_null()).to_pandas()
    tips = ["stack", "cell", "comparison", *RATIO_TIPS, alt.Tooltip("efficiency:Q", format=".2f"), "winner"]
    layers = ratios_vs_users(
        df, "throughput ratio (log)", tips, color=alt.Color("comparison:N"), strokeDash=alt.StrokeDash("workload:N")
    )
    return (
        layers.properties(width=300, height=220)
        .facet(column=alt.Column("stack:N"), row=alt.Row("model:N"))
        .properties(title=title("Topology factors vs concurrent users", cells))
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    out = {}
    if frames["topologies"]["topology"].n_unique() > 1:
        out["topologies"] = topology_chart(frames["topologies"], flat(frames["cells"]))
    if frames["scaling"].filter(pl.col("value").is_not_null()).height:
        out["scaling"] = scaling_chart(flat(frames["scaling"]), flat(frames["cells"]))
    return out


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    topologies, scaling, packing = frames["topologies"], frames["scaling"], frames["packing"]
    parts = []
    if topologies["topology"].n_unique() > 1:
        parts += [
            "<h2>Topologies</h2>",
            "<p class='note'>Throughput per GPU and per user of every topology (tp<i>k</i>: one "
            "instance over <i>k</i> cards; <i>m</i>x1: <i>m</i> single-card instances, user <i>u</i> "
            "served by instance <i>u</i> mod <i>m</i>). Factors: ratios of throughput over runs with 95% "
            "t intervals; efficiency = factor / ideal; a tie when the interval holds 1.</p>",
            html_table(scaling.drop("numerator", "denominator")) if scaling.height else "<p>—</p>",
            html_table(topologies.drop([c for c in topologies.columns if c.endswith(("_lo", "_hi"))])),
        ]
    if packing.height:
        parts += [
            "<h2>Packing: how busy the cards were</h2>",
            "<p class='note'>Over the wall time from the first benchmark job's start to the last one's "
            "end: the share of it each card spent measuring (load running) and starting servers (lease "
            "wait and start-up of each session). Device <i>all</i> pools the cards.</p>",
            html_table(packing),
        ]
    return "\n".join(parts)


def answer(frames: dict[str, pl.DataFrame]) -> str:
    """Per model, stack and cell: how each multi-card topology scales over one card (with its
    efficiency), and which of sharding or independent instances won."""
    scaling = frames.get("scaling")
    if scaling is None or not scaling.height:
        return ""
    lines = []
    for (model, stack, cell), df in scaling.group_by(["model", "stack", "cell"], maintain_order=True):
        parts = []
        for r in df.filter(pl.col("kind") != "instances_vs_tensor_parallel").iter_rows(named=True):
            eff = f" (efficiency {r['efficiency']:.2f})" if r["efficiency"] is not None else ""
            parts.append(f"{r['numerator']} {times(r['value'], r['lo'], r['hi'])} one card{eff}")
        for r in df.filter(pl.col("kind") == "instances_vs_tensor_parallel").iter_rows(named=True):
            won = "a tie" if r["winner"] == "tie" else f"{r['winner']} wins" if r["winner"] else "undecided"
            parts.append(f"{won} ({r['comparison']} {times(r['value'], r['lo'], r['hi'])})")
        if parts:
            lines.append(f"{stack} at {cell} ({model}): " + "; ".join(parts))
    return answer_block("Topologies: does sharding pay?", lines)


ANALYSIS = Analysis(
    "topologies",
    order=20,
    tables=("topologies", "scaling", "packing"),
    enabled=lambda config: True,
    build=build,
    charts=charts,
    section=section,
    answer=answer,
)
