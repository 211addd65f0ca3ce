# One job per (model, stack, topology, cell, run). Each job leases its own cards and ports;
# consecutive jobs of one server session (see speedsplit/plan.py) reuse its running server.


# What one cell run measures (its stack and its cell) as a file: rewritten only when that
# cell's params change, and its new mtime reruns exactly that cell's benchmark. (A params
# trigger on the bench rule itself is lost when the lane's previous job is rerun too: that
# input is ancient.)
rule job_file:
    output:
        "results/jobs/{model}/{stack}/{topology}/{cell}/run{run}.json",
    params:
        stack=bench_stack,
        cell=bench_cell,
    log:
        "results/logs/jobs/{model}/{stack}/{topology}/{cell}/run{run}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/job_file.py"


# The server sessions: which jobs share a server, which job stops it, its log and caches,
# and the timeouts. Bench jobs read it as an ancient input, so a grown grid or a new timeout
# rewrites it without rerunning any finished cell.
rule plan:
    output:
        "results/plan.json",
    params:
        plan=ss_plan.plan_json(CFG),
    log:
        "results/logs/plan.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/plan.py"


# Besides its outputs and log, a bench job appends to its session's server log
# (results/logs/sessions/{session}.log, shared by the session's jobs, so no job's output) and
# lets the servers fill compile caches under results/cache/{stack}/; both paths come from
# the plan. Its lock and state files live in a private folder outside the workflow
# (speedsplit/lease.py).
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
