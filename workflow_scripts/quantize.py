"""Rule quantize: GPTQ INT4 through GPTQModel (or a pre-quantized checkpoint checked and linked), with the quality check."""

from _job import to_log

from speedsplit.core.results import write_json_atomic
from speedsplit.models.quantize import quantize
from speedsplit.serving.lease import cuda_devices

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
s = sm.params.settings
with cuda_devices(1, sm.params.platform):  # GPTQ runs on a leased card, if any
    report = quantize(
        sm.input.fp16,
        sm.output.model,
        method=s["method"],
        bits=s["bits"],
        group_size=s["group_size"],
        desc_act=s["desc_act"],
        calibration_samples=s["calibration_samples"],
        calibration_tokens=s["calibration_tokens"],
        eval_samples=s["eval_samples"],
        seed=s["seed"],
        calibration_text=s.get("calibration_text", ""),
        prequantized=s.get("prequantized", ""),
        fmt=s.get("fmt", "gptq"),
    )
write_json_atomic(sm.output.report, report)
