"""Energy per output token: each chain's factors in output tokens per joule (NVML's energy
counter over each measured phase), its chart and its report section."""

from __future__ import annotations

import html

import altair as alt
import polars as pl

from speedsplit.analysis import chains
from speedsplit.core.formats import flat, html_table
from speedsplit.output.analyses import Analysis, Basis
from speedsplit.output.plots import title


def build(b: Basis) -> dict[str, pl.DataFrame]:
    """The chains in output tokens per joule, where NVML's energy counter was read (else no rows)."""
    from speedsplit.analysis import answer

    if b.runs["tokens_per_joule"].drop_nulls().len():
        energy = chains.attribution_frame(b.runs, b.chains, b.tolerate_flags, metric="tokens_per_joule")
    else:
        energy = b.by_throughput.clear()  # same columns, no interval over chains with nothing to divide
    return {"energy": answer.with_steps(energy, b.steps)}


def energy_chart(cells: pl.DataFrame) -> alt.Chart:
    """Energy per output token per stack and cell, with its interval (cells whose GPUs' energy
    counter was read)."""
    df = cells.filter(pl.col("energy_per_token_j").is_not_null()).to_pandas()
    base = alt.Chart().encode(x=alt.X("stack:N", title=None, sort=None), color=alt.Color("stack:N", legend=None))
    bars = base.mark_bar().encode(
        y=alt.Y("energy_per_token_j:Q", title="joules per output token"),
        tooltip=["stack", "cell", alt.Tooltip("energy_per_token_j:Q", format=".4f")],
    )
    err = base.mark_errorbar(color="black").encode(
        y=alt.Y("energy_per_token_j_lo:Q", title="joules per output token"), y2="energy_per_token_j_hi:Q"
    )
    return (
        alt.layer(bars, err, data=df)
        .properties(width=alt.Step(40), height=200)
        .facet(column=alt.Column("cell:N", title=None, header=alt.Header(labelAngle=-10)), row=alt.Row("model:N"))
        .resolve_scale(x="independent")
        .properties(title=title("Energy per output token (NVML energy counter, the session's cards)", cells))
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    cells = flat(frames["cells"])
    return {"energy": energy_chart(cells)} if cells.filter(pl.col("energy_per_token_j").is_not_null()).height else {}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    """Energy per output token per stack and cell, and the chains' factors in tokens per
    joule, where the GPUs' energy counter was read; else why not."""
    cells, energy = frames["cells"], frames["energy"]
    # no factor is not no reading: with no chain over the stacks read, the cells still hold them
    if not energy.height and cells["energy_per_token_j"].is_null().all():
        why = sorted({a for xs in cells["telemetry_absent"].to_list() for a in xs if "NVML" in a or "GPU" in a})
        return f"<h2>Energy</h2><p class='note'>No energy readings: {html.escape('; '.join(why) or 'not sampled')}.</p>"
    per_cell = cells.select(
        "model",
        "stack",
        "topology",
        "cell",
        "energy_per_token_j",
        "energy_per_token_j_lo",
        "energy_per_token_j_hi",
        "power_mean_w",
        "sm_util_mean_pct",
    )
    factors = energy.select(
        [
            c
            for c in ("chain", "model", "topology", "cell", "step", "factor", "value", "lo", "hi", "note")
            if c in energy.columns
        ]
    )
    return (
        "<h2>Energy</h2><p class='note'>From NVML's total-energy counter over each measured phase (all the "
        "session's cards): joules per output token over runs (geometric mean) with 95% t intervals. Factors: "
        "ratios of output tokens per joule between neighbouring stacks of a chain, multiplying to the total "
        "like the throughput factors; 1 - 1/factor is the energy per token a step saves.</p>"
        + html_table(per_cell)
        + (html_table(factors) if factors.height else "<p>No chain's stacks were measured here: no factors.</p>")
    )


ANALYSIS = Analysis(
    "energy", order=10, tables=("energy",), enabled=lambda config: True, build=build, charts=charts, section=section
)
