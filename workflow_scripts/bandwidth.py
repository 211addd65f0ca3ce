"""Rule bandwidth: the measured memory bandwidth of the device the stacks run on."""

from _job import to_log

from speedsplit.core.results import write_json_atomic
from speedsplit.measuring.hardware import measure

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_json_atomic(sm.output[0], measure(sm.params.platform, size_mib=sm.params.size_mib))
