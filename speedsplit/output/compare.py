"""`speedsplit compare A B`: two result sets side by side, as tables (compare_stacks,
compare_factors; CSV and parquet) and one HTML page that says first what each side ran on
(hardware, versions, commit) and then the ratios B / A. A and B are results folders (bench/
inside) or evidence folders (results/bench/ inside)."""

from __future__ import annotations

import html
from pathlib import Path

import polars as pl

from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.analysis import compare as cmp
from speedsplit.analysis import frames as f
from speedsplit.core.formats import difference_text, html_table, value_text, write_frames
from speedsplit.core.quality import QualityRecord
from speedsplit.core.record import Provenance, read_result
from speedsplit.core.results import write_bytes_atomic


def result_paths(folder: str | Path) -> list[Path]:
    """The run results under a results folder or an evidence folder; one line if none."""
    folder = Path(folder)
    for bench in (folder / "bench", folder / "results" / "bench"):
        paths = sorted(bench.glob("**/run*.json"))
        if paths:
            return paths
    raise SystemExit(f"speedsplit: no result files under {folder}/bench or {folder}/results/bench")


# What a cell's load is: a cell of the same name on both sides but another of these is another
# experiment (its numbers set side by side say nothing of the two machines or versions).
LOAD = (
    "users",
    "prompt_tokens",
    "output_tokens",
    "requests_per_user",
    "warmup_requests",
    *ClosedLoopSettings.model_fields,
    "warmup",
    "temperature",
    "top_p",
    "seed",
    "arrival",
    "lengths",
    "trace",
)


def side(folder: str | Path) -> tuple[pl.DataFrame, Provenance, dict[tuple, dict], dict[tuple, QualityRecord], list]:
    """One side's runs (one machine: refused otherwise), the provenance of its first result,
    each (model, stack, topology, cell)'s load (LOAD, from its first run), each (model,
    topology, stack)'s quality record, and the results themselves."""
    results = [read_result(p) for p in result_paths(folder)]
    runs = f.runs_frame(results)
    try:
        f.check_one_machine(runs)
    except f.MixedHardware as exc:
        raise SystemExit(f"speedsplit: {folder}: {exc}") from None
    loads, quality = {}, {}
    for r in results:
        cell = {**r.job.cell.model_dump(exclude={"load"}), **r.job.cell.flat_load()}
        loads.setdefault((r.model, r.stack, r.topology, r.cell), {k: cell[k] for k in LOAD})
        if r.quality is not None:
            quality.setdefault((r.model, r.topology, r.stack), r.quality)
    return runs, results[0].provenance, loads, quality, results


WHY_KEYS = ["model", "topology", "cell", "factor"]


def why_frame(side_a: tuple, side_b: tuple, chains: dict[str, list[str]], tolerate_flags=()) -> pl.DataFrame:
    """Each chain step's why on each side, where that side can say it: as the client and the
    engine saw it (analysis/mechanism) and kernel by kernel (analysis/step_time, where the
    side profiled both stacks)."""
    from speedsplit.analysis import step_time
    from speedsplit.analysis.mechanism import mechanism_frame, why_words

    said: dict[tuple, dict] = {}
    for name, (runs, results) in (("a", side_a), ("b", side_b)):
        for r in mechanism_frame(runs, chains, tolerate_flags).iter_rows(named=True):
            if words := why_words(r):
                said.setdefault(tuple(r[k] for k in WHY_KEYS), {})[f"why_{name}"] = words
        frame = step_time.step_time_frame(results, runs)
        for r in step_time.step_time_changes(frame, chains).iter_rows(named=True):
            frm, to = r["step"].split(" → ")
            key = (r["model"], r["topology"], r["cell"], f"{to}/{frm}")
            said.setdefault(key, {})[f"why_kernels_{name}"] = step_time.sentence(r)
    rows = [{**dict(zip(WHY_KEYS, key)), **words} for key, words in said.items()]
    schema = {
        **dict.fromkeys(WHY_KEYS, pl.Utf8),
        **dict.fromkeys(["why_a", "why_b", "why_kernels_a", "why_kernels_b"], pl.Utf8),
    }
    return pl.DataFrame(rows, schema=schema)


def load_differences(a: dict[tuple, dict], b: dict[tuple, dict]) -> list[str]:
    """A warning per cell measured on both sides under one name with another load."""
    by_cell: dict[tuple, list[str]] = {}
    for key in sorted(a.keys() & b.keys()):
        diff = tuple(f"{k} {a[key][k]!r} vs {b[key][k]!r}" for k in LOAD if a[key][k] != b[key][k])
        if diff:
            by_cell.setdefault((key[0], key[3], diff), []).append(key[1])
    return [
        f"warning: {cell} ({model}) is another load on each side: {', '.join(diff)} (A vs B; "
        f"{', '.join(stacks)}): its ratios set two experiments side by side"
        for (model, cell, diff), stacks in by_cell.items()
    ]


def describe(name: str, folder: str | Path, prov: Provenance, runs: pl.DataFrame) -> str:
    """One line: what a side ran on and with what."""
    hw = sorted(set(runs.filter(pl.col("status") == "ok")["hardware"].to_list())) or ["no run ok"]
    keep = ("vllm", "torch", "transformers")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(prov.versions.items()) if k in keep)
    return (
        f"{name} = {folder}: {'; '.join(hw)}; {versions or 'versions not recorded'}; "
        f"workflow {prov.workflow_commit[:10]}; {runs.height} runs"
    )


def _x(v, lo, hi) -> str:
    return f"{value_text(v, 3)}× [{value_text(lo, 3)}, {value_text(hi, 3)}]"


QUALITY_SCHEMA = {
    "model": pl.String,
    "topology": pl.String,
    "stack": pl.String,
    "perplexity_a": pl.Float64,
    "perplexity_b": pl.Float64,
    "b_over_a": pl.Float64,
    "lo": pl.Float64,
    "hi": pl.Float64,
    "prompts": pl.Int64,
    "agree": pl.Int64,
    "compared_by": pl.String,
}


def quality_frame(a: dict[tuple, QualityRecord], b: dict[tuple, QualityRecord]) -> pl.DataFrame:
    """Per stack probed on both sides: its perplexity on each and B / A (paired by window), and
    how many of its continuations B says as A did: did the new engine change what it says?"""
    from speedsplit.analysis import quality as q

    rows = []
    for key in sorted(a.keys() & b.keys()):
        ratio, same = q.perplexity_ratio(a[key], b[key]), q.compare_outputs(a[key], b[key])
        rows.append(
            dict(zip(("model", "topology", "stack"), key))
            | {"perplexity_a": q.perplexity(a[key])[0], "perplexity_b": q.perplexity(b[key])[0]}
            | dict(zip(("b_over_a", "lo", "hi"), ratio))
            | {k: same.get(k) for k in ("prompts", "agree", "compared_by")}
        )
    return pl.DataFrame(rows, schema=QUALITY_SCHEMA)


TASKS_SCHEMA = {
    "model": pl.String,
    "topology": pl.String,
    "stack": pl.String,
    "task": pl.String,
    "metric": pl.String,
    "a": pl.Float64,
    "b": pl.Float64,
    "b_minus_a": pl.Float64,
    "lo": pl.Float64,
    "hi": pl.Float64,
}


def tasks_frame(a: dict[tuple, QualityRecord], b: dict[tuple, QualityRecord]) -> pl.DataFrame:
    """Per stack and lm-evaluation-harness task metric scored on both sides: B's value less A's,
    with its 95% interval (analysis/quality_tasks.difference)."""
    from speedsplit.analysis.quality_tasks import difference

    rows = []
    for key in sorted(a.keys() & b.keys()):
        ta, tb = ({(t.task, t.metric): t for t in side[key].tasks} for side in (a, b))
        for task, metric in sorted(ta.keys() & tb.keys()):
            x, y = ta[(task, metric)], tb[(task, metric)]
            rows.append(
                dict(zip(("model", "topology", "stack"), key))
                | {"task": task, "metric": metric, "a": x.value, "b": y.value}
                | dict(zip(("b_minus_a", "lo", "hi"), difference(x, y)))
            )
    return pl.DataFrame(rows, schema=TASKS_SCHEMA)


def lines(
    stacks: pl.DataFrame,
    factors: pl.DataFrame,
    quality: pl.DataFrame | None = None,
    tasks: pl.DataFrame | None = None,
    why: pl.DataFrame | None = None,
    priced: pl.DataFrame | None = None,
) -> list[str]:
    """The comparison in words: each chain factor with its why on each side, then each stack's
    throughput, B / A, and what a million of its output tokens cost on each side, then each
    stack's quality and task scores."""
    out = []
    whys = {tuple(r[k] for k in WHY_KEYS): r for r in ([] if why is None else why.iter_rows(named=True))}
    for r in factors.iter_rows(named=True):
        out.append(
            f"{r['factor']} at {r['cell']} ({r['model']}, {r['topology']}): "
            f"A {value_text(r['a'], 3)}×, B {value_text(r['b'], 3)}×, B/A {_x(r['b_over_a'], r['lo'], r['hi'])}"
        )
        w = whys.get(tuple(r[k] for k in WHY_KEYS), {})
        for side in ("a", "b"):
            if w.get(f"why_{side}"):
                out.append(f"    why on {side.upper()}, as the client saw it: {w[f'why_{side}']}")
            if w.get(f"why_kernels_{side}"):
                out.append(f"    why on {side.upper()}, kernel by kernel: {w[f'why_kernels_{side}']}")
    for r in stacks.filter(pl.col("metric") == "output_tok_s").iter_rows(named=True):
        out.append(
            f"{r['stack']} at {r['cell']} ({r['model']}, {r['topology']}): output tok/s "
            f"A {value_text(r['a'], 4)}, B {value_text(r['b'], 4)}, B/A {_x(r['b_over_a'], r['lo'], r['hi'])}"
        )
    for r in [] if priced is None else priced.iter_rows(named=True):
        out.append(
            f"cost of {r['stack']} at {r['cell']} ({r['model']}, {r['topology']}): a million output tokens "
            f"A ${value_text(r['usd_per_m_output_a'], 3)}, B ${value_text(r['usd_per_m_output_b'], 3)}, "
            f"B/A {_x(r['b_over_a'], r['lo'], r['hi'])} (an hour: A ${value_text(r['hour_usd_a'], 3)}, "
            f"B ${value_text(r['hour_usd_b'], 3)})"
        )
    for r in [] if quality is None else quality.iter_rows(named=True):
        said = []
        if r["b_over_a"] is not None:
            said.append(
                f"perplexity A {value_text(r['perplexity_a'], 4)}, B {value_text(r['perplexity_b'], 4)}, "
                f"B/A {_x(r['b_over_a'], r['lo'], r['hi'])}"
            )
        if r["prompts"]:
            said.append(f"{r['agree']}/{r['prompts']} continuations the same ({r['compared_by']})")
        out.append(
            f"quality of {r['stack']} ({r['model']}, {r['topology']}): {'; '.join(said) or 'nothing to compare'}"
        )
    for r in [] if tasks is None else tasks.iter_rows(named=True):
        out.append(
            f"{r['task']} {r['metric'].partition(',')[0]} of {r['stack']} ({r['model']}, {r['topology']}): "
            f"A {value_text(r['a'], 3)}, B {value_text(r['b'], 3)}, B−A {difference_text(r['b_minus_a'], r['lo'], r['hi'])}"
        )
    return out


def nothing_to_compare(runs_a: pl.DataFrame, runs_b: pl.DataFrame) -> str:
    """Why two sides have nothing in common to set side by side, in one line."""
    models = [sorted(set(r["model"].to_list())) for r in (runs_a, runs_b)]
    if not set(models[0]) & set(models[1]):
        return (
            f"nothing to compare: the models differ (A measured {', '.join(models[0])}; B measured "
            f"{', '.join(models[1])}): compare two result sets of the same model"
        )
    keys = ["model", "stack", "topology", "cell"]
    both = runs_a.select(keys).unique().join(runs_b.select(keys).unique(), on=keys)
    if both.is_empty():
        return "nothing to compare: no stack measured the same cell on both sides"
    return "nothing to compare: no stack and cell measured cleanly on both sides"


def compare(
    a: str | Path,
    b: str | Path,
    chains: dict[str, list[str]],
    out: str | Path,
    tolerate_flags=(),
    prices: tuple[dict | None, dict | None] = (None, None),
) -> list[str]:
    """Write the comparison under `out` (tables/, compare.html); its lines, for the terminal.
    prices: each side's cost spec (analysis.cost's shape; None: that side is not priced)."""
    from speedsplit.analysis import cost
    from speedsplit.output.report import CSS

    (runs_a, prov_a, load_a, quality_a, res_a), (runs_b, prov_b, load_b, quality_b, res_b) = side(a), side(b)
    stacks = cmp.stacks_frame(runs_a, runs_b, tolerate_flags)
    factors = cmp.factors_frame(runs_a, runs_b, chains, tolerate_flags)
    quality, tasks = quality_frame(quality_a, quality_b), tasks_frame(quality_a, quality_b)
    why = why_frame((runs_a, res_a), (runs_b, res_b), chains, tolerate_flags)
    priced = (
        cost.compare_frame(stacks, runs_a, runs_b, *prices)
        if all(p is not None for p in prices)
        else pl.DataFrame(schema=cost.COMPARE_SCHEMA)
    )
    out = Path(out)
    frames = {
        "compare_stacks": stacks,
        "compare_factors": factors,
        "compare_quality": quality,
        "compare_tasks": tasks,
        "compare_why": why,
        "compare_cost": priced,
    }
    write_frames(frames, out / "tables")
    head = [describe("A", a, prov_a, runs_a), describe("B", b, prov_b, runs_b)] + load_differences(load_a, load_b)
    head += [w for side, runs in (("A", runs_a), ("B", runs_b)) if (w := cmp.left_out(runs, side, tolerate_flags))]
    said = lines(stacks, factors, quality, tasks, why, priced) or [nothing_to_compare(runs_a, runs_b)]
    page = "".join(
        [
            f"<!doctype html><html><head><meta charset='utf-8'><title>speedsplit compare</title>"
            f"<style>{CSS}</style></head><body><h1>speedsplit: B against A</h1>",
            "".join(f"<p>{html.escape(h)}</p>" for h in head),
            "<section id='answer'><h2>The answer</h2>",
            "".join(f"<p class='headline'>{html.escape(t)}</p>" for t in said),
            "</section><p class='note'>Ratios B / A of geometric means over runs with 95% t intervals (each "
            "side's and stack's runs apart). Throughput: above 1 B is faster; latency: below 1 B is "
            "faster. Only clean runs count (status ok, no flag). Different hardware is allowed here: "
            "nothing is pooled.</p>",
            "<h2>Chain factors</h2>",
            html_table(factors) if factors.height else "<p>—</p>",
            "<h2>Why, on each side</h2><p class='note'>Each chain step as each side's client and engine saw "
            "it (requests in flight × tokens a request × latency; steps a second × tokens a step) and, where the "
            "side profiled both stacks, kernel by kernel (mechanism.profile).</p>",
            html_table(why) if why.height else "<p>—</p>",
            "<h2>Stacks</h2>",
            html_table(stacks) if stacks.height else "<p>—</p>",
            "<h2>Cost per token</h2><p class='note'>An hour of each side's cards (--card-hour-usd-a/-b, else "
            "the config's analysis.cost) over the output tokens its stack served in that hour; B / A is the hours' "
            "ratio over the throughput's, its interval the throughput's, ends swapped: below 1 a token is cheaper "
            "on B.</p>",
            html_table(priced) if priced.height else "<p>Not priced on both sides.</p>",
            "<h2>Quality</h2><p class='note'>Each stack probed on both sides: its perplexity (B / A paired by "
            "window, 95% t interval) and how many of its greedy continuations are the same.</p>",
            html_table(quality) if quality.height else "<p>—</p>",
            "<h2>Task accuracy</h2><p class='note'>Each lm-evaluation-harness metric scored on both sides "
            "(quality.lm_eval): B less A, its 95% interval from the two standard errors.</p>",
            html_table(tasks) if tasks.height else "<p>—</p>",
            "</body></html>",
        ]
    )
    write_bytes_atomic(out / "compare.html", page.encode())
    return head + said


def highest_measured(cells_table: str | Path) -> float | None:
    """The highest output tok/s a cell of a results folder measured (None: no such table)."""
    from speedsplit.core.formats import read_frame

    if not Path(cells_table).is_file():
        return None
    return read_frame(cells_table)["output_tok_s"].max()
