"""Rule bench: measure one cell run on its session's server and write its result.

Reads only its inputs and params: the job file (a JobSpec: stack, cell and run), the model folders, the
client's calibration on this host, and the plan its params name (its server session; written
when the workflow starts)."""

import json
from pathlib import Path

from _job import to_log

from speedsplit.core.facts import Calibration
from speedsplit.measuring.bench import finished_line, log_progress, measure
from speedsplit.core.specs import session_of

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
job = json.loads(Path(sm.input.job).read_text())
w = sm.wildcards
result = measure(
    job=job,
    run=int(w.run),
    session=lambda: session_of(sm.params.plan, sm.output.result),
    model_dir=sm.input.model,
    tokenizer_dir=sm.input.tokenizer,
    out_json=sm.output.result,
    out_requests=sm.output.requests,
    progress=log_progress(f"{w.stack} {w.cell} run{w.run}"),
    calibration=Calibration.read(sm.input.calibration),
)
log_progress("speedsplit")(finished_line(result))
