# Aggregation (tables, attribution), plots and the report. Cheap, so they run on the
# submitting machine, and rerun whenever any result file changes.


localrules:
    job_file,
    measurements,
    tables,
    plots,
    report,


rule tables:
    input:
        results=bench_results(),
        bandwidth="results/hardware/bandwidth.json",
        link=link_results(),
        profiles=profile_results(),
    output:
        # parquet: the typed frames plots and the report read; CSV and markdown: for people
        **{f"{name}_{ext}": f"results/tables/{name}.{ext}" for name in table_names() for ext in ("parquet", "csv")},
        attribution_md="results/tables/attribution.md",
    params:
        chains=CFG["chains"],
        tolerate_flags=CFG["analysis"]["tolerate_flags"],
        factorial=ss_config.factorial_spec(CFG),
    log:
        "results/logs/tables.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/tables.py"


rule plots:
    input:
        tables=[f"results/tables/{name}.parquet" for name in table_names()],
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
        link=link_results(),
        tables=[f"results/tables/{name}.parquet" for name in table_names()],
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
