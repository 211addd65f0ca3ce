"""The quality probe's typed messages (speedsplit/core/quality.py): what a job asks (QualityProbe,
LmEval: the config's defaults and limits, as a job file carries them) and what a stack answered
(QualityRecord and its parts: unknown keys refused at their place, read back equal from a result
file), the token ids' name servers use, and whether lm-evaluation-harness can run here."""

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import REPO
from speedsplit.core.quality import (
    ID_PREFIX,
    LM_EVAL_INSTALL,
    LmEval,
    QualityOutput,
    QualityProbe,
    QualityRecord,
    QualityWindow,
    TaskScore,
    lm_eval_installed,
)
from speedsplit.planning import config as cfgmod
from speedsplit.planning import plan
from speedsplit.serving.logprobs import logprobs_object

TASK = {"tasks": ["python_next_line"], "include_path": "config/tasks/python-next-line", "limit": 4}


def _record() -> QualityRecord:
    """A stack's answers as probes/quality.py leaves them: a continuation with ids and top
    logprobs, one that failed, a window scored (a token the model finds impossible: -inf), one
    not served, and a task's score."""
    probe = QualityProbe(prompts=2, windows=2, window_tokens=4, prompt_tokens=2, lm_eval=LmEval(**TASK))
    return QualityRecord(
        status="ok",
        probe=probe,
        text="the model's held-out text (held_out.txt)",
        text_sha256="0123456789abcdef",
        serves={"token_ids": "yes", "logprobs": "yes", "prompt_logprobs": "no: HTTP 400: echo"},
        outputs=[
            QualityOutput(prompt=0, text=" t0 t1", ids=[0, 1], text_ids=[0, 1], top=[{"0": -0.25}, {"1": -0.5}]),
            QualityOutput(prompt=1, error="RuntimeError: the stream ended in an error"),
        ],
        windows=[
            QualityWindow(window=0, ids=[5, 6, 7, 8], logprobs=[-1.5, float("-inf"), -0.125], top=[{"6": -0.5}] * 3),
            QualityWindow(window=1, error="not served"),
        ],
        tasks=[TaskScore(task="python_next_line", metric="acc,none", value=0.75, stderr=0.125, samples=4)],
        seconds=1.5,
    )


def test_a_probe_left_unset_asks_what_the_default_config_asks():
    config = cfgmod.load(cfgmod.DEFAULT_CONFIG)
    carriers = plan.quality_carriers(config)
    assert carriers
    for job in carriers:
        asked = json.loads(json.dumps(plan.quality_probe(config, job, carriers)))  # as its job file holds it
        assert QualityProbe.model_validate(asked) == QualityProbe()
    assert QualityProbe().model_dump() == {
        "prompts": 16, "prompt_tokens": 32, "output_tokens": 32, "windows": 8, "window_tokens": 128,
        "top_logprobs": 5, "text": "", "lm_eval": None,
    }  # fmt: skip


def test_a_job_files_lm_eval_tasks_are_read_as_the_config_gave_them(tmp_path, monkeypatch):
    if not lm_eval_installed():
        pytest.skip(f"a config with lm-eval tasks needs lm-eval here ({LM_EVAL_INSTALL})")
    monkeypatch.chdir(tmp_path)  # the task folder found beside the workflow, not in the working directory
    (tmp_path / "tasks.yaml").write_text(json.dumps({"quality": {"lm_eval": TASK}}))
    config = cfgmod.load(tmp_path / "tasks.yaml")
    carriers = plan.quality_carriers(config)
    asked = json.loads(json.dumps(plan.quality_probe(config, next(iter(carriers)), carriers)))
    lm = QualityProbe.model_validate(asked).lm_eval
    assert lm == LmEval(tasks=TASK["tasks"], include_path=str(REPO / TASK["include_path"]), limit=4)
    assert lm.timeout_s == 1800.0  # the default: half an hour for all its tasks


@pytest.mark.parametrize(
    "field, lowest, refused",
    [("prompts", 1, 0), ("prompt_tokens", 1, 0), ("output_tokens", 1, 0), ("windows", 0, -1),
     ("window_tokens", 2, 1), ("top_logprobs", 1, 0), ("top_logprobs", 20, 21)],
)  # fmt: skip
def test_each_limit_of_the_probe_holds_at_its_edge(field, lowest, refused):
    assert getattr(QualityProbe(**{field: lowest}), field) == lowest
    with pytest.raises(ValidationError) as err:
        QualityProbe(**{field: refused})
    assert [e["loc"] for e in err.value.errors()] == [(field,)]


def test_lm_eval_needs_its_tasks_and_limits_them_to_a_question_and_its_time_above_zero():
    with pytest.raises(ValidationError, match="tasks\n  Field required"):
        LmEval()
    assert LmEval(tasks=["t"], limit=1).limit == 1
    for bad, loc in (({"limit": 0}, "limit"), ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": -1.0}, "timeout_s")):
        with pytest.raises(ValidationError) as err:
            LmEval(tasks=["t"], **bad)
        assert [e["loc"] for e in err.value.errors()] == [(loc,)]


def test_what_a_job_asks_is_frozen_and_refuses_keys_it_does_not_know():
    probe = QualityProbe(lm_eval=LmEval(tasks=["t"]))
    with pytest.raises(ValidationError, match="Instance is frozen"):
        probe.prompts = 4
    with pytest.raises(ValidationError, match="Instance is frozen"):
        probe.lm_eval.limit = 4
    with pytest.raises(ValidationError) as err:
        QualityProbe(prompt=4, lm_eval={"tasks": ["t"], "task": "u"})
    assert [(e["loc"], e["type"]) for e in err.value.errors()] == [
        (("lm_eval", "task"), "extra_forbidden"),
        (("prompt",), "extra_forbidden"),
    ]


def test_a_record_reads_back_equal_from_a_result_file_as_the_bench_job_writes_it():
    """model_dump(mode="json") and json.dumps (record.to_json, results.write_json_atomic): a
    log-probability of -inf survives as -Infinity."""
    record = _record()
    text = json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True)
    assert "-Infinity" in text
    back = QualityRecord.model_validate(json.loads(text))
    assert back == record and back.windows[0].logprobs[1] == float("-inf")


def test_a_stack_that_answered_nothing_leaves_empty_answers_each_its_own():
    a = QualityRecord(status="error", probe=QualityProbe(), error="ConnectionRefusedError: refused")
    b = QualityRecord(status="error", probe=QualityProbe(), error="the same")
    assert (a.outputs, a.windows, a.tasks, a.serves, a.text, a.seconds) == ([], [], [], {}, "", None)
    a.outputs.append(QualityOutput(prompt=0))  # as the probe appends its answers
    a.serves["token_ids"] = "yes"
    assert (b.outputs, b.serves) == ([], {})
    assert QualityOutput(prompt=0).model_dump() == {
        "prompt": 0, "text": "", "ids": None, "text_ids": [], "top": None, "error": None,
    }  # fmt: skip
    assert QualityWindow(window=0).model_dump() == {
        "window": 0,
        "ids": None,
        "logprobs": None,
        "top": None,
        "error": None,
    }


def test_a_record_refuses_another_status_and_unknown_keys_at_their_place():
    with pytest.raises(ValidationError, match="Input should be 'ok' or 'error'"):
        QualityRecord(status="partial", probe=QualityProbe())
    data = _record().model_dump(mode="json")
    data["outputs"][1]["finish"] = "length"
    data["windows"][0]["nll"] = [1.5]
    data["probe"]["lm_eval"]["shots"] = 5
    data["tasks"][0]["task_version"] = 1
    with pytest.raises(ValidationError) as err:
        QualityRecord.model_validate(data)
    assert sorted((e["loc"], e["type"]) for e in err.value.errors()) == [
        (("outputs", 1, "finish"), "extra_forbidden"),
        (("probe", "lm_eval", "shots"), "extra_forbidden"),
        (("tasks", 0, "task_version"), "extra_forbidden"),
        (("windows", 0, "nll"), "extra_forbidden"),
    ]


def test_a_task_score_is_a_number_with_its_error_and_count_where_lm_eval_gives_them():
    assert TaskScore(task="t", metric="acc,none", value=1).value == 1.0
    assert TaskScore(task="t", metric="acc,none", value=0.5).model_dump() == {
        "task": "t", "metric": "acc,none", "value": 0.5, "stderr": None, "samples": None,
    }  # fmt: skip
    with pytest.raises(ValidationError, match="value\n  Input should be a valid number"):
        TaskScore(task="t", metric="acc,none", value="N/A")


def test_token_ids_are_named_as_our_servers_name_them():
    """The reference and HF servers name a token by its id with ID_PREFIX where asked
    (serving/logprobs.py): the name the probe reads an id back from."""
    answer = logprobs_object([17, 3], [None, -0.5], [None, {3: -0.5, 9: -1.0}], lambda ids: "?", as_ids=True)
    assert answer["tokens"] == ["token_id:17", "token_id:3"]
    assert answer["top_logprobs"][1] == {"token_id:3": -0.5, "token_id:9": -1.0}
    assert [int(t.removeprefix(ID_PREFIX)) for t in answer["tokens"]] == [17, 3]


def test_lm_eval_is_installed_here_at_the_version_the_hint_and_the_requirements_pin(monkeypatch):
    pinned = next(ln for ln in (REPO / "requirements/cpu.txt").read_text().splitlines() if ln.startswith("lm-eval=="))
    assert LM_EVAL_INSTALL == f"pip install {pinned}"
    try:
        installed = metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        pytest.skip("lm-eval is not installed in this environment (requirements/cpu.txt installs it)")
    assert pinned == f"lm-eval=={installed}"
    monkeypatch.delitem(sys.modules, "lm_eval", raising=False)  # another test may have imported it
    assert lm_eval_installed() is True
    assert "lm_eval" not in sys.modules  # asked without importing it (it imports torch and datasets)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "lm_eval").is_dir()])
    assert lm_eval_installed() is False
