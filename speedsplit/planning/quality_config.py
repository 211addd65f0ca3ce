"""What the config asks of the models' quality, typed: the INT4 quantization (`quantization`) and
the quality probe beside speed (`quality`, with lm-evaluation-harness's tasks in `lm_eval`).
A validated experiment's are `experiment.quantization` and `experiment.quality`
(planning/experiment.py, whose schema is generated from these types).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speedsplit.planning.typed_config import Entry, nested
from speedsplit.core.numbers import Positive, Share


class QuantizationConfig(Entry):
    """INT4 quantization (GPTQ, AWQ) of every model used by a stack of variant gptq or awq."""

    method: Literal["gptqmodel", "dummy"] = Field(
        "gptqmodel",
        description=(
            "gptqmodel quantizes the FP16 weights with GPTQ. dummy (synthetic models only) writes a GPTQ config "
            "whose INT4 weights vLLM initialises itself: real INT4 kernels, no quantization time, no quality "
            "check."
        ),
    )
    bits: Literal[4] = Field(4, description="Weight bits (Marlin needs 4).")
    group_size: Literal[32, 64, 128, -1] = Field(128, description="GPTQ group size (-1: per channel).")
    desc_act: bool = Field(
        False,
        description=(
            "Activation-order quantization. false keeps groups contiguous, which every vLLM GPTQ kernel (Marlin, "
            "Machete, the CPU kernel) runs without a reordering step."
        ),
    )
    calibration_samples: int = Field(32, ge=1, description="Calibration sequences.")
    calibration_tokens: int = Field(256, ge=8, description="Tokens per calibration sequence.")
    eval_samples: int = Field(8, ge=1, description="Held-out sequences for the quality check.")
    seed: int = Field(0, description="Seed of the calibration and held-out text.")
    calibration_text: str = Field(
        "", description="A local text file to draw calibration and held-out windows from (empty - random tokens)."
    )


class LmEvalConfig(Entry):
    """Task accuracy beside speed, off unless tasks are named: lm-evaluation-harness (the lm-eval
    package, 0.4.13) runs each task against each probed stack's server through its
    local-completions model, on local data only (datasets and hub offline), scoring by prompt
    logprobs; the quality_tasks table sets each step's difference in each metric. A stack that
    serves no prompt logprobs (transformers serve) has none, with lm-eval's reason.
    config/tasks/python-next-line/ is an example task."""

    tasks: list[str] = Field([], description="Task names (empty - none).")
    include_path: str = Field(
        "",
        description=(
            "A folder of task YAMLs of your own (relative - to the working directory, else to the workflow's "
            "folder, as config/tasks/python-next-line); lm-eval runs in it, so their data files are named "
            "relative to it."
        ),
    )
    limit: int | None = Field(None, ge=1, description="Questions per task at most (null - all).")
    timeout_s: Positive = Field(1800, description="The longest lm-eval may take against one stack.")


class QualityConfig(Entry):
    """Quality beside speed: on each stack, after its last cell of run 0 (so that the probe precedes no
    run-0 cell on its server), a probe asks the stack for greedy continuations of held-out text and for that text's own
    scores (prompt logprobs), and the tables set what each chain step costs in quality beside
    what it gains in speed: agreement with the step before, next-token agreement and perplexity
    (speedsplit/probes/quality.py, speedsplit/analysis/quality.py). A stack that serves no
    logprobs (transformers serve) has agreement only. On random or dummy weights the figures say
    nothing (models.*.weights trained gives the tiny model something to say)."""

    enabled: bool = Field(True, description="Probe every benchmarked stack and build the quality table.")
    prompts: int = Field(16, ge=1, description="Greedy continuations per stack.")
    prompt_tokens: int = Field(
        32, ge=1, description="Tokens of each continuation's prompt (the start of a held-out window)."
    )
    output_tokens: int = Field(
        32, ge=1, description="Tokens of each continuation (forced, as the speed cells force theirs)."
    )
    windows: int = Field(
        8, ge=0, description="Held-out windows scored through their prompt logprobs (perplexity; 0 - none)."
    )
    window_tokens: int = Field(128, ge=2, description="Tokens of each window.")
    top_logprobs: int = Field(5, ge=1, le=20, description="Top logprobs asked for at each position.")
    text: str = Field(
        "",
        description=(
            "A local text file to draw the windows from. Empty - the model's own held-out text (a trained "
            "model's), else held-out files of the Python standard library's sources."
        ),
    )
    gate: Share = Field(
        0.99,
        description=(
            "A stack passes when its quality is at least this share of its chain's reference (the chain's first "
            "stack that serves perplexity): reference perplexity / its perplexity, in the spirit of MLPerf's 99% "
            "of the reference's accuracy. Where neither serves perplexity, the share of continuations that agree "
            "with the reference in full."
        ),
    )
    lm_eval: LmEvalConfig = nested(LmEvalConfig, LmEvalConfig.__doc__)
