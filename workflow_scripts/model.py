"""Rule model: acquire one model (hub download or synthetic shape)."""

from _job import to_log

from speedsplit.lease import cuda_devices
from speedsplit.models import acquire

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
with cuda_devices(1, sm.params.platform):  # random weights are drawn on a leased card, if any
    print(acquire(sm.params.entry, sm.output[0]))
