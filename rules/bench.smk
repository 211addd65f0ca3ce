# One job per (model, stack, topology, cell, run). Each job leases its own cards and ports;
# consecutive jobs of one server session (see speedsplit/planning/plan.py) reuse its running server.


# What one cell run measures (its stack and its cell) as a file: rewritten only when that
# cell's params change, and its new mtime reruns exactly that cell's benchmark. (A params
# trigger on the bench rule itself is lost when the lane's previous job is rerun too: that
# input is ancient.)
rule job_file:
    output:
        "results/jobs/{model}/{stack}/{topology}/{cell}/run{run}.json",
    params:
        stack=job_stack,
        cell=job_cell,
        quality=job_quality,
    log:
        "results/logs/jobs/{model}/{stack}/{topology}/{cell}/run{run}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/job_file.py"


# The server sessions (which jobs share a server, which job stops it, its log and caches,
# the timeouts) go to results/plan.json when the workflow starts, a file no rule owns: a
# grown grid or a new timeout rewrites it and reruns no finished cell. (As an ancient input
# of a plan rule's output it hit snakemake/snakemake#4166: a run that had to rewrite the
# plan ran only that rule.)
onstart:
    # The executor is known only now (not while the Snakefile is read): a cluster run's
    # platform must come from the config or profile, never from this machine.
    if not workflow.local_exec:
        try:
            ss_grid.check_cluster_platform(CFG)
        except ConfigError as exc:
            raise SystemExit(f"speedsplit: {exc}")
    ss_plan.write_plan(CFG, PLAN, FINISHED)
    if PLATFORM == "cpu" and ss_grid.has_int4_stack(CFG):
        from speedsplit.serving.vllm_cpu import cpu_int4_route

        print(f"speedsplit: {cpu_int4_route()[1]}", file=sys.stderr)


# Besides its outputs and log, a bench job appends to its session's server log
# (results/logs/sessions/{session}.log, shared by the session's jobs, so no job's output) and
# lets its servers fill their own compile caches under results/cache/{session}/; both paths come from
# the plan. Its lock and state files live in a private folder outside the workflow
# (speedsplit/serving/lease.py).
rule bench:
    input:
        unpack(bench_inputs),
    output:
        result="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.json",
        requests="results/bench/{model}/{stack}/{topology}/{cell}/run{run}.requests.jsonl",
    params:
        plan=PLAN,
    resources:
        gpu=bench_gpus,
        runtime=bench_runtime,
    # On a cluster, a session's cells still to run go out as one submission (a group job), so
    # its server still serves all of them there. Locally there is no group (rules/common.smk).
    group:
        bench_group
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


# The load generator's own offsets on this host, against the reference server of known speed
# (about 10 s; every bench job waits for it and records it). It holds the one "card" of a CPU
# run, so no server competes with it for the cores.
rule calibrate:
    output:
        ss_plan.CALIBRATION,
    params:
        users=CFG.benchmark.calibration_users,
    resources:
        gpu=1,
    log:
        "results/logs/calibrate.log",
    conda:
        "../envs/serving.yaml"
    script:
        "../workflow_scripts/calibrate.py"


# Everything measured, nothing aggregated: the target for GPU hosts and cluster runs whose
# tables are built elsewhere (python -m speedsplit.output.aggregate).
rule measurements:
    input:
        bench_results(),
        "results/hardware/bandwidth.json",
        ss_plan.CALIBRATION,
        link_results(),
        profile_results(),


# The interconnect control: no server, an all-reduce between each pair of the job's cards
# (peer-to-peer on and off), payloads from one decode step's activation up to max_mib. It
# and the profiles run after every benchmark job (order only): in the middle of a lane they
# would take the cards of its idle server and make its next cell start a new one.
rule link:
    input:
        models=[f"resources/models/{m}/fp16" for m in ss_grid.bench_models(CFG)],
        after=ancient(bench_results()),
    output:
        "results/hardware/link.json",
    params:
        platform=PLATFORM,
        gpus=CFG.link_control.gpus if PLATFORM == "cuda" else 1,
        users=sorted({c.users for c in ss_grid.cells(CFG)}),
        max_mib=CFG.link_control.max_mib,
    resources:
        gpu=CFG.link_control.gpus if PLATFORM == "cuda" else 1,
    log:
        "results/logs/link.log",
    conda:
        "../envs/serving.yaml"
    script:
        "../workflow_scripts/link.py"


# Where tensor parallelism loses time: a server of its own per topology, profiled over a
# window of steady decode steps of one cell (its params include the timeouts: a profile is
# one job per topology, cheap to rerun).
rule profile:
    input:
        model=lambda wc: f"resources/models/{wc.model}/{ss_plan.variant_dir(CFG, wc.stack)}",
        tokenizer="resources/models/{model}/fp16",
        after=ancient(bench_results()),
    output:
        result="results/profile/{model}/{stack}/{topology}/{cell}.json",
        traces=directory("results/profile/{model}/{stack}/{topology}/{cell}.traces"),
    params:
        stack=bench_stack,
        cell=bench_cell,
        session=profile_session,
        delay_iterations=CFG.coordination.delay_iterations,
        iterations=CFG.coordination.iterations,
    resources:
        gpu=bench_gpus,
    log:
        "results/logs/profile/{model}/{stack}/{topology}/{cell}.log",
    conda:
        "../envs/serving.yaml"
    script:
        "../workflow_scripts/profile.py"
