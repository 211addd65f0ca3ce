"""Why a step's decode is faster, kernel by kernel (config mechanism.profile): each profiled
stack's decode step split into kernel classes, each chain step's change split into the
classes' changes; a first-screen line per chain step, a waterfall of step time by class per
chain, and the report section."""

from __future__ import annotations

import altair as alt
import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, html_section


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis import step_time

    frame = step_time.step_time_frame(b.results, b.runs)
    # asked for (its spec: the cells named), both tables, empty where no vLLM stack measured a
    # named cell (the workflow declares them: a run of hf-fp16 alone failed its tables job)
    if not frame.height and b.spec is None:
        return {}
    return {"step_time": frame, "step_time_changes": step_time.step_time_changes(frame, b.chains)}


def answer(frames: dict[str, pl.DataFrame]) -> str:
    from speedsplit.analysis.step_time import sentence

    changes = frames.get("step_time_changes")
    if changes is None or not changes.height:
        return ""
    lines = [
        f"{r['step']} at {r['users']} users ({r['cell']}; {r['chain']}; {r['model']}, {r['topology']}): {sentence(r)}"
        for r in changes.iter_rows(named=True)
    ]
    return answer_block("Why, kernel by kernel (a profiled window of decode steps)", lines)


def step_time_chart(frame: pl.DataFrame) -> alt.Chart:
    """Each profiled stack's decode step as a bar of its kernel classes, per cell (a bar per
    topology where the stacks were profiled on several: one bar would add their steps up)."""
    from speedsplit.analysis.step_time import CLASS_MS, NAMES

    ok = frame.filter(pl.col("status") == "ok")
    bar = pl.format("{} ({})", "stack", "topology") if ok["topology"].n_unique() > 1 else pl.col("stack")
    ok = ok.with_columns(bar.alias("bar"))
    long = ok.unpivot(
        index=["model", "stack", "topology", "bar", "cell"], on=CLASS_MS, variable_name="class", value_name="ms"
    )
    long = long.with_columns(pl.col("class").str.strip_suffix("_ms").replace(NAMES))
    order = [NAMES[c.removesuffix("_ms")] for c in CLASS_MS]
    return (
        alt.Chart(long.to_pandas())
        .mark_bar()
        .encode(
            x=alt.X("bar:N", title=None, sort=None),
            y=alt.Y("sum(ms):Q", title="ms per decode step"),
            color=alt.Color("class:N", sort=order, title="where the step's time went"),
            order=alt.Order("class_index:Q"),
            tooltip=["stack", "topology", "cell", "class", alt.Tooltip("ms:Q", format=".3f")],
        )
        .transform_calculate(class_index=f"indexof({order!r}, datum['class'])")
        .properties(width=alt.Step(50), height=220)
        .facet(column=alt.Column("cell:N", title=None), row=alt.Row("model:N", title=None))
        .properties(title="Decode step time by kernel class (profiled window; CPU: host ops)")
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    frame = frames.get("step_time")
    if frame is None or not frame.filter(pl.col("status") == "ok").height:
        return {}
    return {"step-time": step_time_chart(frame)}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "step_time" not in frames:
        return ""
    frame, changes = frames["step_time"], frames["step_time_changes"]
    if not frame.height:
        return html_section(
            "Why, kernel by kernel",
            "No run profiled a window: the profiler is vLLM's, and no vLLM stack measured a cell that "
            "mechanism.profile.cells names.",
        )
    return html_section(
        "Why, kernel by kernel",
        "A window of decode steps profiled after each named cell's run 0 (vLLM's torch profiler, one "
        "request per user, on the server that measured the cell): each step's time split into dense "
        "GEMM, quantized GEMM (with its dequantisation), attention, communication, other kernels, "
        "copies and GPU idle (the CPU's scheduling and launches between kernels), which add up to the "
        "step. A chain step's delta_ms is split into the classes' deltas, which add up to it. The "
        "profiler slows the steps it records: the split, and its change between neighbours, is the "
        "point. On a CPU the classes are the host's ops.",
        html_table(frame),
        html_table(changes) if changes.height else "<p>No chain step had both its stacks profiled.</p>",
    )


ANALYSIS = Analysis(
    "step_time",
    order=14,
    tables=("step_time", "step_time_changes"),
    enabled=lambda config: bool(config.mechanism.profile.cells),
    spec=lambda config: list(config.mechanism.profile.cells),
    build=build,
    charts=charts,
    section=section,
    answer=answer,
)
