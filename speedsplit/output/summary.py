"""What a finished workflow run says on the terminal: the answer sentences, every failed run
with its cause, and where the report is, so nobody has to open a log to learn that a cell
failed. A run whose chains could not all be decomposed is a failed run (exit code 1) unless
`benchmark.fail_on_undecomposed` is false.

    speedsplit summary [--results results]
"""

from __future__ import annotations

import os
import shlex
import sys
from collections import defaultdict
from pathlib import Path

from speedsplit.core.results import redact
from speedsplit.output.failed import REMEASURE_ENV, failed_results
from speedsplit.planning import plan


def _frame(path: Path):
    import polars as pl

    return pl.read_parquet(path) if path.exists() else None


def undecomposed(results: Path) -> list[str]:
    """'chain at cell: why' for every headline cell of a measured chain whose total is missing."""
    from speedsplit.analysis.answer import unmeasured

    att = _frame(results / "tables" / "attribution.parquet")
    if att is None or not att.height:
        return []
    out = []
    for row in att.filter((att["position"] == 0) & att["headline"] & att["value"].is_null()).iter_rows(named=True):
        if not unmeasured(row["note"]):
            out.append(f"{row['chain']} at {row['cell']} ({row['model']}, {row['topology']}): {row['note']}")
    return out


def traffic_lines(factors) -> list[str]:
    """Per chain and open-loop cell: its steps' factors on goodput and median latencies
    (speedups: above 1 faster)."""
    if factors is None or not factors.height:
        return []
    out = []
    shown = ["goodput", "TTFT p50", "TPOT p50", "returning-turn TTFT p50", "session p50"]  # the last two: sessions
    steps = factors.filter((factors["position"] > 0) & factors["metric"].is_in(shown))
    from speedsplit.analysis.answer import unmeasured

    for (chain, model, topology, cell), df in steps.group_by(
        ["chain", "model", "topology", "cell"], maintain_order=True
    ):
        where = f"  under traffic, {chain} at {cell} ({model}, {topology}): "
        if df["value"].is_null().all():  # a stack of the chain left this cell out (a capacity level) or failed it
            if not unmeasured(df["note"][0]):
                out.append(where + f"not decomposed ({df['note'][0]})")
            continue
        parts = []
        for (metric,), m in df.group_by(["metric"], maintain_order=True):
            named = ", ".join(
                f"{r['step'] or r['factor']} {'—' if r['value'] is None else format(r['value'], '.3g') + 'x'}"
                for r in m.iter_rows(named=True)
            )
            parts.append(f"{metric}: {named}")
        out.append(where + " | ".join(parts))
    return out


def quality_lines(steps, tasks=None) -> list[str]:
    """Per chain, each step's speed beside its quality (output/analyses/quality.py)."""
    if steps is None:
        return []
    from speedsplit.output.analyses.quality import answer_lines

    return [f"  quality, {line}" for line in answer_lines({"quality": steps, "quality_tasks": tasks})]


def qualifier_lines(results: Path) -> list[str]:
    """What qualifies the numbers, as the report's first screen says it (flagged runs, runs
    left out of the headline, kernels other than asked), less the runs that did not complete
    (listed below with their causes)."""
    from speedsplit.analysis.answer import qualifiers

    runs, att = _frame(results / "tables" / "runs.parquet"), _frame(results / "tables" / "attribution.parquet")
    if runs is None or att is None:
        return []
    return [q for q in qualifiers(runs, att) if " did not complete: " not in q]


def lines(results: str | Path = "results", run_args: list[str] | None = None) -> tuple[list[str], bool]:
    """The summary's lines, and whether every measured chain was decomposed. run_args: the
    Snakemake arguments of the run being closed (the command that re-measures its failed runs
    repeats them)."""
    results = Path(results)
    out = ["", "speedsplit: what this run found"]
    answer = _frame(results / "tables" / "answer.parquet")
    for row in [] if answer is None else answer.iter_rows(named=True):
        out.append(f"  {row['sentence']}")
        if row.get("why"):
            out.append(f"    why, as the client saw it: {row['why']}")
        if row.get("why_kernels"):
            out.append(f"    why, kernel by kernel: {row['why_kernels']}")
        if row.get("cost"):
            out.append(f"    cost: {row['cost']}")
    out += traffic_lines(_frame(results / "tables" / "traffic_factors.parquet"))
    out += quality_lines(
        _frame(results / "tables" / "quality.parquet"), _frame(results / "tables" / "quality_tasks.parquet")
    )
    missing = undecomposed(results)
    for why in missing:
        out.append(f"  NOT DECOMPOSED: {why}")
    out += [f"  qualified: {q}" for q in qualifier_lines(results)]
    if answer is None:
        out.append("  no tables yet (the aggregation did not run)")
    failed = failed_results(results / "bench") if (results / "bench").exists() else []
    by_stack: dict[str, list[str]] = defaultdict(list)
    for path, why in failed:
        stack = path.relative_to(results / "bench").parts[1]
        by_stack[stack].append(f"{path.parent.name}/{path.stem}: {why}")
    if failed:
        out.append(f"  {len(failed)} run(s) did not measure cleanly:")
        for stack, runs in sorted(by_stack.items()):
            causes = sorted({r.split(": ", 1)[1] for r in runs})
            out.append(f"    {stack}: {len(runs)} run(s); " + " | ".join(c[:400] for c in causes[:3]))
        again = redact(shlex.join(run_args)) if run_args else "<your snakemake arguments>"
        out.append(f"  list them: speedsplit failed; re-measure them: speedsplit failed --rerun -- {again}")
        out.append("  (a plain rerun measures nothing again: a failed run is a result, kept with its cause)")
    report = results / "report.html"
    if report.exists():
        out.append(f"  report: {report.resolve()}")
    return out, not missing


def snakemake_args(argv: list[str] | None = None) -> list[str] | None:
    """This Snakemake process's own arguments, less its targets (words before the first
    option), where it was started as Snakemake (plan.snakemake_command_line); None otherwise
    (the API, any other program)."""
    args = plan.snakemake_command_line(argv)
    if args is None:
        return None
    first = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    return args[first:]


def close_run(
    results: str | Path = "results", fail_on_undecomposed: bool = True, run_args: list[str] | None = None
) -> str | None:
    """Print the summary to stderr; returns the reason the run should fail, or None. The first
    of `speedsplit failed --rerun`'s two runs (REMEASURE_ENV set) re-measures cells only: its
    tables are not rebuilt yet, so it says so and leaves the summary to the second."""
    if os.environ.get(REMEASURE_ENV):
        print("\nspeedsplit: failed runs re-measured; the tables, report and summary follow", file=sys.stderr)
        return None
    text, decomposed = lines(results, run_args)
    print("\n".join(text), file=sys.stderr, flush=True)
    if not decomposed and fail_on_undecomposed:
        return "not every chain could be decomposed (see above); benchmark.fail_on_undecomposed: false accepts that"
    return None
