"""Rule job_file: write what one cell run measures (a JobSpec: its stack, cell, run and quality probe) as JSON."""

from _job import to_log

from speedsplit.core.results import write_job_file
from speedsplit.core.specs import JobSpec

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
job = JobSpec(stack=sm.params.stack, cell=sm.params.cell, run=int(sm.wildcards.run), quality=sm.params.quality)
write_job_file(sm.output[0], job.model_dump(mode="json"))
