"""Quality beside speed in words and points: each chain step's phrase, a chain's line, the
speed-against-quality chart's points and the report section (output/analyses/quality.py)."""

import polars as pl
import pytest

from speedsplit.analysis.quality import STACK_SCHEMA, STEP_SCHEMA
from speedsplit.output.analyses import Basis
from speedsplit.output.analyses import quality as Q
from speedsplit.planning import config as C


def experiment(part: dict):
    """The default config with `part` merged over it, validated."""
    return C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), part))


def step(**given) -> dict:
    """A quality table row: step a → b of chain c, nothing measured unless given."""
    row = dict.fromkeys(STEP_SCHEMA)
    row |= {"model": "m", "topology": "tp1", "chain": "c", "position": 1, "step": None}
    row |= {"from_stack": "a", "to_stack": "b", "same_weights": False, "prompts": 0, "agree": 0}
    return row | given


def stack(name: str, perplexity: float | None) -> dict:
    return dict.fromkeys(STACK_SCHEMA) | {"model": "m", "topology": "tp1", "stack": name, "perplexity": perplexity}


def test_a_step_that_passes_its_gate_says_its_speed_agreement_perplexity_and_gate():
    line = Q.step_line(
        step(
            step="INT4 weights",
            speed_factor=1.36,
            speed_factor_lo=1.3,
            speed_factor_hi=1.42,
            compared_by="token ids",
            prompts=16,
            agree=9,
            perplexity_ratio=1.021,
            perplexity_ratio_lo=1.018,
            perplexity_ratio_hi=1.024,
            passes=True,
            gate=0.99,
            gate_basis="perplexity",
            reference="hf-fp16",
        )
    )
    assert line == (
        "INT4 weights: 1.36× throughput [1.3, 1.42]; agreement 9/16 (token ids), "
        "perplexity +2.1% [+1.8%, +2.4%]; passes the 99% gate (perplexity against hf-fp16)"
    )


def test_a_step_that_fails_its_gate_says_so_in_capitals_and_is_named_by_its_stacks():
    """No step name: the step is its two stacks; a perplexity without an interval stands alone."""
    line = Q.step_line(
        step(
            compared_by="texts re-tokenized",
            prompts=16,
            agree=3,
            perplexity_ratio=0.995,
            passes=False,
            gate=0.9,
            gate_basis="agreement",
            reference="a",
        )
    )
    assert (
        line == "a → b: agreement 3/16 (texts re-tokenized), perplexity -0.5%; FAILS the 90% gate (agreement against a)"
    )


def test_a_lossless_step_is_judged_by_the_greedy_answers_of_the_stack_before_it():
    line = Q.step_line(
        step(from_stack="vllm-fp16", to_stack="vllm-spec", compared_by="token ids", prompts=16, agree=16)
        | {"passes": True, "gate": 0.99, "gate_basis": "lossless", "reference": "hf-fp16"}
    )
    assert line == (
        "vllm-fp16 → vllm-spec: agreement 16/16 (token ids); "
        "passes the 99% gate (lossless: its greedy answers are vllm-fp16's)"
    )


def test_the_gates_reference_says_it_is_the_reference_and_a_step_with_nothing_measured_says_that():
    assert Q.step_line(step(step="first", gate_basis="the reference")) == "first: the quality gate's reference"
    assert Q.step_line(step(step="first")) == "first: no quality measured"


def test_the_same_weights_that_answer_otherwise_say_how_many_continuations_differ_and_where():
    diverged = step(
        same_weights=True, prompts=16, agree=12, first_divergence=7.3125, output_tokens=24, compared_by="token ids"
    )
    assert Q.step_line(diverged) == (
        "a → b: the same weights, yet 4/16 continuations differ "
        "(the first difference at token 7.3 of 24 on average, 24 where none; token ids)"
    )
    # the same weights answering the same: plain agreement
    assert Q.step_line(diverged | {"agree": 16}) == "a → b: agreement 16/16 (token ids)"


def test_a_speed_interval_that_holds_1_shows_no_difference_and_one_run_shows_no_interval():
    held = step(speed_factor=1.05, speed_factor_lo=0.97, speed_factor_hi=1.12)
    assert Q.step_line(held) == "a → b: 1.05× throughput [0.97, 1.12] (no difference shown)"
    one = held | {"speed_factor_lo": None, "speed_factor_hi": None}
    assert Q.step_line(one) == "a → b: 1.05× throughput [no interval: one run]"


def test_a_ratio_is_said_as_a_signed_percentage_change_and_none_as_a_dash():
    assert [Q._pct(v) for v in (1.0213, 0.97, 1.0, None)] == ["+2.1%", "-3.0%", "+0.0%", "—"]


def quality_frame() -> pl.DataFrame:
    """Two chains: c's steps stored out of order, its second carrying a note; d without a note."""
    rows = [
        step(
            position=2, step="kernel", from_stack="b", to_stack="x", gate_basis="the reference", note="random weights"
        ),
        step(position=1, step="engine", speed_factor=2.0, speed_factor_lo=1.9, speed_factor_hi=2.1),
        step(chain="d", step="only", prompts=4, agree=4, compared_by="token ids"),
    ]
    return pl.DataFrame(rows, schema=STEP_SCHEMA)


def test_a_chains_line_joins_its_steps_in_order_and_ends_with_the_first_note():
    said = Q.by_chain({"quality": quality_frame()})
    assert said == {
        ("m", "tp1", "c"): "engine: 2× throughput [1.9, 2.1] | kernel: the quality gate's reference (random weights)",
        ("m", "tp1", "d"): "only: agreement 4/4 (token ids)",
    }
    assert "d (m, tp1): only: agreement 4/4 (token ids)" in Q.answer_lines({"quality": quality_frame()})
    assert Q.by_chain({}) == {} and Q.by_chain({"quality": quality_frame().clear()}) == {}


def test_a_steps_task_metrics_follow_its_phrase_and_a_metric_without_a_difference_is_left_out():
    tasks = pl.DataFrame(
        [
            {"chain": "d", "position": 1, "task": "python_next_line", "metric": "acc,none", "from_value": 0.3}
            | {"to_value": 0.35, "difference": 0.05, "difference_lo": -0.24, "difference_hi": 0.34},
            {"chain": "d", "position": 1, "task": "unscored", "metric": "acc,none", "from_value": 0.3}
            | {"to_value": None, "difference": None, "difference_lo": None, "difference_hi": None},
            {"chain": "c", "position": 1, "task": "other_chain", "metric": "acc,none", "from_value": 0.1}
            | {"to_value": 0.2, "difference": 0.1, "difference_lo": None, "difference_hi": None},
        ]
    ).with_columns(model=pl.lit("m"), topology=pl.lit("tp1"))
    said = Q.by_chain({"quality": quality_frame(), "quality_tasks": tasks})
    assert said[("m", "tp1", "d")] == (
        "only: agreement 4/4 (token ids); python_next_line acc 0.3 → 0.35 (+0.05 [-0.24, +0.34])"
    )
    assert said[("m", "tp1", "c")].startswith("engine: 2× throughput [1.9, 2.1]; other_chain acc 0.1 → 0.2 (+0.1) | ")


def test_the_answer_block_gives_each_chain_its_line_under_a_heading():
    html = Q.answer({"quality": quality_frame()})
    assert html.startswith("<h3>Quality beside speed</h3>")
    assert "<p class='headline'>d (m, tp1): only: agreement 4/4 (token ids)</p>" in html
    assert Q.answer({}) == ""


def test_the_chart_puts_each_stack_at_its_speed_and_perplexity_relative_to_the_chains_first():
    """Throughput multiplies the steps' factors along the chain (a: 1, b: 2, y: 2 × 1.5 × 1.25);
    perplexity is over the chain's first stack that serves one (a's 10, else b's 10.5); a stack
    that serves none (x) has no point but keeps the product."""
    steps = pl.DataFrame(
        [
            step(position=1, step="engine", from_stack="a", to_stack="b", speed_factor=2.0),
            step(position=2, step="kernel", from_stack="b", to_stack="x", speed_factor=1.5),
            step(position=3, step="spec", from_stack="x", to_stack="y", speed_factor=1.25),
        ],
        schema=STEP_SCHEMA,
    )
    stacks = pl.DataFrame([stack("a", 10.0), stack("b", 10.5), stack("x", None), stack("y", 12.0)], schema=STACK_SCHEMA)
    points = Q.chart_rows(steps, stacks)
    assert points["chain"].to_list() == ["c (m, tp1)"] * 3
    assert points["stack"].to_list() == ["a", "b", "y"] and points["step"].to_list() == ["", "engine", "spec"]
    assert points["order"].to_list() == [0, 1, 3]
    assert points["throughput"].to_list() == pytest.approx([1.0, 2.0, 3.75])
    assert points["perplexity"].to_list() == pytest.approx([1.0, 1.05, 1.2])
    unscored_first = [stack("a", None), stack("b", 10.5), stack("x", None), stack("y", 12.0)]
    points = Q.chart_rows(steps, pl.DataFrame(unscored_first, schema=STACK_SCHEMA))
    assert points["stack"].to_list() == ["b", "y"]
    assert points["perplexity"].to_list() == pytest.approx([1.0, 12.0 / 10.5])


def test_a_chain_whose_first_step_or_a_link_is_missing_has_no_throughput_from_the_break_on():
    """Step 1 left out: no stack has a throughput relative to the first; a step whose stack
    before is not the last one's: the product stops there."""
    stacks = pl.DataFrame([stack(s, 10.0) for s in ("a", "b", "x", "y")], schema=STACK_SCHEMA)
    late = pl.DataFrame([step(position=2, from_stack="b", to_stack="x", speed_factor=1.5)], schema=STEP_SCHEMA)
    assert Q.chart_rows(late, stacks).height == 0
    broken = pl.DataFrame(
        [
            step(position=1, from_stack="a", to_stack="b", speed_factor=2.0),
            step(position=3, from_stack="x", to_stack="y", speed_factor=1.5),
        ],
        schema=STEP_SCHEMA,
    )
    assert Q.chart_rows(broken, stacks)["stack"].to_list() == ["a", "b"]


def test_the_chart_names_the_stacks_that_serve_no_perplexity_under_its_title():
    steps = pl.DataFrame([step(speed_factor=2.0)], schema=STEP_SCHEMA)
    stacks = pl.DataFrame([stack("a", 10.0), stack("b", 11.0), stack("z", None)], schema=STACK_SCHEMA)
    chart = Q.charts({"quality": steps, "quality_stacks": stacks})["quality"].to_dict()
    assert chart["title"]["subtitle"][-1] == "no perplexity served (no point): z"
    assert Q.charts({"quality": steps.clear(), "quality_stacks": stacks}) == {}


def test_the_section_shows_the_stacks_without_their_text_and_says_when_no_step_was_probed():
    stacks = pl.DataFrame([stack("a", 10.0) | {"text": "held-out words"}], schema=STACK_SCHEMA)
    html = Q.section({"quality": pl.DataFrame(schema=STEP_SCHEMA), "quality_stacks": stacks}, {})
    assert html.startswith("<h2>Quality beside speed</h2>")
    assert "<p>No chain step with both stacks probed.</p>" in html
    assert "<th>perplexity</th>" in html and "<th>text</th>" not in html and "held-out words" not in html
    assert "Task accuracy" not in html
    assert Q.section({"quality": quality_frame()}, {}) == ""


def test_without_its_spec_the_analysis_builds_no_tables():
    empty = pl.DataFrame()
    assert Q.build(Basis(runs=empty, cells=empty, by_throughput=empty, chains={})) == {}


def test_the_config_turns_the_analysis_on_and_gives_its_builder_the_gate():
    assert Q.ANALYSIS.spec(experiment({"quality": {"gate": 0.95}})) == {"gate": 0.95}
    assert Q.ANALYSIS.enabled(experiment({"quality": {}}))
    assert not Q.ANALYSIS.enabled(experiment({"quality": {"enabled": False}}))
