# One job per (model, stack, topology, cell, run). Each job leases its own cards and ports;
# consecutive jobs of one server session (see speedsplit/plan.py) reuse its running server.


# The cell's definition as a file: it is rewritten only when that cell's params change, and
# its new mtime reruns exactly that cell's benchmark. (A params trigger on the bench rule
# itself is lost when the lane's previous job is rerun too: that input is ancient.)
rule cell_spec:
    output:
        "results/specs/{model}/{stack}/{topology}/{cell}/run{run}.json",
    params:
        stack=bench_stack,
        cell=bench_cell,
        session=bench_session,
    log:
        "results/logs/specs/{model}/{stack}/{topology}/{cell}/run{run}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/cell_spec.py"


rule bench:
    input:
        unpack(bench_inputs),
    output:
        result="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.json",
        requests="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.requests.jsonl",
    resources:
        gpu=bench_gpus,
    log:
        "results/logs/bench/{model}/{stack}/{topology}/{cell}/run{run}.log",
    conda:
        "../envs/serving.yaml"
    script:
        "../workflow_scripts/bench.py"


# The memory bandwidth the stacks' decode is held against (model-bandwidth utilisation).
rule bandwidth:
    output:
        "results/hardware/bandwidth.json",
    params:
        platform=PLATFORM,
        size_mib=2048 if PLATFORM == "cuda" else 512,
    resources:
        gpu=1,
    log:
        "results/logs/bandwidth.log",
    conda:
        "../envs/serving.yaml"
    script:
        "../workflow_scripts/bandwidth.py"


# Everything measured, nothing aggregated: the target for GPU hosts and cluster runs whose
# tables are built elsewhere (python -m speedsplit.aggregate).
rule measurements:
    input:
        bench_results(),
        "results/hardware/bandwidth.json",
