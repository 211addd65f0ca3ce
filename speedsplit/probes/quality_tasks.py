"""Task accuracy beside speed: lm-evaluation-harness's tasks (config quality.lm_eval) run against a
served stack by the quality probe (probes/quality.py), through its `local-completions` model.

lm-eval runs as a process of its own, in the task folder (`include_path`: a task's local data
files are named relative to it), with the datasets and hub offline: tasks on local data only.
It sends token ids (`tokenized_requests`), so each choice is scored on exactly the tokens lm-eval
counted, one request at a time. The stack's API key, if any, reaches it through its environment
(OPENAI_API_KEY), never its command line. A stack that serves no prompt logprobs (transformers
serve) cannot be scored: lm-eval fails, and its last words are the record's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from speedsplit.core.quality import LM_EVAL_INSTALL, LmEval, TaskScore, lm_eval_installed


def command(url: str, model: str, spec: LmEval, tokenizer_dir, out: Path) -> list[str]:
    args = ",".join(
        [
            f"model={model}",
            f"base_url={url}/v1/completions",
            f"tokenizer={Path(tokenizer_dir).resolve()}",
            "tokenizer_backend=huggingface",
            "tokenized_requests=True",
            "num_concurrent=1",
            "max_retries=1",
        ]
    )
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args]
    cmd += ["--tasks", ",".join(spec.tasks), "--output_path", str(out), "--batch_size", "1"]
    if spec.include_path:
        cmd += ["--include_path", str(Path(spec.include_path).resolve())]
    return cmd + (["--limit", str(spec.limit)] if spec.limit else [])


def scores(results: dict) -> list[TaskScore]:
    """The metrics of lm-eval's results file (each 'metric,filter' with its '_stderr' twin)."""
    out = []
    for task, metrics in sorted(results.get("results", {}).items()):
        n = (results.get("n-samples", {}).get(task) or {}).get("effective")
        for key, value in sorted(metrics.items()):
            # metrics are 'name,filter' (sample_len and alias are not metrics)
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            name, _, flt = key.partition(",")
            stderr = metrics.get(f"{name}_stderr,{flt}")
            out.append(
                TaskScore(
                    task=task,
                    metric=key,
                    value=float(value),
                    stderr=float(stderr) if isinstance(stderr, (int, float)) else None,
                    samples=n,
                )
            )
    return out


def _cause(output: str) -> str:
    """lm-eval's reason, from its output: the last exception line, else its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b", ln)]
    return ((errors or lines or ["no output"])[-1])[:300]


def run(
    url: str, model: str, spec: LmEval, tokenizer_dir, api_key: str | None = None, workdir: str | Path = "."
) -> tuple[list[TaskScore], str | None]:
    """The tasks' scores, or none and why."""
    if not lm_eval_installed():
        return [], f"lm-evaluation-harness is not installed here ({LM_EVAL_INSTALL})"
    folder = Path(workdir) / spec.include_path if spec.include_path else Path(workdir)
    if not folder.is_dir():
        return [], f"quality.lm_eval.include_path {spec.include_path} is not a folder"
    with tempfile.TemporaryDirectory(prefix="speedsplit-lm-eval-") as tmp:
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(Path(tmp) / "cache"))
        env.pop("OPENAI_API_KEY", None)
        if api_key:
            env["OPENAI_API_KEY"] = api_key
        spec = spec.model_copy(update={"include_path": str(folder.resolve()) if spec.include_path else ""})
        try:
            done = subprocess.run(
                command(url, model, spec, tokenizer_dir, Path(tmp) / "out"),
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=spec.timeout_s,
            )
        except subprocess.TimeoutExpired:
            return [], f"lm-eval did not finish in {spec.timeout_s:g} s"
        found = sorted((Path(tmp) / "out").rglob("results_*.json"))
        if done.returncode != 0 or not found:
            return [], f"lm-eval failed (exit {done.returncode}): {_cause(done.stderr or done.stdout or '')}"
        return scores(json.loads(found[-1].read_text())), None
