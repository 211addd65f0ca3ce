"""One self-contained HTML report that answers first: its first screen states each chain's
decomposition at its headline cells in one sentence with intervals, draws it as a log-scale
waterfall and lists the flags that qualify it; then every table and plot (SVG inlined, so it
opens offline; no script is loaded), every failure, and the setup with the configuration
collapsed.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import polars as pl

from speedsplit.analysis.answer import qualifiers
from speedsplit.analysis.capacity import card_memory_peak
from speedsplit.core.errors import UserError
from speedsplit.core.formats import for_people, html_table
from speedsplit.core.record import Provenance
from speedsplit.core.results import redact, write_bytes_atomic

CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1rem 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;max-width:22em;overflow-wrap:anywhere}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.bad{background:#fde8e8}.note{color:#666;font-size:13px}
#answer{border-bottom:2px solid #ddd;margin-bottom:1rem}
.headline{font-size:17px;line-height:1.45;margin:.4rem 0}
.flags li{font-size:13px;color:#8a4b00}.clean{font-size:13px;color:#2d6a2d}
figure{margin:1.5rem 0;overflow-x:auto}figcaption{font-size:13px;color:#555}
.scroll{overflow-x:auto}
code,pre{background:#f6f6f6;padding:2px 4px}pre{padding:8px;overflow:auto;font-size:12px}
"""


# Inline (no file is loaded), last in the body: each figure records the size its SVG is laid
# out at and the body where the first headline sentence ends, so a headless browser can check
# what a reader's first screen shows (tests/test_workflow.py). Asking for a box lays the page
# out there and then: the probe waits for no event.
RENDER_PROBE = """<script>
for (const f of document.querySelectorAll('figure')) {
  const svg = f.querySelector('svg'), r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  f.dataset.rendered = Math.round(r.width) + 'x' + Math.round(r.height);
}
const headline = document.querySelector('#answer .headline');
document.body.dataset.headlineBottom = headline ? Math.round(headline.getBoundingClientRect().bottom) : -1;
document.body.dataset.viewport = innerWidth + 'x' + innerHeight;
document.body.dataset.pageWidth = document.documentElement.scrollWidth;
</script>"""


def _figure(name: str, svg: str | Path) -> str:
    return (
        f"<figure id='plot-{html.escape(name)}'>{Path(svg).read_text()}<figcaption>{html.escape(name)} "
        f"(also as <a href='plots/{html.escape(name)}.html'>interactive HTML</a> and PNG)</figcaption></figure>"
    )


def memory_cap_note(runs: pl.DataFrame) -> str:
    """What the memory cap emulated, what it cannot, and where a server held more of the card
    than the cap ("" when no server ran under one)."""
    capped = runs.filter(pl.col("card_memory_gib").is_not_null())
    if not capped.height:
        return ""
    caps = capped.group_by("card_memory_gib").agg(pl.col("stack").unique().sort()).sort("card_memory_gib")
    which = "; ".join(f"{', '.join(r['stack'])} as if on a {r['card_memory_gib']:g} GiB card" for r in caps.to_dicts())
    hardware = "; ".join(sorted(set(capped["hardware"].drop_nulls().to_list()))) or "the real card"
    over = []
    for (stack, cap), df in capped.group_by(["stack", "card_memory_gib"], maintain_order=True):
        peak = card_memory_peak(df)
        if peak is not None and peak > cap:
            fit = df["kv_cache_fit_gib"].min()
            kv = df["kv_cache_gib"].min()
            over.append(
                f"{stack} held up to {peak:.1f} GiB of a card"
                + (f" (its KV cache {kv:g} GiB; {fit:g} GiB would have fit, by vLLM's own estimate)" if fit else "")
            )
    leak = (
        " <b>Over the cap</b> (NVML, every process on the card): " + html.escape("; ".join(over)) + "." if over else ""
    )
    return (
        f"<p class='note'><b>Memory cap</b> (<i>card_memory_gib</i>): {html.escape(which)}, on {html.escape(hardware)}. "
        "vLLM took that share of the card (--gpu-memory-utilization); a server without such a flag ran "
        "under speedsplit.serving.memcap (its allocator capped, free memory reported as the small card's). "
        "Bandwidth and compute stay the real card's: the cap reproduces where a smaller card runs out "
        f"of memory (KV cache, batch, capacity), not its speed; the throughput and latency here are the "
        f"real card's.{leak}</p>"
    )


def headline_stacks(attribution: pl.DataFrame, cells: pl.DataFrame, chains: dict[str, list[str]]) -> pl.DataFrame:
    """What each stack of a chain served at the headline cells, in absolute terms: the linear
    kernel its engine reported (a stack's name says what was asked for: vllm-marlin runs vLLM's
    CPU kernel on a CPU), throughput with its interval and the latency percentiles a reader
    weighs against it."""
    if not attribution.height or "headline" not in attribution.columns:
        return pl.DataFrame()
    head = attribution.filter(pl.col("headline")).select("model", "topology", "cell").unique(maintain_order=True)
    stacks = list(dict.fromkeys(s for chain in chains.values() for s in chain))
    df = cells.join(head, on=["model", "topology", "cell"], how="inner").filter(pl.col("stack").is_in(stacks))
    if not df.height:
        return df
    return df.sort(pl.col("stack").replace_strict({s: i for i, s in enumerate(stacks)}, default=len(stacks))).select(
        "cell",
        "stack",
        pl.col("linear_kernel").list.join(", ").replace("", "none reported").alias("kernel that ran"),
        pl.when(pl.col("output_tok_s_lo").is_null() | pl.col("output_tok_s_hi").is_null())
        .then(pl.col("output_tok_s").round(1).cast(pl.Utf8))  # one run: the value alone, no interval
        .otherwise(
            pl.format(
                "{} [{}, {}]", *(pl.col(c).round(1) for c in ("output_tok_s", "output_tok_s_lo", "output_tok_s_hi"))
            )
        )
        .alias("output tok/s"),
        (pl.col("ttft_s_median") * 1000).round(1).alias("TTFT p50 ms"),
        (pl.col("ttft_s_p99") * 1000).round(1).alias("TTFT p99 ms"),
        (pl.col("tpot_s_median") * 1000).round(2).alias("TPOT p50 ms"),
        (pl.col("e2e_s_p99")).round(2).alias("E2E p99 s"),
    )


def answer_section(
    sentences: pl.DataFrame,
    waterfalls: dict[str, str | Path],
    qualifiers: list[str],
    answers: list[str] = (),
    served: pl.DataFrame | None = None,
) -> str:
    """The first screen: the analyses' own answers (traffic first), the decomposition in
    words, what each stack served there, its waterfall, what qualifies it."""
    parts = ["<section id='answer'><h2>The answer</h2>", *answers]
    if sentences.height:
        parts += ["<h3>The chain</h3>"] if answers else []
        for row in sentences.iter_rows(named=True):
            parts.append(f"<p class='headline'>{html.escape(row['sentence'])}</p>")
            if row.get("why"):  # the step's mechanism as the client saw it (analysis/mechanism.py)
                steps = "".join(f"<li>{html.escape(w)}</li>" for w in row["why"].split(" | "))
                parts.append(f"<p class='note'>Why, as the client saw it:</p><ul>{steps}</ul>")
            if row.get("why_kernels"):  # the decode step by kernel class (analysis/step_time.py)
                steps = "".join(f"<li>{html.escape(w)}</li>" for w in row["why_kernels"].split(" | "))
                parts.append(f"<p class='note'>Why, kernel by kernel:</p><ul>{steps}</ul>")
        if served is not None and served.height:
            parts.append("<p class='note'>What each stack served at those cells (geometric means over runs):</p>")
            parts.append(html_table(served))
    elif not answers:
        parts.append(
            "<p class='headline'>No chain has every stack measured in these results: nothing to decompose "
            "(what was measured is in the sections below).</p>"
        )
    parts += [_figure(name, svg) for name, svg in waterfalls.items()]
    if qualifiers:
        parts.append("<p><b>What qualifies these numbers:</b></p><ul class='flags'>")
        parts += [f"<li>{html.escape(q)}</li>" for q in qualifiers]
        parts.append("</ul>")
    else:
        parts.append(
            "<p class='clean'>Nothing qualifies them: every run counted, every engine ran the kernel "
            "asked for, every measured phase was long enough, every request completed.</p>"
        )
    parts.append("</section>")
    return "".join(parts)


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
    frames: dict[str, pl.DataFrame],
    svgs: dict[str, str | Path],
    sections: list[str] = (),
    answers: list[str] = (),
) -> None:
    """Write the report atomically: the answer first, the attribution, then each optional
    analysis's section (as given), the plots, the cells, the failures and the setup."""
    runs, cells, attribution = frames["runs"], frames["cells"], frames["attribution"]
    waterfalls = {name: svg for name, svg in svgs.items() if name == "waterfall"}
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>speedsplit report</title>"
        f"<style>{CSS}</style></head><body>",
        "<h1>speedsplit: where did the serving speedup come from?</h1>",
        answer_section(
            frames["answer"],
            waterfalls,
            qualifiers(runs, attribution),
            list(answers),
            headline_stacks(attribution, cells, config.get("chains") or {}),
        ),
        memory_cap_note(runs),
        "<p class='note'>Throughput = output tokens / wall time of the measured phase. Factors are "
        "ratios of throughput over runs (geometric means) between neighbouring stacks of a chain; they "
        "multiply to the total exactly. Intervals: 95% t over runs (paired by run at open-loop cells), "
        "widened by the client's calibrated offset (the calibration table). Log share = ln(factor) / ln(total). "
        "runs_used: the clean runs of the factor's two stacks together (2 runs each make 4; a total "
        "counts every stack of its chain).</p>",
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
                        "step",
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
    crossover, stability = frames["crossover"], frames["stability"]
    parts += [
        "<h3>Runtime-share crossover</h3>",
        html_table(for_people("crossover", crossover)) if crossover.height else "<p>—</p>",
        "<h3>Cross-model stability</h3>",
        html_table(stability) if stability.height else "<p>—</p>",
    ]
    parts += sections
    parts.append("<h2>Plots</h2>")
    parts += [_figure(name, svg) for name, svg in svgs.items() if name not in waterfalls]
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
    parts.append(setup_section(provenance, config))
    parts.append(RENDER_PROBE + "</body></html>")
    # the page is markup by now: a secret's mark is written escaped (<HF_TOKEN> would be a tag)
    write_bytes_atomic(out, redact("\n".join(parts), mark=lambda name: html.escape(f"<{name}>")).encode())


class ReportError(UserError):
    """No report to check, or nothing to check it with."""


def render(report: str | Path, png: str | Path | None = None, window: tuple[int, int] = (1400, 900)) -> dict:
    """Open the report in headless Chromium (Debian's `chromium`) as a reader's first screen of
    `window` pixels: what the render probe recorded (each figure's rendered size, where the
    first headline sentence ends, the viewport) and, if `png` is given, a screenshot of it."""
    import os
    import re
    import shutil
    import subprocess
    import tempfile

    if not Path(report).is_file():
        raise ReportError(f"no report at {report} (the workflow or `speedsplit aggregate` writes one)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise ReportError(
            "checking a report needs headless Chromium, not installed here (Debian: apt-get install chromium)"
        )
    uri = Path(report).resolve().as_uri()
    with tempfile.TemporaryDirectory() as home:
        base = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={home}/profile",
            f"--window-size={window[0]},{window[1]}",
        ]
        env = {**os.environ, "HOME": home}
        dom = subprocess.run(
            [*base, "--virtual-time-budget=10000", "--dump-dom", uri],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        ).stdout
        if png:
            subprocess.run(
                [*base, f"--screenshot={Path(png).resolve()}", uri], capture_output=True, timeout=180, env=env
            )
    figures = re.findall(r"<figure id=\"([^\"]+)\"[^>]*data-rendered=\"(\d+)x(\d+)\"", dom)
    body = re.search(r"<body[^>]*>", dom)
    attrs = dict(re.findall(r"data-([a-z-]+)=\"([^\"]*)\"", body.group(0))) if body else {}
    return {
        "dom": dom,
        "figures": {name: (int(w), int(h)) for name, w, h in figures},
        "figures_in_page": dom.count("<figure"),
        "headline_bottom": int(attrs.get("headline-bottom", -1)),
        "viewport": tuple(int(x) for x in attrs.get("viewport", "0x0").split("x")),
        "page_width": int(attrs.get("page-width", 0)),
    }


def check_first_screen(report: str | Path, png: str | Path | None = None) -> int:
    """Check a report's first screen in headless Chromium (every figure drawn, the first
    headline on screen, no sideways scrolling of the page), optionally saving it as PNG; print
    what was seen, 1 when it fails."""
    seen = render(report, png)
    blank = [name for name, size in seen["figures"].items() if 0 in size]
    print(
        f"{len(seen['figures'])} of {seen['figures_in_page']} figures rendered"
        + (f" (blank: {', '.join(blank)})" if blank else "")
        + f"; first headline ends at {seen['headline_bottom']} px of a {seen['viewport'][1]} px screen"
        + f"; the page is {seen['page_width']} px wide on a {seen['viewport'][0]} px screen"
    )
    ok = len(seen["figures"]) == seen["figures_in_page"] and not blank and seen["page_width"] <= seen["viewport"][0]
    return 0 if ok and 0 < seen["headline_bottom"] <= seen["viewport"][1] else 1
