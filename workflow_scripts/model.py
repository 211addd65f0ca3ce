"""Rule model: acquire one model (hub download or synthetic shape)."""

from _job import to_log

from speedsplit.models import acquire

to_log(snakemake)  # noqa: F821 (injected by Snakemake)
print(acquire(snakemake.params.spec, snakemake.output[0]))  # noqa: F821
