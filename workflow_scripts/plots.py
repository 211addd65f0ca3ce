"""Rule plots: every chart as HTML, SVG and PNG."""

from pathlib import Path

from _job import to_log

from speedsplit.analysis import tables as t
from speedsplit import plots
from speedsplit.results import atomic_dir

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
cells = t.read_table(sm.input.cells)
attribution = t.read_table(sm.input.attribution)
with atomic_dir(sm.output[0]) as tmp:
    for name, chart in plots.all_charts(cells, attribution, sm.params.chains).items():
        plots.save(chart, Path(tmp) / name)
