# speedsplit: where did this serving speedup come from?
# Models -> GPTQ quantization -> one benchmark job per (model, stack, topology, cell, run)
# -> tables, attribution, plots and one report. See README.md.
import os

from snakemake.utils import min_version

min_version("9.11")


# Your own config/config.yaml in the working directory wins over the shipped default.
configfile: "config/config.yaml" if os.path.exists("config/config.yaml") else f"{workflow.basedir}/config/config.yaml"


# `snakemake --report report.html` (after a run): the plots and main tables, with this text.
report: "docs/report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/bench.smk"
include: "rules/aggregate.smk"


rule all:
    default_target: True
    input:
        all_targets(),


# The terminal's last word: the answers, every failed run with its cause, the report's path.
onsuccess:
    close_run()


onerror:
    close_run(failed=True)
