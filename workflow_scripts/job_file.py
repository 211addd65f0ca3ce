"""Rule job_file: write what one cell run measures (the stack and the cell) as JSON."""

from _job import to_log

from speedsplit.core.results import write_job_file

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_job_file(sm.output[0], sm.params.stack, sm.params.cell)
