"""Dollars per million tokens and each step's cost factor, from an hour's price (analysis/cost.py)."""

import polars as pl
import pytest

from speedsplit.analysis import cost as K

SPEC = {"card_hour_usd": {"cuda": 3.6, "cpu": None}, "stacks": {"cheap": 1.8}}


def cell(stack, tok_s, lo, hi, *, tp=1, instances=1, platform="cuda"):
    return {
        "model": "m",
        "stack": stack,
        "topology": f"tp{tp}",
        "cell": "u8-w-greedy",
        "users": 8,
        "workload": "w",
        "sampling": "greedy",
        "platform": platform,
        "tensor_parallel": tp,
        "instances": instances,
        "prompt_tokens": 300,
        "output_tokens": 100,
        "output_tok_s": tok_s,
        "output_tok_s_lo": lo,
        "output_tok_s_hi": hi,
    }


def test_a_million_tokens_cost_an_hour_of_the_cards_over_the_tokens_of_that_hour():
    cells = pl.DataFrame(
        [cell("a", 1000.0, 900.0, 1100.0), cell("b", 4000.0, 3900.0, 4100.0, tp=2), cell("cheap", 500.0, 500.0, 500.0)]
    )
    got = {r["stack"]: r for r in K.cost_frame(cells, SPEC).iter_rows(named=True)}
    # $3.60 an hour is $0.001 a second: 1000 tok/s is $1 a million output tokens
    assert got["a"]["usd_per_m_output"] == pytest.approx(1.0)
    assert (got["a"]["usd_per_m_output_lo"], got["a"]["usd_per_m_output_hi"]) == pytest.approx((1 / 1.1, 1 / 0.9))
    assert got["a"]["usd_per_m_tokens"] == pytest.approx(0.25)  # 300 in + 100 out: 4 tokens an output token
    assert got["b"]["cards"] == 2 and got["b"]["usd_per_m_output"] == pytest.approx(0.5)  # two cards, 4x the tokens
    assert got["cheap"]["hour_usd"] == 1.8 and got["cheap"]["usd_per_m_output"] == pytest.approx(1.0)
    # a platform with no price: no row
    assert K.cost_frame(pl.DataFrame([cell("a", 10.0, 9.0, 11.0, platform="cpu")]), SPEC).height == 0


def test_a_steps_cost_factor_is_its_hours_ratio_over_its_speed_factor():
    cells = pl.DataFrame([cell("a", 1000.0, 900.0, 1100.0), cell("b", 4000.0, 3900.0, 4100.0, tp=2)]).with_columns(
        pl.lit("tp1").alias("topology")
    )
    per_cell = K.cost_frame(cells, SPEC)
    attribution = pl.DataFrame(
        [
            {
                "model": "m",
                "topology": "tp1",
                "cell": "u8-w-greedy",
                "chain": "c",
                "position": p,
                "factor": f,
                "step": s,
                "value": 4.0,
                "lo": 3.5,
                "hi": 4.5,
                "headline": True,
            }
            for p, f, s in ((1, "b/a", "two cards"), (0, "total", "total"))
        ]
    )
    steps = K.step_frame(attribution, per_cell, {"c": ["a", "b"]})
    one = steps.filter(pl.col("position") == 1).row(0, named=True)
    assert one["hour_ratio"] == 2.0 and one["cost_factor"] == pytest.approx(0.5)
    assert (one["cost_lo"], one["cost_hi"]) == pytest.approx((2 / 4.5, 2 / 3.5))
    said = K.by_chain(per_cell, {"c": ["a", "b"], "other": ["a", "nowhere"]})
    assert said == {("c", "m", "tp1", "u8-w-greedy"): "a $1 → b $0.5 a million output tokens"}


def test_the_8b_study_chain_priced_says_what_a_million_tokens_cost_beside_its_answer():
    """The committed H200 evidence (8B, the study chain), an H200 hour at $3.60: the answer gives
    each chain's dollars a million output tokens, and the cost factors are the speed factors'
    reciprocals (one card a stack)."""
    from conftest import REPO

    from speedsplit.output import analyses
    from speedsplit.output.aggregate import build_frames
    from speedsplit.planning import config as C

    folder = REPO / "docs/evidence/h200-2026-11-30-chain"
    smoke = C.merge(C.read_yaml(C.DEFAULT_CONFIG), C.read_yaml(REPO / "config/h200-smoke.yaml"))
    cfg = C.validate(C.merge(smoke, {"analysis": {"cost": {"card_hour_usd": {"cuda": 3.6}, "stacks": {}}}}))
    spec = analyses.analysis_spec(cfg)
    assert spec["specs"]["cost"]["card_hour_usd"]["cuda"] == 3.6
    frames = build_frames(
        sorted(folder.glob("results/bench/**/run*.json")),
        bandwidth_json=folder / "results/hardware/bandwidth.json",
        **spec,
    )
    per_cell = frames["cost"]
    assert per_cell.height and (per_cell["cards"] == 1).all()
    row = per_cell.row(0, named=True)
    assert row["usd_per_m_output"] == pytest.approx(
        3.6
        / 3600
        / frames["cells"].filter((pl.col("stack") == row["stack"]) & (pl.col("cell") == row["cell"]))["output_tok_s"][0]
        * 1e6
    )
    steps = frames["cost_steps"].join(frames["attribution"], on=["chain", "model", "topology", "cell", "position"])
    assert (steps["cost_factor"] * steps["value"]).to_list() == pytest.approx([1.0] * steps.height)
    answer = frames["answer"]
    assert all(c and c.startswith("hf-fp16 $") and c.endswith("a million output tokens") for c in answer["cost"])


def test_two_sides_cost_their_own_hour_over_their_own_tokens():
    """B / A of a million tokens' cost: the hours' ratio over the throughput's, the interval's
    ends swapped; each side's cards are its own."""
    from speedsplit.analysis import compare

    def runs(tok_s, instances, platform="cuda"):
        return pl.DataFrame(
            [
                {**cell("s", v, v, v, instances=instances, platform=platform), "status": "ok", "flags": [], "run": i}
                | dict.fromkeys(["ttft_s_median", "tpot_s_median", "e2e_s_p99"], 0.1)
                for i, v in enumerate(tok_s)
            ]
        )

    a, b = runs([1000.0, 1010.0], instances=1), runs([3000.0, 3030.0], instances=2)
    stacks = compare.stacks_frame(a, b)
    got = K.compare_frame(stacks, a, b, K.priced_at(2.0), K.priced_at(4.0)).row(0, named=True)
    speed = stacks.filter(pl.col("metric") == "output_tok_s").row(0, named=True)
    assert (got["hour_usd_a"], got["hour_usd_b"]) == (2.0, 8.0)  # B: two cards at $4
    assert got["usd_per_m_output_a"] == pytest.approx(2.0 / 3600 / speed["a"] * 1e6)
    assert got["b_over_a"] == pytest.approx(4.0 / 3.0)  # 4x the hour for 3x the tokens
    assert (got["lo"], got["hi"]) == pytest.approx((4.0 / speed["hi"], 4.0 / speed["lo"]))
    # a side whose platform has no price: nothing said
    assert K.compare_frame(stacks, a, b, K.priced_at(2.0), SPEC | {"card_hour_usd": {"cuda": None}}).height == 0
