"""Rule plan: every server session of the grid and the session of every job (results/plan.json)."""

from _job import to_log

from speedsplit.results import write_json_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
write_json_atomic(sm.output[0], sm.params.plan)
