"""Altair plots of the tables: factors and log shares vs users, throughput and latency per
stack. Each is saved as HTML (interactive, JavaScript inlined for offline use), SVG and PNG.
What the charts share (titles, log ticks, ratio lines) is speedsplit/output/chart_parts.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import altair as alt
import polars as pl

from speedsplit.analysis import answer
from speedsplit.core.formats import flat
from speedsplit.models.checkpoint import INT4_FORMATS
from speedsplit.output.chart_parts import (
    DASH_LEGEND,
    DASHED_WORKLOAD,
    RATIO_TIPS,
    WORKLOAD_SHAPE,
    cell_label,
    log_ticks,
    ratios_vs_users,
    title,
)


def factors_chart(attribution: pl.DataFrame, cells: pl.DataFrame, chain: str) -> alt.Chart:
    df = attribution.filter((pl.col("chain") == chain) & pl.col("value").is_not_null()).to_pandas()
    layers = ratios_vs_users(
        df,
        "speedup factor (log)",
        ["model", "cell", "factor", *RATIO_TIPS],
        color=alt.Color("factor:N", title="factor"),
    )
    return (
        layers.properties(width=260, height=220)
        .facet(column=alt.Column("workload:N"), row=alt.Row("model:N"))
        .properties(title=title(f"Speedup factors along chain '{chain}' vs concurrent users", cells))
    )


def shares_chart(attribution: pl.DataFrame, cells: pl.DataFrame, chain: str) -> alt.Chart:
    df = attribution.filter(
        (pl.col("chain") == chain) & (pl.col("position") > 0) & pl.col("log_share").is_not_null()
    ).to_pandas()
    return (
        alt.Chart(df)
        .mark_bar()
        .encode(
            x=alt.X("cell:N", title="cell (users-workload-sampling)", sort=None),
            y=alt.Y("log_share:Q", stack="zero", title="log share of total speedup"),
            color=alt.Color("factor:N"),
            tooltip=["model", "cell", "factor", alt.Tooltip("log_share:Q", format=".2f")],
        )
        .properties(width=420, height=220)
        .facet(row=alt.Row("model:N"))
        .properties(
            title=alt.TitleParams(
                f"Log shares ln(factor)/ln(total) per cell, chain '{chain}'",
                subtitle=["cells whose total is within 5% of 1 have no shares (undefined)"],
                anchor="start",
            )
        )
    )


def waterfall_chart(waterfall: pl.DataFrame, cells: pl.DataFrame) -> alt.Chart:
    """The headline decompositions as log-scale waterfalls (answer.waterfall_frame), a row per
    chain and model, a column per cell: each factor a bar from the running product before it
    to the one after it, then the total from 1; on the log axis the factor bars add up to the
    total bar."""
    # cells that only the sampling tells apart (the headline's most users for each) get a
    # panel each: their names join the label
    same = (
        waterfall.select("users", "workload", "topology").unique().height
        < waterfall.select("cell", "topology").unique().height
    )
    df = waterfall.with_columns(
        pl.struct("users", "workload", "topology", "cell")
        .map_elements(
            lambda r: cell_label(r["users"], r["workload"], r["topology"]) + (f": {r['cell']}" if same else ""),
            return_dtype=pl.Utf8,
        )
        .alias("where"),
        pl.format("{}: {}", "chain", "model").alias("chain_model"),
        pl.format("{}x", pl.col("value").round_sig_figs(3)).alias("label"),
        pl.max_horizontal("start", "end").alias("top"),
        # the factor's 95% interval where the bar ends: from the running product before it
        (pl.col("start") * pl.col("lo")).alias("end_lo"),
        (pl.col("start") * pl.col("hi")).alias("end_hi"),
    )
    low = min(1.0, float(waterfall["end"].min())) / 1.2
    high = max(1.0, float(waterfall["end"].max()), float(waterfall["start"].max())) * 1.6
    # an interval wider than the axis (two runs far apart) stops at its edge, marked with an arrow
    df = df.with_columns(
        pl.col("end_lo").clip(lower_bound=low).alias("shown_lo"),
        pl.col("end_hi").clip(upper_bound=high).alias("shown_hi"),
        pl.when(pl.col("end_hi") > high).then(pl.lit("▲")).alias("off_hi"),
        pl.when(pl.col("end_lo") < low).then(pl.lit("▼")).alias("off_lo"),
    ).to_pandas()
    base = alt.Chart().encode(
        x=alt.X("bar:N", sort=alt.EncodingSortField("order"), title=None, axis=alt.Axis(labelAngle=-20, labelLimit=200))
    )
    bars = base.mark_bar(size=34).encode(
        y=alt.Y(
            "start:Q",
            scale=alt.Scale(type="log", domain=[low, high], nice=False),
            axis=alt.Axis(values=log_ticks(low, high)),
            title="speedup (log; bars add up to the total)",
        ),
        y2="end:Q",
        color=alt.Color(
            "direction:N",
            scale=alt.Scale(domain=["speeds up", "slows down", "total"], range=["#4c78a8", "#e45756", "#555555"]),
            title=None,
        ),
        tooltip=["chain", "model", "cell", "factor", *RATIO_TIPS],
    )
    text = base.mark_text(dy=-7, fontSize=12).encode(y=alt.Y("top:Q"), text="label:N")
    one = base.mark_rule(strokeDash=[3, 3], color="#999").encode(y=alt.datum(1))
    whiskers = base.mark_rule(color="black", strokeWidth=1.5).encode(y="shown_lo:Q", y2="shown_hi:Q")
    off_hi = base.mark_text(dy=4, fontSize=11).encode(y="shown_hi:Q", text="off_hi:N")
    off_lo = base.mark_text(dy=-4, fontSize=11).encode(y="shown_lo:Q", text="off_lo:N")
    return (
        alt.layer(bars, whiskers, off_hi, off_lo, text, one, data=df)
        .properties(width=220, height=200)
        .facet(column=alt.Column("where:N", title=None), row=alt.Row("chain_model:N", title=None))
        .resolve_scale(x="independent")
        .properties(
            title=alt.TitleParams(
                "Where the speedup came from, at the headline cells (rows: chain: model)",
                subtitle=[
                    f"hardware: {'; '.join(sorted(set(cells['hardware'].to_list())))}",
                    "black whiskers: each factor's 95% interval where its bar ends (the numbers: the sentences above); "
                    "▲ ▼: it runs on past the axis",
                ],
                anchor="start",
            )
        )
    )


def kernels_chart(cells: pl.DataFrame, reference: str) -> alt.Chart:
    """Every INT4 (gptq) stack's throughput vs users, each labelled with the kernel its engine
    reported, against the FP16 reference stack (dashed)."""
    df = cells.filter(
        (pl.col("variant").is_in(INT4_FORMATS) | (pl.col("stack") == reference)) & pl.col("output_tok_s").is_not_null()
    ).with_columns(
        pl.when(pl.col("stack") == reference)
        .then(pl.format("{} (FP16 reference)", "stack"))
        # (flat() made an engine that named no kernel an empty text)
        .otherwise(
            pl.format("{} ({})", "stack", pl.col("linear_kernel").replace("", None).fill_null("kernel not reported"))
        )
        .alias("kernel"),
        (pl.col("stack") == reference).alias("reference"),
    )
    return _throughput_vs_users(
        df,
        dict(
            color=alt.Color("kernel:N", title="stack (kernel the engine reported)"),
            strokeDash=alt.StrokeDash(
                "reference:N", scale=alt.Scale(domain=[False, True], range=[[1, 0], [6, 3]]), legend=None
            ),
        ),
        ["stack", "linear_kernel", "kernel_ok", "cell", alt.Tooltip("output_tok_s:Q", format=".1f")],
        (300, 240),
    ).properties(title=title(f"INT4 kernels vs users, against {reference} (dashed)", cells))


def kernel_sweep_ran(cells: pl.DataFrame, reference: str) -> bool:
    """Whether the kernel chart has something to compare: the reference and two gptq stacks."""
    measured = cells.filter(pl.col("output_tok_s").is_not_null())
    gptq = measured.filter(pl.col("variant").is_in(INT4_FORMATS))["stack"].n_unique()
    return gptq >= 2 and measured.filter(pl.col("stack") == reference).height > 0


def _throughput_vs_users(df: pl.DataFrame, channels: dict, tooltip: list, size: tuple[int, int]) -> alt.FacetChart:
    """Median output tok/s vs users on log axes with the intervals as error bars, a column per
    workload and a row per model; `channels` tell the lines apart."""
    base = alt.Chart(df.to_pandas()).encode(
        x=alt.X("users:Q", scale=alt.Scale(type="log"), title="concurrent users"), **channels
    )
    line = base.mark_line(point=True).encode(
        y=alt.Y("output_tok_s:Q", scale=alt.Scale(type="log"), title="output tokens/s (log)"), tooltip=tooltip
    )
    bars = base.mark_errorbar().encode(
        y=alt.Y("output_tok_s_lo:Q", title="output tokens/s (log)"), y2="output_tok_s_hi:Q"
    )
    return (
        (line + bars)
        .properties(width=size[0], height=size[1])
        .facet(column=alt.Column("workload:N"), row=alt.Row("model:N"))
    )


def throughput_chart(cells: pl.DataFrame) -> alt.Chart:
    return _throughput_vs_users(
        cells.filter(pl.col("output_tok_s").is_not_null()),
        dict(color=alt.Color("stack:N"), strokeDash=alt.StrokeDash("topology:N", legend=DASH_LEGEND)),
        ["stack", "topology", "cell", alt.Tooltip("output_tok_s:Q", format=".1f"), "linear_kernel"],
        (260, 220),
    ).properties(title=title("Throughput per stack vs concurrent users", cells))


def latency_chart(cells: pl.DataFrame) -> alt.Chart:
    metrics = {
        "ttft_s_median": "TTFT median",
        "ttft_s_p99": "TTFT p99",
        "tpot_s_median": "TPOT median",
        "e2e_s_p99": "E2E p99",
    }
    long = (
        cells.filter(pl.col("output_tok_s").is_not_null())
        .unpivot(
            index=["model", "stack", "users", "workload"],
            on=list(metrics),
            variable_name="metric",
            value_name="seconds",
        )
        .with_columns(pl.col("metric").replace(metrics))
        .filter(pl.col("seconds").is_not_null())
    )
    return (
        alt.Chart(long.to_pandas())
        .mark_line(point=True)
        .encode(
            x=alt.X("users:Q", scale=alt.Scale(type="log"), title="concurrent users"),
            y=alt.Y("seconds:Q", scale=alt.Scale(type="log"), title="seconds (log; median over runs)"),
            color="stack:N",
            strokeDash=DASHED_WORKLOAD,
            shape=WORKLOAD_SHAPE,
            tooltip=["stack", "workload", "users", "metric", alt.Tooltip("seconds:Q", format=".4f")],
        )
        .properties(width=220, height=180)
        .facet(column=alt.Column("metric:N"), row=alt.Row("model:N"))
        .properties(
            title=title("Latency percentiles vs concurrent users (geometric means over runs)", cells, intervals=False)
        )
    )


def server_chart(cells: pl.DataFrame) -> alt.Chart:
    """What the servers reported while measured: peak KV-cache use, mean waiting requests and
    preemptions vs users, per stack (stacks with a /metrics endpoint only)."""
    panels = {"kv_cache_peak": "KV cache peak (fraction)", "waiting_mean": "waiting (mean)", "preemptions": "preempted"}
    long = (
        cells.filter(pl.col("kv_cache_peak").is_not_null())
        .unpivot(index=["model", "stack", "users", "workload"], on=list(panels), variable_name="metric")
        .with_columns(pl.col("metric").replace(panels))
        .filter(pl.col("value").is_not_null())
    )
    return (
        alt.Chart(long.to_pandas())
        .mark_line(point=True)
        .encode(
            x=alt.X("users:Q", scale=alt.Scale(type="log"), title="concurrent users"),
            y=alt.Y("value:Q", title=None),
            color="stack:N",
            strokeDash=DASHED_WORKLOAD,
            shape=WORKLOAD_SHAPE,
            tooltip=["stack", "workload", "users", "metric", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=220, height=170)
        .facet(column=alt.Column("metric:N", title=None, sort=list(panels.values())), row=alt.Row("model:N"))
        .resolve_scale(y="independent")
        .properties(
            title=title(
                "What the servers were doing (their /metrics, over each measured phase)", cells, intervals=False
            )
        )
    )


def tradeoff_chart(cells: pl.DataFrame) -> alt.Chart:
    """Each stack's latency against its throughput, one point per level (users, or the offered
    rate of an open-loop cell) joined in order: up and right is what a stack trades."""
    df = cells.filter(pl.col("output_tok_s").is_not_null() & pl.col("tpot_s_median").is_not_null()).with_columns(
        pl.when(pl.col("users") > 0)
        .then(pl.format("{} users", "users"))
        .otherwise(pl.format("{} req/s", pl.col("rate_rps").round_sig_figs(3)))
        .alias("level"),
        pl.when(pl.col("users") > 0)
        .then(pl.col("users").cast(pl.Float64))
        .otherwise(pl.col("rate_rps"))
        .alias("order"),
        (pl.col("tpot_s_median") * 1000).alias("tpot_ms"),
    )
    return (
        alt.Chart(df.to_pandas())
        .mark_line(point=True)
        .encode(
            x=alt.X("output_tok_s:Q", scale=alt.Scale(type="log"), title="output tokens/s (log)"),
            y=alt.Y("tpot_ms:Q", scale=alt.Scale(type="log"), title="TPOT median, ms (log)"),
            color="stack:N",
            order="order:Q",
            shape=WORKLOAD_SHAPE,
            detail="workload:N",
            tooltip=[
                "stack",
                "workload",
                "level",
                alt.Tooltip("output_tok_s:Q", format=".1f"),
                alt.Tooltip("tpot_ms:Q", format=".2f"),
            ],
        )
        .properties(width=320, height=240)
        .facet(column=alt.Column("sampling:N"), row=alt.Row("model:N"))
        .properties(
            title=title(
                "Latency against throughput per stack (along users or the offered rate)", cells, intervals=False
            )
        )
    )


def timeline_chart(timeline: pl.DataFrame) -> alt.Chart:
    """One run's requests as bars from sent to end (a tick at the first token; open loop: a
    dot where it was due), a row per stack."""
    df = timeline.to_pandas()
    base = alt.Chart().encode(y=alt.Y("request:O", title="request (by send time)", axis=None))
    span = base.mark_rule(strokeWidth=2).encode(
        x=alt.X("sent:Q", title="seconds from the measured phase's start"),
        x2="end:Q",
        color=alt.Color("stack:N"),
        tooltip=["stack", "request", "user", "sent", "first_token", "end", "output_tokens", "error"],
    )
    first = base.mark_tick(thickness=2, size=6, color="black").encode(x="first_token:Q")
    due = base.mark_point(size=10, color="grey", filled=True).encode(x="due:Q")
    where = timeline.row(0, named=True)
    return (
        alt.layer(span, first, due, data=df)
        .properties(width=700, height=alt.Step(2))
        .facet(row=alt.Row("stack:N", title=None))
        .resolve_scale(y="independent")
        .properties(
            title=alt.TitleParams(
                f"Every request of run 0 at {where['cell']} ({where['model']}, {where['topology']})",
                subtitle=["bar: sent to last token; tick: first token; grey dot: when it was due (open loop)"],
                anchor="start",
            )
        )
    )


def save(chart: alt.Chart, stem: str | Path) -> dict[str, Path]:
    """Write stem.html (JS inlined), stem.svg and stem.png, each atomically."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    chart = chart.configure_legend(labelLimit=400)
    out = {}
    for ext, kwargs in (("html", {"inline": True}), ("svg", {}), ("png", {"scale_factor": 1.5})):
        target = Path(f"{stem}.{ext}")  # names may hold dots
        fd, tmp = tempfile.mkstemp(dir=stem.parent, prefix=f".{target.name}.", suffix=f".{ext}")
        os.close(fd)
        try:
            chart.save(tmp, format=ext, **kwargs)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        out[ext] = target
    return out


def core_charts(
    frames: dict[str, pl.DataFrame], chains: list[str], kernel_reference: str | None = None
) -> dict[str, alt.Chart]:
    """The charts every run has (the optional analyses add theirs: speedsplit/output/analyses):
    the waterfall, throughput and latency, the kernel chart where a kernel sweep ran, the
    server chart where servers reported, each chain's factors and shares where measured."""
    waterfall = answer.waterfall_frame(frames["attribution"])
    cells, attribution = flat(frames["cells"]), flat(frames["attribution"])  # tooltips show lists as text
    charts = {}
    if waterfall.height:
        charts["waterfall"] = waterfall_chart(waterfall, cells)
    closed = cells.filter(pl.col("users") > 0)  # open-loop cells have a rate, not users: plots/traffic
    if closed.filter(pl.col("output_tok_s").is_not_null()).height:  # something measured to draw
        charts |= {"throughput": throughput_chart(closed), "latency": latency_chart(closed)}
    if kernel_reference and kernel_sweep_ran(cells, kernel_reference):
        charts["kernels"] = kernels_chart(cells, kernel_reference)
    if closed.filter(pl.col("kv_cache_peak").is_not_null()).height:
        charts["server"] = server_chart(closed)
    if attribution.height:
        attribution = attribution.filter(pl.col("users") > 0)  # against users: the closed loop's cells
    if cells.filter(pl.col("tpot_s_median").is_not_null()).height:
        charts["tradeoff"] = tradeoff_chart(cells)
    timeline = frames.get("timeline")
    if timeline is not None and timeline.height:
        charts["timeline"] = timeline_chart(timeline)
    for chain in chains:
        # a chart only where it has something to draw: no factor measured, or every total
        # within 5% of 1 (shares undefined), would leave an empty frame
        mine = attribution.filter(pl.col("chain") == chain) if attribution.height else attribution
        if mine.filter(pl.col("value").is_not_null()).height:
            charts[f"factors-{chain}"] = factors_chart(attribution, cells, chain)
        if mine.filter((pl.col("position") > 0) & pl.col("log_share").is_not_null()).height:
            charts[f"shares-{chain}"] = shares_chart(attribution, cells, chain)
    return charts
