"""Rule job_file: write what one cell run measures (the stack and the cell) as JSON."""

from _job import to_log

from speedsplit.results import write_json_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_json_atomic(sm.output[0], {"stack": sm.params.stack, "cell": sm.params.cell})
