"""Rule tables: runs, cells (with intervals), attribution, crossover and stability tables."""

from _job import to_log

from speedsplit.analysis import tables as t

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
runs = t.runs_frame(list(sm.input.results))
cells = t.cells_frame(runs)
attribution = t.attribution_frame(runs, sm.params.chains)
t.write_table(runs, sm.output.runs)
t.write_table(cells, sm.output.cells, parquet=sm.output.cells_parquet)
t.write_table(attribution, sm.output.attribution, markdown=sm.output.attribution_md)
t.write_table(t.crossover_frame(attribution), sm.output.crossover)
t.write_table(t.stability_frame(attribution), sm.output.stability)
