"""Rule tables: every analysis frame (speedsplit.output.aggregate.build_frames)."""

from pathlib import Path

from _job import to_log

from speedsplit.output.aggregate import write_tables

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_tables(
    list(sm.input.results),
    Path(sm.output.cells_parquet).parent,
    bandwidth_json=sm.input.bandwidth,
    link_json=sm.input.link[0] if sm.input.link else None,
    profile_paths=list(sm.input.profiles),
    quantize_paths=list(sm.input.quantize),
    **sm.params.analysis,
)
