"""Rule report: the self-contained HTML report."""

from pathlib import Path

from _job import to_log

from speedsplit.output.aggregate import write_report

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_report(
    sm.output[0],
    config=sm.params.config,
    result_paths=list(sm.input.results),
    tables_dir=Path(sm.input.tables[0]).parent,
    plots_dir=sm.input.plots,
    link_json=sm.input.link[0] if sm.input.link else None,
)
print(f"report: {Path(sm.output[0]).resolve()}")
