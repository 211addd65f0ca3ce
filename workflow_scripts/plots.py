"""Rule plots: every chart as HTML, SVG and PNG."""

from pathlib import Path

from _job import to_log

from speedsplit.output.aggregate import write_plots

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_plots(Path(sm.input.tables[0]).parent, sm.params.chains, sm.output[0], sm.params.kernel_reference)
