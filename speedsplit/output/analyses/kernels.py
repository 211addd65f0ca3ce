"""The INT4 kernel sweep: each GPTQ stack (one kernel each) over the FP16 reference, per cell,
with the kernel its engine reported; its first-screen block and its report section."""

from __future__ import annotations

import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, html_section, times
from speedsplit.planning.grid import INT4, bench_stacks, kernel_reference
from speedsplit.planning.experiment import Experiment


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis import kernels

    if not b.spec:
        return {}
    return {"kernels": kernels.kernels_frame(b.runs, b.spec["reference"], b.tolerate_flags)}


def answer(frames: dict[str, pl.DataFrame]) -> str:
    """Per cell: every INT4 kernel over the FP16 reference, fastest first."""
    k = frames.get("kernels")
    if k is None or k["stack"].n_unique() < 2:
        return ""
    # a cell is said by its users and workload where no other cell shares them, else by its name
    # (two samplings share both; an open-loop cell has no users)
    shared = k.group_by(["model", "topology", "users", "workload"]).agg(pl.col("cell").n_unique() > 1)
    by_name = {tuple(r[:4]) for r in shared.rows() if r[4]}
    lines = []
    for (model, topology, cell, users, workload), df in k.group_by(
        ["model", "topology", "cell", "users", "workload"], maintain_order=True
    ):
        df = df.sort("vs_reference", descending=True)
        parts = [
            f"{r['kernel'] or r['stack']} {times(r['vs_reference'], r['lo'], r['hi'])}"
            for r in df.iter_rows(named=True)
        ]
        named = users == 0 or (model, topology, users, workload) in by_name
        where = f"{cell} ({model}, {topology})" if named else f"{users} users ({workload}; {model}, {topology})"
        lines.append(f"INT4 over {df['reference'][0]} at {where}: " + "; ".join(parts))
    return answer_block("INT4 kernels against FP16", lines)


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "kernels" not in frames:
        return ""
    return html_section(
        "INT4 kernels",
        "Each GPTQ stack (the same checkpoint on one kernel each) over the FP16 reference's "
        "throughput at each cell, with the kernel its engine reported; 95% t intervals over "
        "both stacks' clean runs.",
        html_table(frames["kernels"])
        if frames["kernels"].height
        else "<p>No GPTQ stack and reference measured together.</p>",
    )


def spec(config: Experiment) -> dict | None:
    ref = kernel_reference(config)
    return {"reference": ref} if ref else None


def enabled(config: Experiment) -> bool:
    """A sweep: at least two GPTQ stacks benchmarked, and an FP16 stack to set them against."""
    gptq = [s for s in bench_stacks(config) if config.stacks[s].variant in INT4]
    return len(gptq) >= 2 and kernel_reference(config) is not None


ANALYSIS = Analysis(
    "kernels",
    order=15,
    tables=("kernels",),
    enabled=enabled,
    spec=spec,
    build=build,
    section=section,
    answer=answer,
)
