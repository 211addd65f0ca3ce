"""Rule bench: measure one cell run on its session's server and write its result."""

from pathlib import Path

from _log import to_log

from speedsplit import config as ss_config
from speedsplit import plan as ss_plan
from speedsplit.bench import log_progress, measure

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
cfg = ss_config.validate(sm.config)
w = sm.wildcards
job = ss_plan.find_job(cfg, w.model, w.stack, w.topology, w.cell, w.run)
session_log = Path("results/logs/sessions") / (sm.params.session.replace("/", "__") + ".log")
measure(
    session_key=sm.params.session, stack=sm.params.stack, cell=sm.params.cell, run=int(w.run),
    model_dir=sm.input.model, tokenizer_dir=sm.input.tokenizer,
    out_json=sm.output.result, out_requests=sm.output.requests,
    session_log=session_log, cache_dir=Path("results/cache") / w.stack,
    last_in_session=ss_plan.last_in_session(cfg, job),
    idle_timeout_s=cfg["benchmark"]["idle_timeout_s"], lease_timeout_s=cfg["benchmark"]["lease_timeout_s"],
    progress=log_progress(f"{w.stack} {w.cell} run{w.run}"),
)
