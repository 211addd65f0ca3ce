"""Rule link: the interconnect control (all-reduce between each pair of the job's cards)."""

from _job import to_log

from speedsplit.core.results import write_json_atomic
from speedsplit.measuring import link
from speedsplit.models.checkpoint import read_model_config

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
hidden = [read_model_config(d)["hidden_size"] for d in sm.input.models]
result = link.run(sm.params.platform, sm.params.gpus, link.decode_payloads(sm.params.users, hidden), sm.params.max_mib)
write_json_atomic(sm.output[0], result)
