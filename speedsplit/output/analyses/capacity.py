"""Capacity: the sustainable users of each stack on a ladder of levels against the latency
objectives, the first failing level (the cliff), and the ratio to a reference (config `capacity`)."""

from __future__ import annotations

import altair as alt
import polars as pl

from speedsplit.core.formats import flat, html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, html_section, times
from speedsplit.planning.grid import capacity_spec


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis import capacity

    return {"capacity": capacity.capacity_frame(b.runs, b.spec)} if b.spec else {}


def capacity_chart(cells: pl.DataFrame, capacity: pl.DataFrame) -> alt.Chart:
    """The capacity sweep per stack: throughput, goodput and failed requests vs users (or the
    request rate, an open-loop ladder), each measured level marked pass or fail, a dashed rule
    at the first failing level (the cliff). Skipped levels were not measured: they are in the
    capacity table, not on the chart."""
    by_rate = capacity["sustainable_rps"].is_not_null().any() or capacity["first_failing_rps"].is_not_null().any()
    at, unit = ("rate_rps", "rps") if by_rate else ("users", "users")
    verdicts = capacity.select(
        "model", "stack", "topology", "workload", "sampling",
        pl.col(f"passing_{unit}").cast(pl.List(pl.Float64)).alias("passing"),
        pl.col(f"failing_{unit}").cast(pl.List(pl.Float64)).alias("failing"),
        pl.col(f"first_failing_{unit}").alias("cliff"),
    )  # fmt: skip
    levels = (
        cells.join(verdicts, on=["model", "stack", "topology", "workload", "sampling"], how="inner")
        .with_columns(pl.col(at).cast(pl.Float64).alias("level"))
        .filter(pl.col("passing").list.contains(pl.col("level")) | pl.col("failing").list.contains(pl.col("level")))
        .with_columns(
            pl.when(pl.col("passing").list.contains(pl.col("level")))
            .then(pl.lit("pass"))
            .otherwise(pl.lit("fail"))
            .alias("verdict"),
            pl.col("failed_requests").cast(pl.Float64),
            pl.col("cliff").cast(pl.Float64),
            pl.format("{} ({})", "stack", "topology").alias("series"),
        )
    )
    panels = {"output_tok_s": "output tokens/s", "goodput_rps": "goodput (requests/s)", "failed_requests": "failed"}
    long = levels.unpivot(
        index=["model", "series", "level", "verdict", "cliff"],
        on=list(panels),
        variable_name="metric",
        value_name="value",
    ).with_columns(pl.col("metric").replace(panels))
    base = alt.Chart().encode(
        x=alt.X(
            "level:Q", scale=alt.Scale(type="log"), title="request rate (requests/s)" if by_rate else "concurrent users"
        ),
        color=alt.Color("series:N"),
    )
    lines = base.mark_line().encode(y=alt.Y("value:Q", title=None))
    points = base.mark_point(filled=True, size=70).encode(
        y="value:Q",
        shape=alt.Shape("verdict:N", scale=alt.Scale(domain=["pass", "fail"], range=["circle", "cross"])),
        tooltip=["series", alt.Tooltip("level:Q", title=unit), "verdict", alt.Tooltip("value:Q", format=".2f")],
    )
    cliff = base.mark_rule(strokeDash=[4, 3]).encode(x="cliff:Q")
    caps = sorted(set(capacity["card_memory_gib"].drop_nulls().to_list()))
    return (
        alt.layer(lines, points, cliff, data=long.filter(pl.col("value").is_not_null()).to_pandas())
        .properties(width=260, height=170)
        .facet(
            row=alt.Row("metric:N", title=None, sort=list(panels.values())), column=alt.Column("model:N", title=None)
        )
        .resolve_scale(y="independent")
        .properties(
            title=alt.TitleParams(
                "Capacity: each ladder level against the objectives (dashed: the first failing level)",
                subtitle=[f"hardware: {'; '.join(sorted(set(cells['hardware'].to_list())))}"]
                + ([f"memory cap: {', '.join(f'{g:g}' for g in caps)} GiB per card"] if caps else [])
                + ["levels past the cliff that were skipped are listed in tables/capacity, not drawn"],
                anchor="start",
            )
        )
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    capacity = frames.get("capacity")
    return (
        {"capacity": capacity_chart(flat(frames["cells"]), capacity)}
        if capacity is not None and capacity.height
        else {}
    )


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "capacity" not in frames:
        return ""
    capacity = frames["capacity"]
    return html_section(
        "Capacity",
        "The capacity sweep (config <i>capacity</i>): a level passes when no request "
        "failed and the latency objectives (<i>slo</i>) held in every run; sustainable users (or requests/s, a ladder of rates) = the "
        "largest passing level; levels past <i>stop_after</i> failing ones were skipped, not measured. "
        "vs_reference: sustainable users (or rate) over the reference stack's.",
        html_table(capacity) if capacity.height else "<p>No stack measured the ladder.</p>",
    )


def answer(frames: dict[str, pl.DataFrame]) -> str:
    """Per model, topology and workload: each stack's sustainable users (or rate), what broke
    first above it, and each stack against the reference."""
    capacity = frames.get("capacity")
    if capacity is None or not capacity.height:
        return ""
    lines = []
    for (model, topology, workload, sampling), df in capacity.group_by(
        ["model", "topology", "workload", "sampling"], maintain_order=True
    ):
        by_rate = df["sustainable_rps"].is_not_null().any() or df["first_failing_rps"].is_not_null().any()
        unit, top, cut = ("req/s", "sustainable_rps", "first_failing_rps") if by_rate else (
            "users", "sustainable_users", "first_failing_users")  # fmt: skip
        stacks = []
        for r in df.iter_rows(named=True):
            held = "none" if r[top] is None else f"{r[top]:g}"
            broke = f", broke at {r[cut]:g}: {r['first_failing_why']}" if r[cut] is not None else ", no level failed"
            stacks.append(f"{r['stack']} {held}{broke}")
        ref = df["reference"][0]
        versus = [
            f"{r['stack']} / {ref} {times(r['vs_reference'])}"
            for r in df.iter_rows(named=True)
            if r["stack"] != ref and r["vs_reference"] is not None
        ]
        lines.append(
            f"Sustainable {unit} within the objectives ({workload}, {sampling}; {model}, {topology}): "
            + "; ".join(stacks)
            + (f". {'; '.join(versus)}." if versus else ".")
        )
    return answer_block("Capacity", lines)


ANALYSIS = Analysis(
    "capacity",
    order=50,
    tables=("capacity",),
    enabled=lambda config: config.capacity.enabled,
    build=build,
    spec=capacity_spec,
    charts=charts,
    section=section,
    answer=answer,
)
