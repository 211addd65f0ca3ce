"""Task accuracy beside speed: lm-evaluation-harness against a served stack (probes/quality_tasks.py)
gives what lm-eval gives on the same model in process, and a stack it cannot score says why."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO

from speedsplit.analysis.quality import Z95
from speedsplit.analysis.quality_tasks import tasks_frame
from speedsplit.core.quality import LmEval, QualityProbe, QualityRecord, TaskScore
from speedsplit.models.checkpoint import synthesize
from speedsplit.probes import quality_tasks

TASK = LmEval(tasks=["python_next_line"], include_path=str(REPO / "config/tasks/python-next-line"), limit=12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm-eval") / "fp16"
    synthesize("tiny", out, weights="trained", training={"steps": 60, "seq_len": 64, "batch": 8, "warmup_steps": 5})
    return out


@pytest.mark.slow
def test_a_served_stack_scores_as_lm_eval_does_in_process(trained, tmp_path):
    """The same task on the same weights: through speedsplit's generate() server (bfloat16, one
    request at a time) and through lm-eval's own transformers model in process (bfloat16):
    the same accuracy to the question."""
    port = _free_port()
    argv = [sys.executable, "-m", "speedsplit.serving.hf_generate", "--model", str(trained), "--served-model-name", "m"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "bfloat16", "--max-batch", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        served, why = quality_tasks.run(url, "m", TASK, trained)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert why is None and [(s.task, s.metric, s.samples) for s in served] == [("python_next_line", "acc,none", 12)]
    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={trained},dtype=bfloat16"]
    cmd += ["--tasks", "python_next_line", "--include_path", TASK.include_path, "--limit", "12"]
    cmd += ["--batch_size", "1", "--device", "cpu", "--output_path", str(out)]
    done = subprocess.run(cmd, cwd=TASK.include_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    own = json.loads(next(out.rglob("results_*.json")).read_text())["results"]["python_next_line"]
    assert served[0].value == own["acc,none"] and served[0].stderr == pytest.approx(own["acc_stderr,none"])


@pytest.mark.slow
def test_a_stack_lm_eval_cannot_score_says_why(trained):
    dead = f"http://127.0.0.1:{_free_port()}"
    scores, why = quality_tasks.run(dead, "m", TASK.model_copy(update={"limit": 2, "timeout_s": 300}), trained)
    assert scores == [] and why.startswith("lm-eval failed (exit ")


def test_each_step_sets_its_two_stacks_task_scores_side_by_side():
    probe = QualityProbe()
    a = QualityRecord(
        status="ok", probe=probe, tasks=[TaskScore(task="t", metric="acc,none", value=0.5, stderr=0.1, samples=20)]
    )
    b = QualityRecord(
        status="ok", probe=probe, tasks=[TaskScore(task="t", metric="acc,none", value=0.4, stderr=0.1, samples=20)]
    )
    c = QualityRecord(status="ok", probe=probe, tasks_error="lm-eval failed (exit 1): no logprobs")
    import polars as pl

    steps = pl.DataFrame(
        [
            {"model": "m", "topology": "tp1", "chain": "x", "position": i, "step": None, "from_stack": f, "to_stack": t}
            for i, (f, t) in enumerate((("a", "b"), ("b", "c")), start=1)
        ]
    )
    records = {("m", "tp1", s): (r, "trained") for s, r in (("a", a), ("b", b), ("c", c))}
    rows = {r["to_stack"]: r for r in tasks_frame(steps, records).iter_rows(named=True)}
    half = Z95 * (0.1**2 * 2) ** 0.5
    assert rows["b"]["difference"] == pytest.approx(-0.1)
    assert (rows["b"]["difference_lo"], rows["b"]["difference_hi"]) == pytest.approx((-0.1 - half, -0.1 + half))
    assert rows["c"]["difference"] is None and rows["c"]["note"] == "c: lm-eval failed (exit 1): no logprobs"
