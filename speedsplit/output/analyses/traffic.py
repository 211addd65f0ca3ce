"""Traffic: at each open-loop cell (a request rate, or a replayed trace), each stack's goodput,
latency and prefix-cache hit rate, and each chain's factors on those metrics, saying which way
is faster. It answers first on the report's first screen when the run has such cells."""

from __future__ import annotations

import html

import altair as alt
import polars as pl

from speedsplit.analysis import traffic
from speedsplit.core.formats import flat, html_table
from speedsplit.output.analyses import Analysis, Basis, html_section, times
from speedsplit.output.plots import title
from speedsplit.planning import grid as gridmod
from speedsplit.planning.experiment import Experiment

FIRST_SCREEN = ["goodput", "throughput", "TTFT p50", "TPOT p50", "E2E p50"]
# a sessions cell's own (its first turns' TTFT is in TTFT p50's company: shown in the tables)
SESSION_SCREEN = ["returning-turn TTFT p50", "session p50"]
SESSION_CELL = pl.col("load") == "sessions"


def build(b: Basis) -> dict[str, pl.DataFrame]:
    """Both tables when the config has open-loop cells (spec True) or the results do."""
    stacks = traffic.stacks_frame(b.cells)
    if not (b.spec or stacks.height):
        return {}
    return {"traffic": stacks, "traffic_factors": traffic.factors_frame(b.runs, b.chains, b.steps, b.tolerate_flags)}


def _x(v, lo, hi) -> str:
    return times(v, lo, hi, alone=" (one run)")  # no interval: one run of a stack


def headlines(factors: pl.DataFrame) -> list[str]:
    """Per chain, one sentence at its highest offered rate with a total: the steps on goodput
    and median latencies, e.g. 'study at r16-mix-greedy (16 req/s): goodput 20.3× × 1.07× =
    21.7×; TTFT p50 ...'."""
    out = []
    for (chain,), df in factors.group_by(["chain"], maintain_order=True):
        done = df.filter((pl.col("position") == 0) & (pl.col("metric") == "goodput") & pl.col("value").is_not_null())
        if not done.height:
            continue
        top = done.sort("rate_rps", descending=True, nulls_last=True).row(0, named=True)
        at = df.filter((pl.col("cell") == top["cell"]) & (pl.col("model") == top["model"]))
        parts = []
        for metric in ("goodput", "TTFT p50", "TPOT p50", *SESSION_SCREEN):
            if metric in SESSION_SCREEN and not at.filter(pl.col("metric") == metric).height:
                continue
            m = at.filter(pl.col("metric") == metric).sort(pl.col("position").replace(0, 10**6))
            steps = [
                f"{r['step']} {_x(r['value'], r['lo'], r['hi'])}" for r in m.iter_rows(named=True) if r["position"]
            ]
            total = m.filter(pl.col("position") == 0)
            if len(steps) > 1 and total.height:
                steps.append(f"= {_x(total['value'][0], total['lo'][0], total['hi'][0])}")
            parts.append(f"{metric}: {' × '.join(steps[:-1]) + ' ' + steps[-1] if len(steps) > 1 else steps[0]}")
        unit = "sessions/s" if top["load"] == "sessions" else "req/s"
        rate = f" ({top['rate_rps']:g} {unit})" if top["rate_rps"] is not None else ""
        out.append(f"{chain} at {top['cell']}{rate}, {top['model']}: " + "; ".join(parts) + ".")
    return out


def answer(frames: dict[str, pl.DataFrame]) -> str:
    """Per chain: its factors at each open-loop cell on goodput, throughput and median
    latencies (speedups: above 1 the later stack is faster), then what each stack served."""
    factors, stacks = frames.get("traffic_factors"), frames.get("traffic")
    if factors is None or not factors.height:
        return ""
    parts = [
        "<h3>Under traffic</h3><p class='note'>Open-loop cells: every stack met the same requests at the "
        "same times. Each factor is a speedup on that metric (a latency as old / new): above 1 the later "
        "stack is faster; [95% t interval over runs, paired by run: run r of every stack met one arrival "
        "schedule]. Throughput follows the offered rate while a "
        "stack keeps up; goodput (requests/s that met the objectives) and latency are where stacks part.</p>"
    ]
    parts += [f"<p class='headline'>{html.escape(t)}</p>" for t in headlines(factors)]
    for chain, df in factors.group_by("chain", maintain_order=True):
        rows = []
        shown = FIRST_SCREEN + [m for m in SESSION_SCREEN if m in set(df["metric"])]
        # by rate (a trace's cells last), each step in chain order, the total last
        df = df.sort(["rate_rps", "cell", pl.col("position").replace(0, 10**6)], nulls_last=True, maintain_order=True)
        for key, g in df.group_by(["model", "topology", "cell", "position", "factor", "step"], maintain_order=True):
            if g["value"].is_null().all():
                continue  # a stack of the step did not measure this cell, or failed it: the notes below say which
            by = {r["metric"]: r for r in g.iter_rows(named=True)}
            model, topology, cell, _, factor, step = key
            row = {"cell": cell, "model": model, "topology": topology, "step": step, "factor": factor}
            row |= {m: _x(by[m]["value"], by[m]["lo"], by[m]["hi"]) if m in by else "—" for m in shown}
            rows.append(row)
        if not rows:
            parts.append(f"<p><b>{html.escape(chain[0])}</b>: no factor could be computed.</p>")
            continue
        table = pl.DataFrame(rows)
        if table["model"].n_unique() == 1 and table["topology"].n_unique() == 1:
            table = table.drop("model", "topology")
        notes = sorted({n for n in df["note"].to_list() if n})
        parts.append(f"<p><b>{html.escape(chain[0])}</b></p>" + html_table(table))
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes]
    if stacks is not None and stacks.height:
        served = stacks.select(
            "cell", "stack", "offered_rps", "goodput_rps", "output_tok_s", "ttft_s_median", "tpot_s_median",
            "prefix_cache_hit_rate", "slo_met",
        )  # fmt: skip
        parts.append(
            "<p><b>What each stack served</b> (geometric means over runs; hit rates, medians)</p>" + html_table(served)
        )
    return "".join(parts)


CHART_METRICS = ["goodput", "TTFT p50", "TPOT p50", "E2E p50", *SESSION_SCREEN]


def _chart(df: pl.DataFrame, x: alt.X, marks: alt.Chart, heading: str, cells: pl.DataFrame, width: int) -> alt.Chart:
    """Each chain's factors (rows) per metric (columns) along x, with their intervals."""
    df = df.filter(pl.col("metric").is_in(CHART_METRICS)).with_columns(
        pl.format("{}: {}", "step", "factor").alias("series")
    )
    steps = pl.col("position").filter(pl.col("position") > 0).n_unique().over("chain")
    df = df.filter((pl.col("position") > 0) | (steps > 1))  # a one-step chain's total is that step
    base = alt.Chart().encode(x=x, color=alt.Color("series:N", title="step"))
    y = alt.Y("value:Q", scale=alt.Scale(type="log"), title="speedup (above 1: faster)")
    values = marks.encode(x=x, color=alt.Color("series:N", title="step"), y=y)
    bars = base.mark_errorbar().encode(y=alt.Y("lo:Q", title=None), y2="hi:Q")
    one = alt.Chart().mark_rule(strokeDash=[3, 3], color="grey").encode(y=alt.datum(1))
    return (
        alt.layer(values, bars, one, data=df.to_pandas())
        .properties(width=width, height=160)
        .facet(column=alt.Column("metric:N", title=None), row=alt.Row("chain:N", title=None))
        .resolve_scale(y="independent")
        .properties(title=title(heading, cells))
    )


def factors_chart(factors: pl.DataFrame, cells: pl.DataFrame) -> alt.Chart:
    """Each chain's factors against the offered request rate, on goodput and the median
    latencies, with their intervals (request-rate cells only: a trace's cells have no one rate,
    a sessions cell's is of sessions)."""
    line = alt.Chart().mark_line(point=True).encode(tooltip=["chain", "series", "metric", "rate_rps", "value"])
    x = alt.X("rate_rps:Q", scale=alt.Scale(type="log"), title="offered requests/s")
    heading = "Factors under traffic vs the offered rate (goodput and median latencies)"
    return _chart(factors.filter(pl.col("rate_rps").is_not_null() & ~SESSION_CELL), x, line, heading, cells, 200)


def trace_chart(factors: pl.DataFrame, cells: pl.DataFrame) -> alt.Chart:
    """Each chain's factors at its trace-replay and sessions cells (no one request rate: a
    point per cell), on goodput and the median latencies, with their intervals."""
    points = alt.Chart().mark_point(filled=True, size=60).encode(tooltip=["chain", "series", "metric", "cell", "value"])
    measured = factors.filter((pl.col("rate_rps").is_null() | SESSION_CELL) & pl.col("value").is_not_null())
    heading = "Factors at trace-replay and sessions cells (goodput and median latencies)"
    return _chart(measured, alt.X("cell:N", title="cell"), points, heading, cells, 160)


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    """The factors against the rate (rate cells), and at trace-replay cells (which have none)."""
    factors = frames.get("traffic_factors")
    if factors is None:
        return {}
    out = {}
    measured = factors.filter(pl.col("value").is_not_null())
    if measured.filter(pl.col("rate_rps").is_not_null() & ~SESSION_CELL).height:
        out["traffic"] = factors_chart(factors, flat(frames["cells"]))
    if measured.filter(pl.col("rate_rps").is_null() | SESSION_CELL).height:
        out["traffic_trace"] = trace_chart(factors, flat(frames["cells"]))
    return out


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "traffic" not in frames:
        return ""
    return html_section(
        "Traffic",
        "Open-loop cells (config <i>workloads.*.arrival</i>, <i>trace</i> or <i>sessions</i>): each stack's "
        "offered and served "
        "rate, latency percentiles (geometric means over runs) and prefix-cache hit rate (a median), then "
        "every chain's factors per metric as speedups (a latency as old / new), with intervals and which way each goes. Runs "
        "whose client fell behind its schedule (client_lag) are left out.",
        html_table(flat(frames["traffic"])),
        html_table(frames["traffic_factors"].drop("position")),
    )


def enabled(config: Experiment) -> bool:
    return any(c.rate is not None for c in gridmod.cells(config))


ANALYSIS = Analysis(
    "traffic",
    order=5,
    tables=("traffic", "traffic_factors"),
    enabled=enabled,
    spec=enabled,
    build=build,
    charts=charts,
    section=section,
    answer=answer,
)
