"""Rule bench: measure one cell run on its session's server and write its result."""

import json
from pathlib import Path

from _job import to_log

from speedsplit import config as ss_config
from speedsplit import plan as ss_plan
from speedsplit.bench import log_progress, measure

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
cfg = ss_config.validate(sm.config)
spec = json.loads(Path(sm.input.spec).read_text())
w = sm.wildcards
job = ss_plan.find_job(cfg, w.model, w.stack, w.topology, w.cell, w.run)
measure(
    session_key=spec["session"],
    stack=spec["stack"],
    cell=spec["cell"],
    run=int(w.run),
    model_dir=sm.input.model,
    tokenizer_dir=sm.input.tokenizer,
    out_json=sm.output.result,
    out_requests=sm.output.requests,
    session_log=Path("results/logs/sessions") / (spec["session"].replace("/", "__") + ".log"),
    cache_dir=Path("results/cache") / w.stack,
    last_in_session=ss_plan.last_in_session(cfg, job),
    idle_timeout_s=cfg["benchmark"]["idle_timeout_s"],
    lease_timeout_s=cfg["benchmark"]["lease_timeout_s"],
    progress=log_progress(f"{w.stack} {w.cell} run{w.run}"),
)
