"""The INT4 checkpoints: how each was made, its time and card memory, its quality (the quantize
rule's reports); its report section."""

from __future__ import annotations

import polars as pl

from speedsplit.core.formats import html_table
from speedsplit.output.analyses import Analysis, Basis, html_section
from speedsplit.planning.grid import has_int4_stack


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis.quantization import quantization_frame

    return {"quantization": quantization_frame(list(b.quantize_paths))}


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    q = frames.get("quantization")
    if q is None:
        return ""
    return html_section(
        "INT4 checkpoints",
        "How each INT4 checkpoint the stacks served was made: by GPTQModel in the quantize rule "
        "(its time, and the card memory torch reserved at its peak where it ran on a card), adopted "
        "from a folder (prequantized), or a GPTQ config over weights the engine initialises (dummy: "
        "no quality to measure). Quality: greedy next-token agreement and perplexity against the FP16 "
        "model on held-out tokens (on random weights these carry no signal).",
        html_table(q) if q.height else "<p>No quantization report among the results.</p>",
    )


ANALYSIS = Analysis(
    "quantization",
    order=16,
    tables=("quantization",),
    enabled=has_int4_stack,
    build=build,
    section=section,
)
