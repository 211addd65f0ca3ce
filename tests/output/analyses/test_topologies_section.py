"""Topologies as an analysis (output/analyses/topologies.py): the three tables it builds from every
run (throughput per GPU and per user, the factors between topologies, how busy the cards were),
its first-screen answer (does sharding pay?), its charts and its report section."""

import math

import polars as pl
import pytest
from records import fake_result

from speedsplit.analysis import frames as F
from speedsplit.analysis.topology import PACKING_SCHEMA, SCALING_SCHEMA
from speedsplit.core.facts import Timing
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import topologies as T
from speedsplit.planning import config as C

SHAPE = {"tp1": (1, 1), "tp2": (2, 1), "2x1": (1, 2)}  # cards per instance, instances
# Output tok/s in runs 0, 1, 2. tp1 and tp2 agree with themselves exactly; 2x1 doubles from run
# to run (geometric mean 200).
SPEED = {"tp1": (100, 100, 100), "tp2": (150, 150, 150), "2x1": (100, 200, 400)}
# A ratio over 2x1's runs (Welch: the other side has no spread) has 2x1's log sd, ln 2, over 3
# runs: t(0.975, 2 df) = 4.3027 standard errors, a factor of W = 2^(4.3027 / sqrt 3) = 5.595 each
# way. 2x1 / tp1 = 2 [2 / W, 2 W] = [0.357, 11.2], which holds 1: a tie, efficiency 2 / 2 ideal;
# tp2 / tp1 = 1.5 exactly, tp2 wins, efficiency 1.5 / 2; 2x1 / tp2 = 1.33 [0.238, 7.46], a tie.
W = 2 ** (4.302652729749752 / math.sqrt(3))
ANSWER = (
    "s at u8-wide-greedy (tiny): 2x1 2× [0.357, 11.2] one card (efficiency 1.00); "
    "tp2 1.5× [1.5, 1.5] one card (efficiency 0.75); a tie (2x1 / tp2 1.33× [0.238, 7.46])"
)


def run(topology, run, tok, stack="s", **kw):
    tp, instances = SHAPE[topology]
    return fake_result(stack, 8, run, tok, topology=topology, tp=tp, instances=instances, **kw)


def every(speed=SPEED, **kw) -> list:
    return [run(t, r, float(tok), **kw) for t, toks in speed.items() for r, tok in enumerate(toks)]


def measured(results, tolerate=()) -> dict[str, pl.DataFrame]:
    """The cells and the analysis's tables, as aggregate builds them from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs, tolerate)
    basis = Basis(runs=runs, cells=cells, by_throughput=pl.DataFrame(), chains={}, tolerate_flags=tolerate)
    return {"cells": cells} | T.build(basis)


def by_comparison(frames) -> dict[str, dict]:
    return {r["comparison"]: r for r in frames["scaling"].iter_rows(named=True)}


def timed(stack, run, devices, job, load=None, status="ok"):
    """Run `run` of a stack that held `devices`, its job from job[0] to job[1] s and its load
    over `load` (a server started for it when run is 0: lease wait 0, start-up 10 s)."""
    res = fake_result(stack, 8, run, 100.0 if status == "ok" else None, status=status)
    res.server.devices = list(devices)
    res.timing = Timing(job_start=job[0], load_start=load and load[0], load_end=load and load[1], job_end=job[1])
    return res


def test_the_analysis_is_always_on():
    assert T.ANALYSIS.enabled(C.load()) and T.ANALYSIS.enabled({})
    assert {"topologies", "scaling", "packing"} <= set(table_names(C.load()))


def test_one_topology_is_a_table_of_its_own_but_no_factor_section_answer_or_chart():
    frames = measured(every({"tp1": (100, 100)}))
    (row,) = frames["topologies"].iter_rows(named=True)
    assert (row["topology"], row["gpus"], row["tok_s_per_gpu"], row["tok_s_per_user"]) == ("tp1", 1, 100.0, 12.5)
    assert frames["scaling"].height == 0 and frames["scaling"].schema == pl.Schema(SCALING_SCHEMA)
    assert frames["packing"].height == 0 and frames["packing"].schema == pl.Schema(PACKING_SCHEMA)  # no timing
    assert T.section(frames, {}) == "" and T.answer(frames) == "" and T.charts(frames) == {}
    assert T.answer({}) == ""


def test_each_topology_per_gpu_and_per_user_with_its_interval():
    """2x1: 200 tok/s over 2 cards, 100 a card; 25 a user of 8. Its interval, 200 [200 / W', 200 W']
    with W' = 2^(4.3027 / sqrt 3) as well (its runs' log sd is ln 2), divides alike."""
    frames = measured(every())
    topologies = frames["topologies"]
    assert topologies.select("topology", "gpus", "tensor_parallel", "instances").rows() == [
        ("tp1", 1, 1, 1),
        ("2x1", 2, 1, 2),  # fewest cards first, then sharded last
        ("tp2", 2, 2, 1),
    ]
    two = topologies.row(1, named=True)
    assert (two["output_tok_s"], two["tok_s_per_gpu"], two["tok_s_per_user"]) == pytest.approx((200, 100, 25))
    assert (two["tok_s_per_gpu_lo"], two["tok_s_per_gpu_hi"]) == pytest.approx((100 / W, 100 * W))
    assert (two["tok_s_per_user_lo"], two["tok_s_per_user_hi"]) == pytest.approx((25 / W, 25 * W))
    tp2 = topologies.row(2, named=True)
    assert (tp2["tok_s_per_gpu"], tp2["tok_s_per_gpu_lo"], tp2["tok_s_per_gpu_hi"]) == (75.0, 75.0, 75.0)


def test_each_multi_card_topology_over_one_card_and_instances_against_sharding():
    frames = measured(every())
    got = by_comparison(frames)
    assert list(got) == ["2x1 / tp1", "2x1 / tp2", "tp2 / tp1"]
    inst, versus, tp = got.values()
    assert (inst["kind"], inst["value"], inst["lo"], inst["hi"]) == pytest.approx(("instances", 2, 2 / W, 2 * W))
    assert (inst["ideal"], inst["efficiency"], inst["efficiency_lo"], inst["efficiency_hi"]) == pytest.approx(
        (2, 1, 1 / W, W)
    )
    assert (inst["winner"], inst["gpus"], inst["runs_used"], inst["excluded"], inst["note"]) == ("tie", 2, 6, [], "")
    assert (tp["kind"], tp["value"], tp["lo"], tp["hi"], tp["efficiency"]) == ("tensor_parallel", 1.5, 1.5, 1.5, 0.75)
    assert tp["winner"] == "tp2"  # an interval of no width that does not hold 1
    assert (versus["kind"], versus["ideal"], versus["efficiency"], versus["winner"]) == (
        "instances_vs_tensor_parallel", None, None, "tie",
    )  # fmt: skip
    assert (versus["value"], versus["lo"], versus["hi"]) == pytest.approx((4 / 3, 4 / 3 / W, 4 / 3 * W))
    html = T.answer(frames)
    assert html == f"<h3>Topologies: does sharding pay?</h3><p class='headline'>{ANSWER}</p>"


def test_the_winner_of_instances_against_sharding_is_said_by_name():
    instances = measured(every({"tp1": (100,) * 3, "tp2": (150,) * 3, "2x1": (200,) * 3}))
    assert "; 2x1 wins (2x1 / tp2 1.33× [1.33, 1.33])</p>" in T.answer(instances)
    sharded = measured(every({"tp1": (100,) * 3, "tp2": (300,) * 3, "2x1": (200,) * 3}))
    assert "tp2 3× [3, 3] one card (efficiency 1.50); tp2 wins (2x1 / tp2 0.667× [0.667, 0.667])" in T.answer(sharded)


def test_one_run_a_topology_is_a_factor_with_no_interval():
    frames = measured(every({"tp1": (100,), "tp2": (150,)}))
    (row,) = frames["scaling"].iter_rows(named=True)
    assert (row["value"], row["lo"], row["hi"], row["runs_used"]) == (1.5, None, None, 2)
    assert "s at u8-wide-greedy (tiny): tp2 1.5× one card (efficiency 0.75)</p>" in T.answer(frames)


def test_a_topology_that_failed_every_run_has_no_factor_and_its_runs_are_said():
    died = [run("tp2", r, None, status="server_died") for r in range(3)]
    frames = measured(every({"tp1": SPEED["tp1"], "2x1": SPEED["2x1"]}) + died)
    got = by_comparison(frames)
    tp = got["tp2 / tp1"]
    assert (tp["value"], tp["lo"], tp["efficiency"], tp["winner"], tp["runs_used"]) == (None, None, None, None, 3)
    assert tp["excluded"] == [f"tp2 run{r}: server_died" for r in range(3)] and tp["note"] == "tp2: no clean run"
    assert got["2x1 / tp1"]["value"] == pytest.approx(2.0)  # the others still compare
    assert T.answer(frames).endswith(
        "2x1 2× [0.357, 11.2] one card (efficiency 1.00); tp2 — one card; undecided (2x1 / tp2 —)</p>"
    )
    assert "<td>tp2: no clean run</td>" in T.section(frames, {})
    charts = T.charts(frames)
    (scaling,) = charts["scaling"].to_dict()["datasets"].values()
    assert {r["comparison"] for r in scaling} == {"2x1 / tp1"}  # a factor without a value is not drawn
    (points,) = charts["topologies"].to_dict()["datasets"].values()
    assert {r["topology"] for r in points} == {"tp1", "2x1"}  # nor a topology without a throughput


def test_a_flagged_run_counts_in_no_factor_unless_its_flag_is_tolerated():
    results = every()
    results[8].flags.append("outlier")  # 2x1's 400 (run 2): 100 and 200 left, geometric mean 141
    got = by_comparison(measured(results))["2x1 / tp1"]
    assert got["value"] == pytest.approx(math.sqrt(2)) and got["runs_used"] == 3 + 2
    assert got["excluded"] == ["2x1 run2: outlier"]
    assert by_comparison(measured(results, tolerate=("outlier",)))["2x1 / tp1"]["value"] == pytest.approx(2.0)


def test_the_section_shows_the_factors_and_the_topologies_without_their_bounds():
    frames = measured(every())
    html = T.section(frames, {})
    assert html.startswith("<h2>Topologies</h2>\n<p class='note'>Throughput per GPU and per user")
    scaling, topologies = html.split("</table></div>")[:2]
    assert "<th>comparison</th>" in scaling and "<th>numerator</th>" not in scaling
    assert "<td>tensor_parallel</td><td>tp2 / tp1</td><td>2</td><td>1.5</td>" in scaling
    assert "<th>tok_s_per_gpu</th>" in topologies and "_lo</th>" not in topologies and "_hi</th>" not in topologies
    assert "<td>2x1</td><td>1</td><td>2</td><td>2</td><td>200</td><td>100</td><td>25</td></tr>" in topologies
    assert "Packing" not in html  # no run was timed


def test_the_charts_draw_each_topology_per_gpu_against_per_user_and_each_factor_against_users():
    frames = measured(every())
    charts = T.charts(frames)
    assert list(charts) == ["topologies", "scaling"]
    points = charts["topologies"].to_dict()
    assert (points["spec"]["encoding"]["x"]["field"], points["spec"]["encoding"]["y"]["field"]) == (
        "tok_s_per_user", "tok_s_per_gpu",
    )  # fmt: skip
    (data,) = points["datasets"].values()
    assert {r["topology"]: r["tok_s_per_gpu"] for r in data} == pytest.approx({"tp1": 100, "2x1": 100, "tp2": 75})
    factors = charts["scaling"].to_dict()
    (data,) = factors["datasets"].values()
    assert sorted((r["comparison"], r["users"]) for r in data) == [("2x1 / tp1", 8), ("2x1 / tp2", 8), ("tp2 / tp1", 8)]
    assert {r["excluded"] for r in data} == {""}  # list columns as text


def test_packing_is_each_cards_share_of_the_wall_time_measuring_and_starting_servers():
    """Over 1000-1160 s (160 s): card 0 measured 60 s (a) + 40 s (c, reusing a's server: no
    start) = 100 s, 0.625, and started one server, 10 s; card 1 measured 60 s, 0.375, started one.
    d failed before it held a card: a row of its own, no card of the pool (jobs counts it)."""
    results = [
        timed("a", 0, ["0"], job=(1000.0, 1100.0), load=(1020.0, 1080.0)),
        timed("b", 0, ["1"], job=(1050.0, 1150.0), load=(1070.0, 1130.0)),
        timed("c", 1, ["0"], job=(1100.0, 1160.0), load=(1110.0, 1150.0)),
        timed("d", 0, [], job=(1000.0, 1005.0), status="server_died"),
    ]
    frames = measured(results)
    packing = {r["device"]: r for r in frames["packing"].iter_rows(named=True)}
    assert list(packing) == ["(none)", "0", "1", "all"]
    expected = {
        "(none)": (160, 0, 0, 10, 1),
        "0": (160, 100, 0.625, 10, 2),
        "1": (160, 60, 0.375, 10, 1),
        "all": (160, 160, 0.5, 20, 4),  # two cards: 160 s of 320
    }
    for device, (wall, measuring, share, starting, jobs) in expected.items():
        r = packing[device]
        assert (r["wall_s"], r["measuring_s"], r["measuring_share"]) == pytest.approx((wall, measuring, share))
        assert (r["starting_s"], r["jobs"]) == pytest.approx((starting, jobs))
    assert packing["all"]["starting_share"] == pytest.approx(20 / 320)
    html = T.section(frames, {})  # one topology: the packing block alone
    assert html.startswith("<h2>Packing: how busy the cards were</h2>") and "<h2>Topologies</h2>" not in html
    assert "<tr><td>all</td><td>160</td><td>160</td><td>0.5</td><td>20</td><td>0.0625</td><td>4</td></tr>" in html
    assert T.answer(frames) == "" and T.charts(frames) == {}
