"""Quality beside speed, typed: what a quality probe asks of a served stack (`QualityProbe`, part
of the job that carries it) and what the stack answered (`QualityRecord`, part of that job's
result). The probe runs on the session's server after the cell's measured phase
(probes/quality.py); analysis/quality.py compares the records of a chain's stacks.

Two kinds of request, on one held-out text (the model's own, the standard library's, or the
user's):
- greedy continuations of windows' first tokens, each of a forced length, with the server's
  token ids and top logprobs where it serves them: do two stacks say the same thing?
- the windows themselves scored through their prompt logprobs (`echo` with `logprobs`): each
  token's log-probability given the ones before it, for perplexity and next-token agreement;
- optionally, tasks of lm-evaluation-harness on local data (`LmEval`), their accuracy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speedsplit.core.facts import StrictRecord

# How a token is named in an OpenAI `logprobs` object when the request asks for ids (vLLM's
# `return_tokens_as_token_ids`, honoured by speedsplit's own servers too): "token_id:17".
ID_PREFIX = "token_id:"


LM_EVAL_INSTALL = "pip install lm-eval==0.4.13"


def lm_eval_installed() -> bool:
    """Whether lm-evaluation-harness can run here (config quality.lm_eval)."""
    import importlib.util

    return importlib.util.find_spec("lm_eval") is not None


class LmEval(BaseModel):
    """lm-evaluation-harness tasks run against the stack's server (config quality.lm_eval)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[str] = Field(description="task names, found under include_path or among lm-eval's own")
    include_path: str = Field("", description="a folder of task YAMLs with local data (lm-eval runs in it)")
    limit: int | None = Field(None, ge=1, description="questions per task at most (None: all)")
    timeout_s: float = Field(1800.0, gt=0, description="the longest lm-eval may take for all its tasks")


class QualityProbe(BaseModel):
    """What a job's quality probe sends (config `quality`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(16, ge=1, description="greedy continuations, each from the start of a held-out window")
    prompt_tokens: int = Field(32, ge=1, description="tokens of a continuation's prompt")
    output_tokens: int = Field(32, ge=1, description="tokens of each continuation (forced, as in the speed cells)")
    windows: int = Field(8, ge=0, description="held-out windows scored through their prompt logprobs")
    window_tokens: int = Field(128, ge=2, description="tokens of each scored window")
    top_logprobs: int = Field(5, ge=1, le=20, description="top logprobs asked for at each position")
    text: str = Field("", description="the held-out text file ('': the model's own, else the standard library's)")
    lm_eval: LmEval | None = Field(None, description="task accuracy through lm-evaluation-harness (None: none)")


class QualityOutput(StrictRecord):
    """One greedy continuation as a stack returned it."""

    prompt: int = Field(description="which window's start it continued")
    text: str = Field("", description="the text streamed")
    ids: list[int] | None = Field(None, description="the server's token ids (None: it serves none)")
    text_ids: list[int] = Field(default_factory=list, description="the text re-tokenized by the model's tokenizer")
    top: list[dict[str, float]] | None = Field(None, description="per output token: top logprobs by token id")
    error: str | None = None


class QualityWindow(StrictRecord):
    """One held-out window as a stack scored it."""

    window: int
    ids: list[int] | None = Field(None, description="the server's token ids of the window")
    logprobs: list[float] | None = Field(
        None, description="each token's log-probability given those before it (from the second token on)"
    )
    top: list[dict[str, float]] | None = Field(None, description="at each of those positions: top logprobs by id")
    error: str | None = None


class TaskScore(StrictRecord):
    """One metric of one lm-evaluation-harness task, as the stack scored."""

    task: str
    metric: str = Field(description="lm-eval's metric and filter, e.g. 'acc,none'")
    value: float
    stderr: float | None = Field(None, description="lm-eval's standard error of the value")
    samples: int | None = Field(None, description="questions it was computed on")


class QualityRecord(StrictRecord):
    """What one stack answered to the quality probe."""

    status: Literal["ok", "error"]
    probe: QualityProbe
    text: str = Field("", description="where the held-out text came from")
    text_sha256: str = ""
    serves: dict[str, str] = Field(
        default_factory=dict,
        description="per input (token_ids, logprobs, prompt_logprobs): 'yes', or why not (the server's answer)",
    )
    outputs: list[QualityOutput] = Field(default_factory=list)
    windows: list[QualityWindow] = Field(default_factory=list)
    tasks: list[TaskScore] = Field(default_factory=list, description="lm-evaluation-harness tasks' scores")
    tasks_error: str | None = Field(None, description="why the tasks have no scores (lm-eval's own words)")
    seconds: float | None = Field(None, description="the probe's time on the server")
    error: str | None = None
