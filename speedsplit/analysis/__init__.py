"""Analysis: the typed frames (frames), the chains' factors (attribution), the headline
answer (answer), and the frames of the optional analyses (topology, factorial, capacity),
which speedsplit/output/analyses declares."""

# The tables every run writes, in the order the report shows them (no imports here: the
# Snakefile reads these names). The optional analyses add theirs (output/analyses).
CORE_TABLES = (
    "runs",
    "cells",
    "attribution",
    "mechanism",
    "answer",
    "crossover",
    "stability",
    "timeline",
    "calibration",
)
