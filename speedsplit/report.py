"""One self-contained HTML report: setup, every table and plot (SVG inlined, so it opens
offline with no script), and every failure.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import polars as pl

from speedsplit.analysis.formats import for_people, value_text
from speedsplit.record import Provenance
from speedsplit.results import redact, write_bytes_atomic

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1rem 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.bad{background:#fde8e8}.note{color:#666;font-size:13px}
figure{margin:1.5rem 0}figcaption{font-size:13px;color:#555}
code,pre{background:#f6f6f6;padding:2px 4px}pre{padding:8px;overflow:auto;font-size:12px}
"""


def html_table(df: pl.DataFrame, bad_col: str | None = None, max_rows: int = 500) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    rows = []
    for row in df.head(max_rows).iter_rows(named=True):
        cls = ' class="bad"' if bad_col and row.get(bad_col) else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(value_text(v))}</td>" for v in row.values()) + "</tr>")
    more = f'<p class="note">{df.height - max_rows} more rows in the table files.</p>' if df.height > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def setup_section(prov: Provenance | None, config: dict) -> str:
    """Hardware, versions and the config, from a result's provenance (None: no result yet)."""
    cfg = html.escape(redact(json.dumps(config, indent=1, default=str)))
    config_part = f"<details><summary>Config (validated, defaults filled)</summary><pre>{cfg}</pre></details>"
    if prov is None:
        return f"<h2>Setup</h2><p>No result yet.</p>{config_part}"
    hw = prov.hardware
    gpus = ", ".join(f"{g.name} ({g.memory}, driver {g.driver})" for g in hw.gpus or []) or "none"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(prov.versions.items()))
    return (
        f"<h2>Setup</h2><ul><li>GPUs: {html.escape(gpus)}</li>"
        f"<li>CPU: {html.escape(hw.host_cpu)} ({hw.cpu_count} cores)</li>"
        f"<li>Versions: {html.escape(versions)} (Python {html.escape(prov.python)})</li>"
        f"<li>Workflow commit: <code>{html.escape(prov.workflow_commit)}</code></li></ul>" + config_part
    )


def build(
    out: str | Path,
    *,
    config: dict,
    provenance: Provenance | None,
    cells: pl.DataFrame,
    runs: pl.DataFrame,
    attribution: pl.DataFrame,
    crossover: pl.DataFrame,
    stability: pl.DataFrame,
    topologies: pl.DataFrame,
    scaling: pl.DataFrame,
    packing: pl.DataFrame,
    svgs: dict[str, str | Path],
    link: pl.DataFrame | None = None,
    link_matrix: str | None = None,
    coordination: pl.DataFrame | None = None,
    factorial: pl.DataFrame | None = None,
) -> None:
    """Write the report atomically."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>speedsplit report</title>"
        f"<style>{CSS}</style></head><body>",
        "<h1>speedsplit: where did the serving speedup come from?</h1>",
        "<p class='note'>Throughput = output tokens / wall time of the measured phase. Factors are "
        "ratios of median throughput between neighbouring stacks of a chain; they multiply to the "
        "total exactly. Intervals: 95% bootstrap over runs. Log share = ln(factor) / ln(total).</p>",
        setup_section(provenance, config),
    ]
    fact = attribution.filter(pl.col("position") > 0) if attribution.height else attribution
    parts += [
        "<h2>Attribution</h2>",
        html_table(
            attribution.select(
                [
                    c
                    for c in [
                        "chain",
                        "model",
                        "topology",
                        "cell",
                        "factor",
                        "value",
                        "lo",
                        "hi",
                        "log_share",
                        "share_lo",
                        "share_hi",
                        "runs_used",
                        "runs_excluded",
                        "excluded",
                        "note",
                    ]
                    if c in attribution.columns
                ]
            )
        )
        if fact.height
        else "<p>No chain has measurements of all its stacks.</p>",
    ]
    parts += [
        "<h3>Runtime-share crossover</h3>",
        html_table(for_people("crossover", crossover)) if crossover.height else "<p>—</p>",
        "<h3>Cross-model stability</h3>",
        html_table(stability) if stability.height else "<p>—</p>",
    ]
    if topologies["topology"].n_unique() > 1:
        parts += [
            "<h2>Topologies</h2>",
            "<p class='note'>Throughput per GPU and per user of every topology (tp<i>k</i>: one "
            "instance over <i>k</i> cards; <i>m</i>x1: <i>m</i> single-card instances, user <i>u</i> "
            "served by instance <i>u</i> mod <i>m</i>). Factors: ratios of median throughput with 95% "
            "bootstrap intervals; efficiency = factor / ideal; a tie when the interval holds 1.</p>",
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
    if coordination is not None:
        parts += [
            "<h2>Where tensor parallelism loses time</h2>",
            "<p class='note'>From profiler traces of steady decode (results/profile/): per decode step, "
            "tp<i>k</i> against tp1. Shortfall = step time - ideal (tp1 step / <i>k</i>); each excess_ "
            "column is that part at tp<i>k</i> minus its ideal share, and they add up to the shortfall. "
            "coordination_share = (communication + idle gaps) / shortfall. The profiler itself slows "
            "the steps it records; the split, not the absolute step time, is the point.</p>",
            html_table(coordination) if coordination.height else "<p>No tp<i>k</i> was profiled beside tp1.</p>",
        ]
    if factorial is not None:
        parts += [
            "<h2>The operational number's confounds</h2>",
            "<p class='note'>The runtime factor (fast stack over the HF reference) at two batch "
            "ceilings of the reference x two sampling modes, at one cell (config <i>factorial</i>). "
            "Effects are on the log scale (shown as factors); the decomposition rows multiply exactly: "
            "operational = matched x batch ceiling x sampling.</p>",
            html_table(factorial),
        ]
    if link is not None:
        parts += [
            "<h2>Interconnect control</h2>",
            "<p class='note'>All-reduce between two ranks, no server: latency per call and bus "
            "bandwidth per payload, peer-to-peer on (p2p) and off (no_p2p, through host memory). "
            "Rows marked decode_sized are one decode step's activation (users x hidden x 2 bytes). "
            "Every payload is in tables/link.csv.</p>",
            html_table(link.filter(pl.col("decode_sized"))),
            f"<details><summary>GPU topology (nvidia-smi topo -m)</summary><pre>{html.escape(link_matrix or '—')}</pre>"
            "</details>",
        ]
    parts.append("<h2>Plots</h2>")
    for name, svg in svgs.items():
        text = Path(svg).read_text()
        parts.append(
            f"<figure id='plot-{html.escape(name)}'>{text}<figcaption>{html.escape(name)} "
            f"(also as <a href='plots/{html.escape(name)}.html'>interactive HTML</a> and PNG)"
            f"</figcaption></figure>"
        )
    parts += [
        "<h2>Cells</h2>",
        html_table(cells.drop([c for c in cells.columns if c.endswith(("_lo", "_hi"))]), bad_col="failed_requests"),
    ]
    failures = runs.filter((pl.col("status") != "ok") | (pl.col("failed") > 0) | (pl.col("flags").list.len() > 0))
    parts += [
        "<h2>Failures and flags</h2>",
        html_table(
            failures.select(["model", "stack", "topology", "cell", "run", "status", "flags", "failures", "error"]),
            bad_col="status",
        )
        if failures.height
        else "<p>None: every run completed every request, unflagged.</p>",
    ]
    parts.append("</body></html>")
    write_bytes_atomic(out, redact("\n".join(parts)).encode())
