# speedsplit: where did this serving speedup come from?
# Models -> GPTQ quantization -> one benchmark job per (model, stack, topology, cell, run)
# -> tables, attribution, plots and one report. See README.md.
from snakemake.utils import min_version

min_version("9.11")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/bench.smk"
include: "rules/aggregate.smk"


rule all:
    default_target: True
    input:
        all_targets(),
