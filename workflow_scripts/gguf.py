"""Rule gguf: the FP16 checkpoint converted to one GGUF file by llama.cpp's own converter."""

from _job import to_log

from speedsplit.models.gguf import convert

sm = snakemake  # noqa: F821 (injected by Snakemake)
to_log(sm)
convert(sm.input.fp16, sm.output.model, sm.wildcards.gguf_type)
