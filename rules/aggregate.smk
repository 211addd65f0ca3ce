# Aggregation (tables, attribution), plots and the report. Cheap, so they run on the
# submitting machine, and rerun whenever any result file changes.


localrules:
    cell_spec,
    measurements,
    tables,
    plots,
    report,


rule tables:
    input:
        results=bench_results(),
        bandwidth="results/hardware/bandwidth.json",
    output:
        runs="results/tables/runs.csv",
        cells="results/tables/cells.csv",
        cells_parquet="results/tables/cells.parquet",
        attribution="results/tables/attribution.csv",
        attribution_md="results/tables/attribution.md",
        crossover="results/tables/crossover.csv",
        stability="results/tables/stability.csv",
    params:
        chains=CFG["chains"],
        tolerate_flags=CFG["analysis"]["tolerate_flags"],
    log:
        "results/logs/tables.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/tables.py"


rule plots:
    input:
        cells="results/tables/cells.csv",
        attribution="results/tables/attribution.csv",
    output:
        directory("results/plots"),
    params:
        chains=list(CFG["chains"]),
    log:
        "results/logs/plots.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/plots.py"


rule report:
    input:
        results=bench_results(),
        runs="results/tables/runs.csv",
        cells="results/tables/cells.csv",
        attribution="results/tables/attribution.csv",
        crossover="results/tables/crossover.csv",
        stability="results/tables/stability.csv",
        plots="results/plots",
    output:
        "results/report.html",
    params:
        config=CFG,
    log:
        "results/logs/report.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/report.py"
