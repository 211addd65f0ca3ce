"""Rule tables: runs, cells (with intervals and MBU), attribution, crossover and stability."""

from pathlib import Path

from _job import to_log

from speedsplit.aggregate import write_tables

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_tables(
    list(sm.input.results),
    sm.params.chains,
    Path(sm.output.cells_parquet).parent,
    sm.input.bandwidth,
    sm.params.tolerate_flags,
    sm.input.link[0] if sm.input.link else None,
    list(sm.input.profiles),
    sm.params.factorial,
)
