"""The base every other folder stands on: the typed result record (record), writing files
atomically and without secrets (results), process groups and signals (procs), frame I/O and
the text of values (formats), time intervals (intervals). Imports nothing of speedsplit above it."""
