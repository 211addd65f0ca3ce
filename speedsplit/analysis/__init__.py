"""Analysis: typed frames (frames), the factors (attribution), topologies, the roofline, formats."""

# Frames written by the tables rule, in the order the report shows them (no imports here:
# the Snakefile reads these names on hosts without the analysis packages).
TABLES = (
    "runs",
    "cells",
    "attribution",
    "answer",
    "energy",
    "crossover",
    "stability",
    "topologies",
    "scaling",
    "packing",
)
# Written only where their measurement ran (link: the interconnect control; coordination:
# the profiled split of a tensor-parallel decode step; factorial: the confound factorial;
# capacity: the capacity sweep).
OPTIONAL_TABLES = ("link", "coordination", "factorial", "capacity")
