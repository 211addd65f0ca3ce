"""The interconnect control: all-reduce latency and bus bandwidth between two ranks, no server,
peer-to-peer on and off (config `link_control`, rule link)."""

from __future__ import annotations

import html

import altair as alt
import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, html_section


def build(b: Basis) -> dict[str, pl.DataFrame]:
    import json

    from speedsplit.analysis import topology

    return {"link": topology.link_frame(json.loads(b.link_json.read_text()))} if b.link_json else {}


def link_chart(link: pl.DataFrame) -> alt.Chart:
    """All-reduce latency and bus bandwidth vs payload, per pair and mode."""
    df = link.with_columns((pl.col("bytes") / 2**20).alias("mib")).to_pandas()
    base = alt.Chart(df).encode(
        x=alt.X("mib:Q", scale=alt.Scale(type="log"), title="payload (MiB, log)"),
        color=alt.Color("mode:N"),
        detail="pair:N",
        tooltip=[
            "pair",
            "mode",
            "bytes",
            alt.Tooltip("latency_us:Q", format=".1f"),
            alt.Tooltip("busbw_gb_s:Q", format=".2f"),
        ],
    )
    latency = base.mark_line(point=True).encode(
        y=alt.Y("latency_us:Q", scale=alt.Scale(type="log"), title="latency per all-reduce (µs, log)")
    )
    busbw = base.mark_line(point=True).encode(
        y=alt.Y("busbw_gb_s:Q", scale=alt.Scale(type="log"), title="bus bandwidth (GB/s, log)")
    )
    backend = ", ".join(sorted(set(link["backend"].to_list())))
    return alt.hconcat(latency.properties(width=300, height=220), busbw.properties(width=300, height=220)).properties(
        title=alt.TitleParams(f"Interconnect control: all-reduce between two ranks ({backend})", anchor="start")
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    link = frames.get("link")
    return {"link": link_chart(link)} if link is not None and link.height else {}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "link" not in frames:
        return ""
    return html_section(
        "Interconnect control",
        "All-reduce between two ranks, no server: latency per call and bus "
        "bandwidth per payload, peer-to-peer on (p2p) and off (no_p2p, through host memory). "
        "Rows marked decode_sized are one decode step's activation (users x hidden x 2 bytes). "
        "Every payload is in tables/link.csv.",
        html_table(frames["link"].filter(pl.col("decode_sized"))),
        "<details><summary>GPU topology (nvidia-smi topo -m)</summary>"
        f"<pre>{html.escape(context.get('link_matrix') or '—')}</pre></details>",
    )


ANALYSIS = Analysis(
    "link",
    order=60,
    tables=("link",),
    enabled=lambda config: config.link_control.enabled,
    build=build,
    charts=charts,
    section=section,
)
