"""Rule report: the self-contained HTML report."""

from pathlib import Path

from _job import to_log

from speedsplit.analysis import tables as t
from speedsplit import report

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
report.build(
    sm.output[0], config=sm.params.config, result_paths=list(sm.input.results),
    runs=t.read_table(sm.input.runs), cells=t.read_table(sm.input.cells),
    attribution=t.read_table(sm.input.attribution), crossover=t.read_table(sm.input.crossover),
    stability=t.read_table(sm.input.stability),
    svgs={p.stem: p for p in sorted(Path(sm.input.plots).glob("*.svg"))},
)
print(f"report: {Path(sm.output[0]).resolve()}")
