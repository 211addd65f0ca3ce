"""What a finished workflow run says on the terminal: the answer sentences, every failed run
with its cause, and where the report is, so nobody has to open a log to learn that a cell
failed. A run whose chains could not all be decomposed is a failed run (exit code 1) unless
`benchmark.fail_on_undecomposed` is false.

    speedsplit summary [--results results]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from speedsplit.output.failed import failed_results


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
    steps = factors.filter((factors["position"] > 0) & factors["metric"].is_in(["goodput", "TTFT p50", "TPOT p50"]))
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


def lines(results: str | Path = "results") -> tuple[list[str], bool]:
    """The summary's lines, and whether every measured chain was decomposed."""
    results = Path(results)
    out = ["", "speedsplit: what this run found"]
    answer = _frame(results / "tables" / "answer.parquet")
    for sentence in [] if answer is None else answer["sentence"].to_list():
        out.append(f"  {sentence}")
    out += traffic_lines(_frame(results / "tables" / "traffic_factors.parquet"))
    missing = undecomposed(results)
    for why in missing:
        out.append(f"  NOT DECOMPOSED: {why}")
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
        out.append("  list them: speedsplit failed; re-measure: speedsplit failed --rerun -- ...")
    report = results / "report.html"
    if report.exists():
        out.append(f"  report: {report.resolve()}")
    return out, not missing


def close_run(results: str | Path = "results", fail_on_undecomposed: bool = True) -> str | None:
    """Print the summary to stderr; returns the reason the run should fail, or None."""
    text, decomposed = lines(results)
    print("\n".join(text), file=sys.stderr, flush=True)
    if not decomposed and fail_on_undecomposed:
        return "not every chain could be decomposed (see above); benchmark.fail_on_undecomposed: false accepts that"
    return None
