# One job per (model, stack, topology, cell, run). Each job leases its own cards and ports;
# consecutive jobs of one server session (see speedsplit/plan.py) reuse its running server.


rule bench:
    input:
        unpack(bench_inputs),
    output:
        result="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.json",
        requests="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.requests.jsonl",
    params:
        stack=bench_stack,
        cell=bench_cell,
        session=bench_session,
    resources:
        gpu=bench_gpus,
    log:
        "results/logs/bench/{model}/{stack}/{topology}/{cell}/run{run}.log",
    script:
        "../workflow_scripts/bench.py"
