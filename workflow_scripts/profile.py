"""Rule profile: split a tensor-parallel server's decode step into compute, communication,
copies and gaps, from a profiler trace of steady decode."""

from _job import to_log

from speedsplit.measuring.coordination import profile_cell
from speedsplit.core.specs import SessionPlan

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
profile_cell(
    stack=sm.params.stack,
    cell=sm.params.cell,
    model_dir=sm.input.model,
    tokenizer_dir=sm.input.tokenizer,
    session=SessionPlan(**sm.params.session),
    out_json=sm.output.result,
    trace_dir=sm.output.traces,
    delay_iterations=sm.params.delay_iterations,
    iterations=sm.params.iterations,
)
