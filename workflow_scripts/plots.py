"""Rule plots: every chart as HTML, SVG and PNG."""

from _job import to_log

from speedsplit.aggregate import write_plots

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_plots(sm.input.cells, sm.input.attribution, sm.params.chains, sm.output[0])
