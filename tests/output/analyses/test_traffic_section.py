"""Traffic as an analysis: when the config turns it on, the tables it builds from open-loop runs,
its first-screen answer, its charts and its report section (output/analyses/traffic.py)."""

import math

import polars as pl
import pytest
from records import fake_result, with_wall

from speedsplit.analysis import frames as F
from speedsplit.analysis.traffic import FACTORS_SCHEMA, STACKS_COLUMNS
from speedsplit.core.facts import ServerTelemetry, Telemetry
from speedsplit.core.loads import Sessions, SessionSchedule, TraceReplay
from speedsplit.core.record import Distribution, Slo
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import traffic as T
from speedsplit.planning import config as C

CHAINS = {"study": ["a", "b", "c"]}
STEPS = {"study": ["engine", "kernel"]}
R2 = math.sqrt(2)
# Each stack's speed in runs 0, 1, 2 (goodput s/4, throughput 100 s, TTFT 8/s, TPOT 0.8/s).
SPEED = {"a": (1, 1, 1), "b": (4, 8, 16), "c": (4 * R2, 16, 32 * R2)}
# Paired by run, in log2: engine 2, 3, 4 (mean 3, sd 1), kernel 0.5, 1, 1.5 (mean 1, sd 0.5), total
# 2.5, 4, 5.5 (mean 4, sd 1.5). Half an interval is t(0.975, 2 df) = 4.3027 standard errors (sd / √3),
# K = 2^(4.3027 / √3) = 5.595: engine 8× [8 / K, 8 K] = [1.43, 44.8], kernel 2× [2 / √K, 2 √K] =
# [0.846, 4.73], total 16× [16 / K^1.5, 16 K^1.5] = [1.21, 212].
K = 2 ** (4.302652729749752 / math.sqrt(3))
SAID = "engine 8× [1.43, 44.8] × kernel 2× [0.846, 4.73] = 16× [1.21, 212]"
HIT = (0.1, 0.5, 0.6)  # every stack's prefix-cache hit rate by run: median 0.5
PAIRED = "95% t over runs (paired by run: each run index one arrival schedule) (no client calibration)"


def dist(v: float) -> Distribution:
    return Distribution(mean=v, median=v, p90=v, p99=v)


def open_loop(stack, run, rate=16, status="ok", speed=SPEED, kind="open"):
    """Run `run` of r{rate}-mix-greedy (sessions: s{rate}-..., sessions begun a second; a trace
    at {rate} times its speed: x{rate}-..., no one request rate)."""
    s = speed[stack][run]
    arrival = {"pattern": "poisson", "rate_rps": float(rate), "requests": 10}
    res = fake_result(stack, 0, run, 100.0 * s, status=status, workload="mix", arrival=arrival)
    res.cell = res.job.cell.name = f"{dict(open='r', sessions='s', trace='x')[kind]}{rate:g}-mix-greedy"
    sessions = kind == "sessions"
    if sessions:
        plan = SessionSchedule(rate_rps=float(rate), count=4, turns=3, turn_tokens=8, think_s=0.5)
        res.job.cell.load = Sessions(sessions=plan)
    elif kind == "trace":
        res.job.cell.load = TraceReplay(trace={"path": "trace.jsonl", "requests": 10, "speedup": float(rate)})
    if status != "ok":
        return res
    summary = res.summary
    summary.offered_rps = float(rate)
    summary.ttft_s, summary.tpot_s, summary.e2e_s = dist(8 / s), dist(0.8 / s), dist(20 / s)
    if sessions:
        summary.ttft_first_s, summary.ttft_return_s, summary.session_s = dist(8 / s), dist(4 / s), dist(60 / s)
    with_wall(res, 100.0)
    res.slo = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1, met=True, violations=[], good_requests=0, goodput_rps=s / 4)
    server = dict.fromkeys(["kv_cache_usage_peak", "kv_cache_usage_mean", "running_mean", "waiting_mean"])
    server |= {"waiting_peak": None, "preemptions": None, "prefix_cache_hit_rate": HIT[run]}
    server |= {"samples": 1, "prefix_cache_hits_flagged": False, "series": {}}
    res.telemetry = Telemetry(interval_s=0.5, server=ServerTelemetry(**server))
    return res


def measured(results, chains=CHAINS, spec=True) -> dict[str, pl.DataFrame]:
    """The cells and the analysis's tables, as aggregate builds them from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs)
    basis = Basis(runs=runs, cells=cells, by_throughput=pl.DataFrame(), chains=chains, steps=STEPS, spec=spec)
    return {"cells": cells} | T.build(basis)


def every(rates=(4, 16), **kw) -> list:
    return [open_loop(s, r, rate, **kw) for rate in rates for s in SPEED for r in range(3)]


def test_an_open_loop_workload_turns_the_analysis_on_and_a_closed_loop_config_leaves_it_off():
    closed = C.load()
    mix = {"prompt_tokens": 64, "output_tokens": 16, "arrival": {"rates": [4, 16], "requests": 10}}
    opened = C.validate(
        C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"workloads": {"mix": mix}, "grid": {"workloads": ["wide", "mix"]}})
    )
    assert T.ANALYSIS.enabled(opened) and T.ANALYSIS.spec(opened) is True
    assert not T.ANALYSIS.enabled(closed) and T.ANALYSIS.spec(closed) is False
    assert {"traffic", "traffic_factors"} <= set(table_names(opened))
    assert not {"traffic", "traffic_factors"} & set(table_names(closed))


def test_closed_loop_runs_build_nothing_unless_the_config_asks_then_two_empty_tables_and_no_answer():
    closed = [fake_result(s, 8, r, 100.0) for s in SPEED for r in range(2)]
    assert set(measured(closed, spec=False)) == {"cells"}
    frames = measured(closed)
    assert frames["traffic"].height == 0 and frames["traffic"].columns == STACKS_COLUMNS
    assert frames["traffic_factors"].height == 0 and frames["traffic_factors"].schema == pl.Schema(FACTORS_SCHEMA)
    assert T.answer(frames) == "" and T.charts(frames) == {}
    html = T.section(frames, {})
    assert html.startswith("<h2>Traffic</h2>") and "<th>goodput_rps</th>" in html and "<td>" not in html
    assert T.section({}, {}) == "" and T.answer({}) == "" and T.charts({}) == {}


def test_each_stack_at_each_open_loop_cell_shows_what_it_served_over_its_runs():
    """b at 16 req/s in runs 0, 1, 2 (geometric mean): goodput 1, 2, 4 (2), throughput 400, 800,
    1600 (800), TTFT 2, 1, 0.5 (1), TPOT 0.2, 0.1, 0.05 (0.1); its hit rate the runs' median (0.5).
    A closed loop is left out."""
    frames = measured([*every(), fake_result("a", 8, 0, 100.0)])
    stacks = frames["traffic"]
    assert stacks.select("stack", "cell").rows() == [(s, f"r{r}-mix-greedy") for s in SPEED for r in (4, 16)]
    b = stacks.row(3, named=True)
    assert (b["stack"], b["rate_rps"], b["offered_rps"], b["runs_ok"], b["slo_met"]) == ("b", 16.0, 16.0, 3, True)
    served = [b["goodput_rps"], b["output_tok_s"], b["ttft_s_median"], b["tpot_s_median"]]
    assert served == pytest.approx([2.0, 800.0, 1.0, 0.1])
    assert b["prefix_cache_hit_rate"] == 0.5 and b["failed_requests"] == 0
    assert set(frames["traffic_factors"]["cell"]) == {"r4-mix-greedy", "r16-mix-greedy"}


def test_each_step_is_a_speedup_paired_by_run_with_its_t_interval_and_which_way_it_goes():
    factors = measured(every(rates=(16,)))["traffic_factors"]
    rows = {(r["metric"], r["step"]): r for r in factors.iter_rows(named=True)}
    assert len(rows) == 7 * 3  # goodput, throughput, TTFT and TPOT p50 and p99, E2E p50; 2 steps, total
    for metric in ("goodput", "throughput", "TTFT p50", "TPOT p99", "E2E p50"):
        engine, kernel, total = (rows[(metric, s)] for s in ("engine", "kernel", "total"))
        assert (engine["value"], engine["lo"], engine["hi"]) == pytest.approx((8, 8 / K, 8 * K))
        assert (kernel["value"], kernel["lo"], kernel["hi"]) == pytest.approx((2, 2 / K**0.5, 2 * K**0.5))
        assert (total["value"], total["lo"], total["hi"]) == pytest.approx((16, 16 / K**1.5, 16 * K**1.5))
        assert (engine["verdict"], total["verdict"]) == ("faster", "faster")
        assert kernel["verdict"] == "no difference shown (the interval holds 1)"
        assert (engine["factor"], kernel["factor"], engine["runs_used"], total["runs_used"]) == ("b/a", "c/b", 6, 9)
        assert engine["interval"] == total["interval"] == PAIRED


def test_the_answer_headlines_each_chain_at_its_highest_rate_and_tabulates_every_rate_in_order():
    frames = measured(every())
    html = T.answer(frames)
    line = f"study at r16-mix-greedy (16 req/s), tiny: goodput: {SAID}; TTFT p50: {SAID}; TPOT p50: {SAID}."
    assert T.headlines(frames["traffic_factors"]) == [line]
    assert html.startswith("<h3>Under traffic</h3>") and f"<p class='headline'>{line}</p>" in html
    factors, served = html.split("<p><b>What each stack served</b> (geometric means over runs; hit rates, medians)</p>")
    head = "<th>cell</th><th>step</th><th>factor</th><th>goodput</th><th>throughput</th><th>TTFT p50</th>"
    assert "<p><b>study</b></p>" in factors and head + "<th>TPOT p50</th><th>E2E p50</th></tr>" in factors
    engine = "<td>engine</td><td>b/a</td>" + "<td>8× [1.43, 44.8]</td>" * 5 + "</tr>"
    assert factors.index(f"<td>r4-mix-greedy</td>{engine}") < factors.index(f"<td>r16-mix-greedy</td>{engine}")
    assert "<tr><td>r16-mix-greedy</td><td>b</td><td>16</td><td>2</td><td>800</td><td>1</td><td>0.1</td>" in served


def test_a_stack_that_failed_a_cell_leaves_its_steps_out_and_the_note_says_why():
    """b's server died in every run at 16 req/s: no step there; the headline falls to 4 req/s."""
    died = [open_loop(s, r, status="server_died" if s == "b" else "ok") for s in SPEED for r in range(3)]
    frames = measured(every(rates=(4,)) + died)
    why = "b: no clean run (run0: server_died, run1: server_died, run2: server_died)"
    html = T.answer(frames)
    assert T.headlines(frames["traffic_factors"]) == [
        f"study at r4-mix-greedy (4 req/s), tiny: goodput: {SAID}; TTFT p50: {SAID}; TPOT p50: {SAID}."
    ]
    factors = html.split("What each stack served")[0]
    assert "<td>r16-mix-greedy" not in factors and "<td>r4-mix-greedy" in factors
    assert f"<p class='note'>{why}</p>" in factors and why in T.section(frames, {})
    assert list(T.charts(frames)) == ["traffic"]
    alone = measured(died)
    assert "<p><b>study</b>: no factor could be computed.</p>" in T.answer(alone)
    assert T.headlines(alone["traffic_factors"]) == [] and T.charts(alone) == {}


def test_the_rate_chart_draws_each_steps_factors_on_goodput_and_latency_and_a_one_step_chains_total_not():
    frames = measured(every(), chains=CHAINS | {"pair": ["b", "c"]})
    charts = T.charts(frames)
    assert list(charts) == ["traffic"]
    (data,) = charts["traffic"].to_dict()["datasets"].values()
    assert {r["metric"] for r in data} == {"goodput", "TTFT p50", "TPOT p50", "E2E p50"}
    assert {r["rate_rps"] for r in data} == {4.0, 16.0}
    series = {(r["chain"], r["series"]) for r in data}
    assert series == {("study", "engine: b/a"), ("study", "kernel: c/b"), ("study", "total: total"), ("pair", ": c/b")}
    assert len(data) == 4 * 2 * 4  # four series, two rates, four metrics


def test_a_sessions_cell_answers_on_its_returning_turns_and_sessions_and_is_drawn_apart():
    frames = measured(every(rates=(2,), kind="sessions"))
    metrics = ("goodput", "TTFT p50", "TPOT p50", "returning-turn TTFT p50", "session p50")
    said = "; ".join(f"{m}: {SAID}" for m in metrics)
    assert T.headlines(frames["traffic_factors"]) == [f"study at s2-mix-greedy (2 sessions/s), tiny: {said}."]
    html = T.answer(frames)
    assert "<th>E2E p50</th><th>returning-turn TTFT p50</th><th>session p50</th>" in html
    charts = T.charts(frames)
    assert list(charts) == ["traffic_trace"]
    (data,) = charts["traffic_trace"].to_dict()["datasets"].values()
    assert {r["cell"] for r in data} == {"s2-mix-greedy"}
    assert {r["metric"] for r in data} == {"goodput", "TTFT p50", "TPOT p50", "E2E p50", *metrics[3:]}


def test_a_trace_cell_has_no_rate_so_it_comes_after_the_rates_heads_the_answer_only_alone_and_is_drawn_apart():
    frames = measured(every(rates=(16,)) + every(rates=(4,), kind="trace"))
    assert T.headlines(frames["traffic_factors"])[0].startswith("study at r16-mix-greedy (16 req/s), tiny:")
    engine = "<td>engine</td><td>b/a</td><td>8× [1.43, 44.8]</td>"
    html = T.answer(frames)
    assert html.index(f"<td>r16-mix-greedy</td>{engine}") < html.index(f"<td>x4-mix-greedy</td>{engine}")
    charts = T.charts(frames)
    assert list(charts) == ["traffic", "traffic_trace"]
    (data,) = charts["traffic_trace"].to_dict()["datasets"].values()
    assert {(r["cell"], r["rate_rps"]) for r in data} == {("x4-mix-greedy", None)}
    trace = measured(every(rates=(4,), kind="trace"))["traffic_factors"]
    assert T.headlines(trace)[0].startswith(f"study at x4-mix-greedy, tiny: goodput: {SAID};")


def test_a_step_whose_three_runs_agree_exactly_is_not_said_to_rest_on_one_run():
    """c twice b's speed in every run: kernel 2× with the interval [2, 2] over three pairs, on
    TTFT exactly (lo == hi), on goodput within rounding (said '2× [2, 2]')."""
    twice = SPEED | {"c": tuple(2 * s for s in SPEED["b"])}
    factors = measured(every(rates=(16,), speed=twice))["traffic_factors"]
    kernel = factors.filter((pl.col("metric") == "TTFT p50") & (pl.col("step") == "kernel")).row(0, named=True)
    assert (kernel["value"], kernel["lo"], kernel["hi"], kernel["runs_used"]) == (2.0, 2.0, 2.0, 6)
    assert kernel["verdict"] == "faster"  # the verdict reads the interval: it knows there are three runs
    (line,) = T.headlines(factors)
    assert "goodput: engine 8× [1.43, 44.8] × kernel 2× [2, 2] = 16× [2.86, 89.5]" in line
    assert "TTFT p50: engine 8× [1.43, 44.8] × kernel 2× [2, 2]" in line  # said: 'kernel 2× (one run)'


def test_what_each_stack_served_is_what_the_answer_and_section_call_it():
    """a's goodput 0.25, 0.25, 2 in runs 0, 1, 2: median 0.25, geometric mean (1/8)^(1/3) = 0.5."""
    frames = measured(every(rates=(16,), speed=SPEED | {"a": (1, 1, 8)}))
    goodput = frames["traffic"].filter(pl.col("stack") == "a")["goodput_rps"][0]
    said_median = "(medians over runs)" in T.answer(frames) + T.section(frames, {})
    assert goodput == pytest.approx(0.25) or not said_median
