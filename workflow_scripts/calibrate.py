"""Rule calibrate: the load generator's own offsets on this host, against the reference server
of known speed (speedsplit/measuring/calibrate.py)."""

from _job import to_log

from speedsplit.measuring import calibrate

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
# on a CPU the cells' client and server sit on cores of their own (benchmark.cpu_isolation): so
# here. Read from the config, not a param: a new param would rerun the calibration of every
# finished results folder, and with it (its file an input of every bench job) every cell.
split = calibrate.splits(sm.config)
calibrate.run(sm.output[0], list(sm.params.users), split=split)
