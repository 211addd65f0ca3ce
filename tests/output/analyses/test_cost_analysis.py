"""Cost per token as an analysis: when the config turns it on, what its builder makes from the
cells and the chains' factors, and its report section (output/analyses/cost.py)."""

import polars as pl
import pytest

from speedsplit.output.analyses import Basis
from speedsplit.output.analyses import cost as C
from speedsplit.planning import config

CHAINS = {"c": ["a", "b"]}


def experiment(part: dict):
    """The default config with `part` merged over it, validated."""
    return config.validate(config.merge(config.read_yaml(config.DEFAULT_CONFIG), part))


PRICED = experiment({"analysis": {"cost": {"card_hour_usd": {"cuda": 3.6}}}})


def cell(stack: str, tok_s: float, tp: int) -> dict:
    return {
        "model": "m",
        "stack": stack,
        "topology": "tp1",
        "cell": "u8",
        "users": 8,
        "workload": "w",
        "sampling": "greedy",
        "platform": "cuda",
        "tensor_parallel": tp,
        "instances": 1,
        "prompt_tokens": 300,
        "output_tokens": 100,
        "output_tok_s": tok_s,
        "output_tok_s_lo": tok_s * 0.9,
        "output_tok_s_hi": tok_s * 1.25,
    }


def factors(value: float) -> pl.DataFrame:
    """Chain c's one step (a → b) and its total, both by `value` (interval [value - 1, value + 1])."""
    return pl.DataFrame(
        [
            {"model": "m", "topology": "tp1", "cell": "u8", "chain": "c", "position": p, "factor": f, "step": f}
            | {"value": value, "lo": value - 1, "hi": value + 1, "headline": True}
            for p, f in ((1, "b/a"), (0, "total"))
        ]
    )


def basis(spec, attribution: pl.DataFrame | None) -> Basis:
    """a: one card at 1000 tok/s; b: two cards at 4000 tok/s; the chains' factors by 2 before the
    headline is marked."""
    cells = pl.DataFrame([cell("a", 1000.0, 1), cell("b", 4000.0, 2)])
    return Basis(
        runs=pl.DataFrame(), cells=cells, by_throughput=factors(2.0), chains=CHAINS, attribution=attribution, spec=spec
    )


def test_a_price_in_the_config_turns_the_analysis_on_and_is_its_builders_spec():
    assert C.ANALYSIS.enabled(PRICED)
    assert C.ANALYSIS.enabled(experiment({"analysis": {"cost": {"stacks": {"a": 2.0}}}}))
    assert not C.ANALYSIS.enabled(experiment({"analysis": {}}))
    assert C.ANALYSIS.spec(PRICED) == {"card_hour_usd": {"cpu": None, "cuda": 3.6}, "stacks": {}}


def test_without_a_price_the_analysis_builds_no_tables():
    assert C.build(basis(None, factors(4.0))) == {}


def test_each_stack_costs_its_cards_hour_over_its_tokens_and_each_step_its_hours_ratio_over_its_factor():
    """$3.60 a card-hour is $0.001 a second: a's 1000 tok/s on one card cost $1 a million output
    tokens, b's 4000 on two $0.50; 300 tokens in a 100 out make 4 tokens an output token. The step
    doubles the hour and (the headline's attribution) quadruples the throughput: cost factor 0.5."""
    frames = C.build(basis(C.ANALYSIS.spec(PRICED), factors(4.0)))
    per_cell = {r["stack"]: r for r in frames["cost"].iter_rows(named=True)}
    assert (per_cell["a"]["cards"], per_cell["a"]["hour_usd"]) == (1, 3.6)
    assert (per_cell["b"]["cards"], per_cell["b"]["hour_usd"]) == (2, 7.2)
    assert per_cell["a"]["usd_per_m_output"] == pytest.approx(1.0)
    assert per_cell["b"]["usd_per_m_output"] == pytest.approx(0.5)
    assert per_cell["a"]["usd_per_m_tokens"] == pytest.approx(0.25)
    # the faster end of the throughput (x1.25) is the cheaper end of the cost
    assert (per_cell["a"]["usd_per_m_output_lo"], per_cell["a"]["usd_per_m_output_hi"]) == pytest.approx((0.8, 1 / 0.9))
    steps = {r["position"]: r for r in frames["cost_steps"].iter_rows(named=True)}
    assert steps[1]["hour_ratio"] == pytest.approx(2.0) and steps[1]["cost_factor"] == pytest.approx(0.5)
    assert (steps[1]["cost_lo"], steps[1]["cost_hi"]) == pytest.approx((2 / 5, 2 / 3))
    assert steps[0]["cost_factor"] == pytest.approx(0.5)  # the total: a → b, the chain's ends


def test_without_the_headlines_attribution_the_steps_cost_by_the_factors_before_it():
    """The factors before the headline is marked (by 2): twice the hour for twice the tokens."""
    frames = C.build(basis(C.ANALYSIS.spec(PRICED), None))
    assert frames["cost_steps"]["cost_factor"].to_list() == pytest.approx([1.0, 1.0])


def test_the_section_shows_both_tables_and_says_when_no_priced_stack_was_measured():
    frames = C.build(basis(C.ANALYSIS.spec(PRICED), factors(4.0)))
    html = C.section(frames, {})
    assert html.startswith("<h2>Cost per token</h2>")
    assert "<th>usd_per_m_output</th>" in html and "<th>cost_factor</th>" in html
    assert "<td>0.5</td>" in html  # b's dollars a million output tokens, and the step's cost factor
    unmeasured = {"cost": frames["cost"].clear(), "cost_steps": frames["cost_steps"].clear()}
    said = C.section(unmeasured, {})
    assert "<p>No priced stack was measured.</p>" in said and "<th>cost_factor</th>" not in said
    assert C.section({}, {}) == ""
