# Helpers shared by every rule: the validated config, the benchmark plan, input and params
# functions. The logic itself lives in the speedsplit package.
import functools
import os
import re
import sys

sys.path.insert(0, workflow.basedir)

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as ss_config
from speedsplit.planning import grid as ss_grid
from speedsplit.planning import estimate as ss_estimate
from speedsplit.planning import plan as ss_plan
from speedsplit.output import summary as ss_summary
from speedsplit.output import analyses as ss_analyses

try:
    ss_config.check_paths(os.getcwd(), sys.executable)
    CFG = ss_config.validate(config)
except ConfigError as exc:
    raise SystemExit(f"speedsplit: {exc}")
FILLED = CFG.filled()  # the validated dict, in the order given: the model, quantize and report rules' params

FORCED = functools.cache(ss_plan.forced_reruns(CFG, **ss_plan.command_line_forcing()))  # by snakemake -F, -R, -f
FINISHED = functools.cache(ss_plan.finished_as_planned(CFG, FORCED))  # its result there, unchanged, not forced
PREV = ss_plan.predecessors(CFG, FINISHED)
JOBS = list(PREV)
PLATFORM = ss_grid.platform_of(CFG)
PLAN = "results/plan.json"  # written when the workflow starts (rules/bench.smk)


def _alternatives(names):
    return "|".join(re.escape(str(n)) for n in names) or "^$"


wildcard_constraints:
    model=_alternatives(CFG.models),
    stack=_alternatives(CFG.stacks),
    topology=_alternatives(CFG.topologies),
    cell=_alternatives(c.name for c in ss_grid.cells(CFG)),
    run=r"\d+",
    variant=r"fp16|(gptq|awq)-w\d+g(\d+|pc)",


def close_run(failed=False):
    """Print the run's summary; a run whose chains could not all be decomposed fails, its
    reason the terminal's last line (an exception here would end it with a traceback)."""
    reason = ss_summary.close_run("results", CFG.benchmark.fail_on_undecomposed, ss_summary.snakemake_args())
    if reason and not failed:
        print(f"speedsplit: {reason}", file=sys.stderr, flush=True)
        raise SystemExit(1)


def all_targets():
    return ["results/report.html"]


def bench_results():
    return [job.result for job in JOBS]


def quantize_results():
    return ss_plan.quantize_reports(CFG)


def link_results():
    return ["results/hardware/link.json"] if CFG.link_control.enabled else []


def profile_results():
    co = CFG.coordination
    if not co.enabled:
        return []
    cell = ss_grid.coordination_cell(CFG).name
    return [
        f"results/profile/{m}/{co.stack}/{t}/{cell}.json" for m in ss_grid.bench_models(CFG) for t in co.topologies
    ]


def profile_session(wc):
    return ss_plan.profile_session(CFG, wc.model, wc.stack, wc.topology)


def report_table(name):
    """A table's CSV, registered with `snakemake --report` where a reader looks first."""
    path = f"results/tables/{name}.csv"
    if name in ("answer", "attribution", "cells", "runs"):
        return report(path, caption="../docs/report/tables.rst", category="Tables")
    return path


def table_names():
    return ss_analyses.table_names(CFG)


def _job(wc):
    return ss_plan.find_job(CFG, wc.model, wc.stack, wc.topology, wc.cell, wc.run, known=PREV)


def bench_inputs(wc):
    job = _job(wc)
    inputs = {
        "job": f"results/jobs/{wc.model}/{wc.stack}/{wc.topology}/{wc.cell}/run{wc.run}.json",
        "model": f"resources/models/{wc.model}/{ss_plan.variant_dir(CFG, wc.stack)}",
        "tokenizer": f"resources/models/{wc.model}/fp16",
    }
    draft = CFG.stacks[wc.stack].draft_model
    if draft:  # the weights its speculative decoding drafts with
        inputs["draft"] = f"resources/models/{draft}/fp16"
    # Order only: calibrated before the first cell; a new calibration reruns no cell. The
    # bandwidth copy too (seconds): after a first cell it took the card between two cells of one
    # server, which was stopped for it and started again (33 s on an H100).
    inputs["calibration"] = ancient(ss_plan.CALIBRATION)
    inputs["bandwidth"] = ancient("results/hardware/bandwidth.json")
    prev = PREV[job]
    if prev is not None:
        # Order only: run after the lane's previous job (its server may be ours), never
        # rerun because it changed. A forced job's is a plain input: Snakemake 9 never asks
        # whether a job downstream of a rerun one is forced, and reruns it through an ancient
        # input only if that is missing (`-R bench` on a finished grid reran each lane's first
        # cell only); forced, it reruns anyway.
        inputs["after"] = prev.result if FORCED(job) else ancient(prev.result)
    return inputs


def bench_stack(wc):
    return ss_grid.stack_params(CFG, wc.model, wc.stack, wc.topology)


def bench_cell(wc):
    return ss_grid.cell_params(CFG, ss_grid.cell_by_name(CFG, wc.cell))


@functools.cache
def _quality_carriers():
    return ss_plan.quality_carriers(CFG)


@functools.cache
def _job_params(job):
    return ss_plan.job_params(CFG, job, _quality_carriers())


# Rule job_file's params: the job as its job file holds it, from one function (plan.job_params)
def job_stack(wc):
    return _job_params(_job(wc))["stack"]


def job_cell(wc):
    # with the window it profiles, where it profiles one
    return _job_params(_job(wc))["cell"]


def job_quality(wc):
    # the quality probe this job runs after its load (None: none)
    return _job_params(_job(wc))["quality"]


def quantize_gpus(wc):
    # A dummy quantization writes a config beside the FP16 files and needs no card: on a GPU host
    # it runs while the first server starts (holding the card, it waited for the FP16 cells and
    # the card sat idle through it: 2 min on an H100). On a CPU every job takes the one "card".
    if PLATFORM == "cuda" and CFG.quantization.method == "dummy":
        return 0
    return 1


def bench_gpus(wc):
    # On a CPU every server takes the one "card" so servers never overlap.
    return ss_grid.topology_gpus(CFG, wc.topology) if PLATFORM == "cuda" else 1


@functools.cache
def _bench_estimates():
    return {e.job.result: e for e in ss_estimate.job_estimates(CFG)}


def bench_runtime(wc):
    # Minutes a cluster allows the job: its estimate (python -m speedsplit.planning.estimate) x margin.
    return ss_estimate.runtime_minutes(CFG, _bench_estimates()[_job(wc).result])


@functools.cache
def _session_groups():
    return ss_plan.session_groups(CFG, FINISHED)


def bench_group(wc):
    # A session's cells still to run: one submission on a cluster. A local run (or a dry run)
    # runs no group jobs, and naming none spares it Snakemake's check of every group, which
    # walks each grouped job's whole lane: 47 s of a 50 s dry run of config/study.yaml.
    if workflow.local_exec:
        return None
    return _session_groups()[_job(wc)]


def model_entry(wc):
    return FILLED["models"][wc.model]


def quantize_settings(wc):
    # the format (gptq, awq) and a checkpoint of the model already quantized, if the config names one
    fmt = wc.variant.split("-")[0]
    return dict(FILLED["quantization"], fmt=fmt, prequantized=FILLED["models"][wc.model]["prequantized"].get(fmt, ""))
