"""Rule model: acquire one model (hub download or synthetic shape)."""

from _job import to_log

from speedsplit.models.checkpoint import acquire
from speedsplit.serving.lease import cuda_devices

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
with cuda_devices(1, sm.params.platform):  # random weights are drawn on a leased card, if any
    print(acquire(sm.params.entry, sm.output[0]))
