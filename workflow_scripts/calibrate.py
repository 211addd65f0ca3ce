"""Rule calibrate: the load generator's own offsets on this host, against the reference server
of known speed (speedsplit/measuring/calibrate.py)."""

from _job import to_log

from speedsplit.measuring import calibrate

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
calibrate.run(sm.output[0], list(sm.params.users), split=bool(sm.params.split))
