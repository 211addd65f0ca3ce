"""Task accuracy beside speed (analysis/quality_tasks.py): per chain step and lm-evaluation-harness
task metric, both stacks' scores and the step's difference with its 95% interval.

(tests/probes/test_quality_tasks.py is the probe's: this file's name differs for pytest.)"""

import math

import polars as pl
import pytest

from speedsplit.analysis.quality_tasks import difference, tasks_frame
from speedsplit.core.quality import QualityProbe, QualityRecord, TaskScore

Z = 1.959963985  # the normal distribution's 97.5% quantile


def score(value, stderr=None, samples=100, task="arc", metric="acc,none") -> TaskScore:
    return TaskScore(task=task, metric=metric, value=value, stderr=stderr, samples=samples)


def record(*tasks: TaskScore, error: str | None = None) -> QualityRecord:
    return QualityRecord(status="ok", probe=QualityProbe(), tasks=list(tasks), tasks_error=error)


def steps(*pairs, model="m", topology="tp1") -> pl.DataFrame:
    """One chain's steps, in order: (from_stack, to_stack) pairs."""
    return pl.DataFrame(
        [
            {
                "model": model,
                "topology": topology,
                "chain": "study",
                "position": i,
                "step": f"{a} -> {b}",
                "from_stack": a,
                "to_stack": b,
            }
            for i, (a, b) in enumerate(pairs, start=1)
        ]
    )


def records(model="m", topology="tp1", **by_stack) -> dict:
    return {(model, topology, stack): (rec, "trained") for stack, rec in by_stack.items()}


def test_the_difference_is_the_later_stacks_value_less_the_earlier_ones_with_a_normal_interval():
    """0.03 and 0.04 add in quadrature to 0.05."""
    d, lo, hi = difference(score(0.5, 0.03), score(0.62, 0.04))
    assert d == pytest.approx(0.12)
    assert (lo, hi) == pytest.approx((0.12 - Z * 0.05, 0.12 + Z * 0.05), abs=1e-9)
    d, lo, hi = difference(score(0.62, 0.04), score(0.5, 0.03))
    assert (d, lo, hi) == pytest.approx((-0.12, -0.12 - Z * 0.05, -0.12 + Z * 0.05), abs=1e-9)


def test_the_difference_has_no_interval_without_both_standard_errors_and_no_value_without_both_sides():
    assert difference(score(0.5, 0.03), score(0.6)) == pytest.approx((0.1, None, None))
    assert difference(score(0.5), score(0.6, 0.03)) == pytest.approx((0.1, None, None))
    assert difference(None, score(0.6, 0.03)) == (None, None, None)
    assert difference(score(0.5, 0.03), None) == (None, None, None)


def test_each_step_sets_both_stacks_scores_of_each_metric_side_by_side():
    a = record(score(0.5, 0.03), score(0.25, 0.02, metric="acc_norm,none"))
    b = record(score(0.62, 0.04), score(0.25, 0.02, metric="acc_norm,none"))
    frame = tasks_frame(steps(("a", "b")), records(a=a, b=b))
    assert frame["metric"].to_list() == ["acc,none", "acc_norm,none"]  # sorted by task, then metric
    acc = frame.row(0, named=True)
    assert {k: acc[k] for k in ("model", "topology", "chain", "position", "step", "from_stack", "to_stack")} == {
        "model": "m",
        "topology": "tp1",
        "chain": "study",
        "position": 1,
        "step": "a -> b",
        "from_stack": "a",
        "to_stack": "b",
    }
    assert (acc["task"], acc["samples"], acc["from_value"], acc["from_stderr"]) == ("arc", 100, 0.5, 0.03)
    assert (acc["to_value"], acc["to_stderr"]) == (0.62, 0.04)
    assert (acc["difference"], acc["difference_lo"], acc["difference_hi"]) == pytest.approx(
        (0.12, 0.12 - Z * 0.05, 0.12 + Z * 0.05), abs=1e-9
    )
    assert not acc["note"]
    norm = frame.row(1, named=True)
    half = Z * math.sqrt(2 * 0.02**2)
    assert (norm["difference"], norm["difference_lo"], norm["difference_hi"]) == pytest.approx((0, -half, half))


def test_a_score_of_zero_is_a_score():
    frame = tasks_frame(steps(("a", "b")), records(a=record(score(0.0, 0.0)), b=record(score(0.3, 0.0))))
    row = frame.row(0, named=True)
    assert (row["from_value"], row["from_stderr"], row["to_stderr"]) == (0.0, 0.0, 0.0)
    assert (row["difference"], row["difference_lo"], row["difference_hi"]) == pytest.approx((0.3, 0.3, 0.3))


def test_a_metric_only_one_stack_scored_keeps_its_row_with_no_difference():
    a = record(score(0.5, 0.03, samples=40, task="arc"))
    b = record(score(0.7, 0.05, samples=60, task="hellaswag"))
    rows = tasks_frame(steps(("a", "b")), records(a=a, b=b)).rows(named=True)
    assert [(r["task"], r["samples"], r["from_value"], r["to_value"]) for r in rows] == [
        ("arc", 40, 0.5, None),
        ("hellaswag", 60, None, 0.7),
    ]
    assert all(r["difference"] is None and r["difference_lo"] is None for r in rows)
    assert (rows[0]["to_stderr"], rows[1]["from_stderr"]) == (None, None)


def test_why_a_stack_has_no_scores_is_the_note_of_each_of_its_steps_rows():
    scored = record(score(0.5, 0.03))
    failed = record(error="lm-eval failed (exit 1): no logprobs")
    frame = tasks_frame(steps(("a", "b"), ("b", "c")), records(a=scored, b=failed, c=scored))
    assert frame.select("from_stack", "to_stack", "from_value", "to_value", "note").rows() == [
        ("a", "b", 0.5, None, "b: lm-eval failed (exit 1): no logprobs"),
        ("b", "c", None, 0.5, "b: lm-eval failed (exit 1): no logprobs"),
    ]


def test_a_step_both_of_whose_stacks_failed_is_one_row_naming_both_reasons_in_order():
    frame = tasks_frame(steps(("a", "b")), records(a=record(error="timed out"), b=record(error="no logprobs")))
    assert frame.select("task", "metric", "samples", "difference", "note").rows() == [
        (None, None, None, None, "a: timed out; b: no logprobs")
    ]


def test_a_step_without_task_scores_on_either_side_or_without_a_record_has_no_row():
    """lm-eval not asked for (no tasks, no error), or a stack with no quality record at all."""
    scored = record(score(0.5, 0.03))
    given = records(a=record(), b=record(), c=scored, e=scored)
    assert tasks_frame(steps(("a", "b"), ("c", "d"), ("d", "e")), given).height == 0
    assert tasks_frame(steps(("a", "b"), ("b", "c")), given)["to_stack"].to_list() == ["c"]  # one side is enough


def test_a_steps_records_are_its_own_model_and_topologys():
    both = {**records(a=record(score(0.5)), b=record(score(0.6))), **records(model="n", b=record(score(0.9)))}
    both |= records(topology="tp2", a=record(score(0.1)), b=record(score(0.2)))
    frame = tasks_frame(pl.concat([steps(("a", "b")), steps(("a", "b"), topology="tp2")]), both)
    assert frame.select("topology", "from_value", "to_value").rows() == [("tp1", 0.5, 0.6), ("tp2", 0.1, 0.2)]
    assert frame["difference"].to_list() == pytest.approx([0.1, 0.1])


def test_no_steps_give_an_empty_table_of_every_column():
    frame = tasks_frame(steps(), {})
    assert frame.height == 0
    assert frame.columns == [
        "model",
        "topology",
        "chain",
        "position",
        "step",
        "from_stack",
        "to_stack",
        "task",
        "metric",
        "samples",
        "from_value",
        "from_stderr",
        "to_value",
        "to_stderr",
        "difference",
        "difference_lo",
        "difference_hi",
        "note",
    ]
    assert frame.schema["samples"] == pl.Int64 and frame.schema["difference"] == pl.Float64
