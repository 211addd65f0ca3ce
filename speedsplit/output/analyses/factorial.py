"""The operational number's confounds: the runtime factor at two batch ceilings of the HF
reference x two sampling modes, decomposed so the rows multiply exactly (config `factorial`)."""

from __future__ import annotations

import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, html_section, times
from speedsplit.planning.grid import factorial_spec


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis import factorial

    return {"factorial": factorial.factorial_frame(b.runs, b.spec, b.tolerate_flags)} if b.spec else {}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    if "factorial" not in frames:
        return ""
    return html_section(
        "The operational number's confounds",
        "The runtime factor (fast stack over the HF reference) at two batch "
        "ceilings of the reference x two sampling modes, at one cell (config <i>factorial</i>). "
        "Effects are on the log scale (shown as factors); the decomposition rows multiply exactly: "
        "operational = matched x batch ceiling x sampling.",
        html_table(frames["factorial"]),
    )


def answer(frames: dict[str, pl.DataFrame]) -> str:
    """The operational runtime factor as the product of its parts, per cell."""
    fa = frames.get("factorial")
    if fa is None or not fa.height:
        return ""
    lines = []
    for (users, workload), df in fa.filter(pl.col("kind") == "decomposition").group_by(
        ["users", "workload"], maintain_order=True
    ):
        rows = {r["name"]: r for r in df.iter_rows(named=True)}
        op = rows.get("operational")
        parts = [f"{n} {times(r['value'], r['lo'], r['hi'])}" for n, r in rows.items() if n != "operational"]
        if op is not None:
            lines.append(
                f"At {users} users ({workload}): operational runtime factor "
                f"{times(op['value'], op['lo'], op['hi'])} = " + " × ".join(parts)
            )
    return answer_block("The operational number, decomposed", lines)


ANALYSIS = Analysis(
    "factorial",
    order=40,
    tables=("factorial",),
    enabled=lambda config: config.factorial.enabled,
    build=build,
    spec=factorial_spec,
    section=section,
    answer=answer,
)
