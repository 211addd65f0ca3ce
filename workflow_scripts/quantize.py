"""Rule quantize: GPTQ INT4 through GPTQModel, with the quality check."""

from _job import to_log

from speedsplit.lease import cuda_devices
from speedsplit.quantize import quantize
from speedsplit.results import write_json_atomic

to_log(snakemake)  # noqa: F821 (injected by Snakemake)
s = snakemake.params.settings  # noqa: F821
with cuda_devices(1, snakemake.params.platform):  # noqa: F821
    report = quantize(
        snakemake.input.fp16, snakemake.output.model,  # noqa: F821
        method=s["method"], bits=s["bits"], group_size=s["group_size"], desc_act=s["desc_act"],
        calibration_samples=s["calibration_samples"], calibration_tokens=s["calibration_tokens"],
        eval_samples=s["eval_samples"], seed=s["seed"], calibration_text=s.get("calibration_text", ""),
    )
write_json_atomic(snakemake.output.report, report)  # noqa: F821
