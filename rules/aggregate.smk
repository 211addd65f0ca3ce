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
        quantize=quantize_results(),
    output:
        # parquet: the typed frames plots and the report read; CSV and markdown: for people
        # (the main CSVs also in `snakemake --report`)
        **{f"{name}_parquet": f"results/tables/{name}.parquet" for name in table_names()},
        **{f"{name}_csv": report_table(name) for name in table_names()},
        attribution_md="results/tables/attribution.md",
    params:
        analysis=ss_analyses.analysis_spec(CFG),
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
        report(directory("results/plots"), patterns=["{name}.svg"], caption="../docs/report/plots.rst", category="Plots"),
    params:
        chains=list(CFG.chains),
        kernel_reference=ss_grid.kernel_reference(CFG),
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
        report("results/report.html", caption="../docs/report/report.rst", category="Report"),
    params:
        config=FILLED,
    log:
        "results/logs/report.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/report.py"
