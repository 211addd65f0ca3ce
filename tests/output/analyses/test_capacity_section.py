"""Capacity as an analysis: when the config turns it on, the table it builds from a ladder's runs,
its first-screen answer (sustainable users or rate, the cliff, the ratio to the reference), its
chart and its report section (output/analyses/capacity.py)."""

import polars as pl
from records import fake_result

from speedsplit.analysis import frames as F
from speedsplit.analysis.capacity import SCHEMA
from speedsplit.core.facts import MemoryCap
from speedsplit.core.record import Slo
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import capacity as K
from speedsplit.planning import config as C

SPEC = {"workload": "wide", "sampling": "greedy", "users": [16, 32, 64, 96], "reference": "a"}
TTFT = "p99 TTFT 3 s > 2 s"


def level(stack, users, run=0, met=True, status="ok", why=(), tok_s=100.0, failed=0, topology="tp1"):
    """One run of a ladder level, judged against the objectives when it ran (status ok); `failed`
    of its 4 requests failed."""
    res = fake_result(stack, users, run, tok_s if status == "ok" else None, status=status, topology=topology)
    if status == "ok":
        res.slo = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1, met=met, violations=list(why), good_requests=4, goodput_rps=2.0)
        s = res.summary
        s.failed, s.completed, s.failures = failed, 4 - failed, {"timeout": failed} if failed else {}
        s.request_s = s.completed / s.wall_s
    return res


def rate_level(stack, rate, met=True, why=()):
    """Run 0 of r{rate}-mix-greedy, an open-loop level (no users: arrivals at `rate` a second),
    at 100 tok/s a request a second."""
    arrival = {"pattern": "poisson", "rate_rps": float(rate), "requests": 4}
    res = fake_result(stack, 0, 0, 100.0 * rate, workload="mix", arrival=arrival)
    res.cell = res.job.cell.name = f"r{rate:g}-mix-greedy"
    res.slo = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1, met=met, violations=list(why), good_requests=4, goodput_rps=rate)
    return res


def ladder() -> list:
    """a: 16 and 32 pass (100 and 180 tok/s), 64 misses TTFT (200 tok/s), 96 skipped past the
    cliff; b: every level passes (100 tok/s); c: its server died at 16, 32 skipped."""
    return [
        level("a", 16, tok_s=100.0),
        level("a", 32, tok_s=180.0),
        level("a", 64, met=False, why=(TTFT,), tok_s=200.0),
        level("a", 96, status="skipped"),
        *(level("b", u) for u in (16, 32, 64, 96)),
        level("c", 16, status="server_died"),
        level("c", 32, status="skipped"),
    ]


def measured(results, spec=SPEC) -> dict[str, pl.DataFrame]:
    """The cells and the analysis's tables, as aggregate builds them from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs)
    return {"cells": cells} | K.build(Basis(runs=runs, cells=cells, by_throughput=pl.DataFrame(), chains={}, spec=spec))


def drawn(frames) -> tuple[dict, list[dict]]:
    """The capacity chart as Vega-Lite, and the rows it draws (its one dataset)."""
    chart = K.charts(frames)["capacity"].to_dict()
    (data,) = chart.pop("datasets").values()
    return chart, data


def test_the_config_turns_it_on_and_its_spec_names_the_workload_and_the_reference():
    off = C.load()
    assert not K.ANALYSIS.enabled(off) and K.ANALYSIS.spec(off) is None and "capacity" not in table_names(off)
    on = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"capacity": {"enabled": True, "users": [16, 32]}}))
    assert K.ANALYSIS.enabled(on) and "capacity" in table_names(on)
    spec = K.ANALYSIS.spec(on)
    # the grid's first cell's workload; the stack before the first chain's INT4 one (hf-fp16, vllm-fp16, vllm-marlin)
    assert (spec["workload"], spec["sampling"], spec["users"]) == ("wide", "greedy", [16, 32])
    assert spec["reference"] == "vllm-fp16"


def test_without_a_spec_nothing_is_built_and_a_missing_table_says_nothing():
    frames = measured(ladder(), spec=None)
    assert set(frames) == {"cells"}
    assert K.section(frames, {}) == "" and K.answer(frames) == "" and K.charts(frames) == {}
    assert K.section({}, {}) == "" and K.answer({}) == "" and K.charts({}) == {}


def test_a_ladder_no_stack_measured_is_an_empty_table_that_the_section_says_is_empty():
    """No runs at all, or runs off the ladder (u8; u16 of another workload)."""
    off_ladder = [level("a", 8), fake_result("a", 16, 0, 100.0, workload="narrow")]
    for results in ([], off_ladder):
        frames = measured(results)
        assert frames["capacity"].height == 0 and frames["capacity"].schema == pl.Schema(SCHEMA)
        assert K.answer(frames) == "" and K.charts(frames) == {}
        html = K.section(frames, {})
        assert html.startswith("<h2>Capacity</h2>") and html.endswith("<p>No stack measured the ladder.</p>")


def test_each_stack_has_its_sustainable_users_its_cliff_and_why_and_its_ratio_to_the_reference():
    cap = {r["stack"]: r for r in measured(ladder())["capacity"].iter_rows(named=True)}
    a, b, c = cap["a"], cap["b"], cap["c"]
    assert a["levels"] == ["16: pass", "32: pass", f"64: {TTFT}", "96: skipped"]
    assert (a["sustainable_users"], a["first_failing_users"], a["first_failing_why"]) == (32, 64, TTFT)
    assert (a["passing_users"], a["failing_users"], a["skipped_users"]) == ([16, 32], [64], [96])
    assert (b["sustainable_users"], b["first_failing_users"], b["first_failing_why"]) == (96, None, None)
    assert (c["sustainable_users"], c["first_failing_users"], c["first_failing_why"]) == (None, 16, "server_died")
    assert c["levels"] == ["16: server_died", "32: skipped"] and c["skipped_users"] == [32]
    # against a's 32 users: a 1, b 96 / 32 = 3, c none (it sustained no level)
    assert [cap[s]["vs_reference"] for s in "abc"] == [1.0, 3.0, None]
    assert [cap[s]["reference"] for s in "abc"] == ["a", "a", "a"]
    assert a["sustainable_rps"] is None and a["passing_rps"] == []  # a ladder of users has no rates


def test_the_answer_says_each_stacks_capacity_what_broke_it_and_the_others_against_the_reference():
    html = K.answer(measured(ladder()))
    line = (
        "Sustainable users within the objectives (wide, greedy; tiny, tp1): a 32, broke at 64: p99 TTFT 3 s &gt; 2 s; "
        "b 96, no level failed; c none, broke at 16: server_died. b / a 3×."  # c, no capacity: no ratio
    )
    assert html == f"<h3>Capacity</h3><p class='headline'>{line}</p>"


def test_a_level_fails_when_any_of_its_runs_fails_and_the_cliff_counts_its_failed_requests():
    """a at 32: run 0 clean, run 1 with one of its 4 requests failed; at 16 both runs pass."""
    results = [
        level("a", 16),
        level("a", 16, run=1),
        level("a", 32),
        level("a", 32, run=1, met=False, why=["1 failed"], failed=1),
    ]
    frames = measured(results, SPEC | {"users": [16, 32]})
    (a,) = frames["capacity"].iter_rows(named=True)
    assert (a["sustainable_users"], a["first_failing_users"], a["first_failing_why"]) == (16, 32, "1 failed")
    assert a["failed_requests_at_cliff"] == 1 and a["vs_reference"] == 1.0
    assert K.answer(frames).endswith("a 16, broke at 32: 1 failed.</p>")  # the reference alone: no ratio
    _, data = drawn(frames)
    failed = {(r["level"], r["verdict"]): r["value"] for r in data if r["metric"] == "failed"}
    assert failed == {(16.0, "pass"): 0.0, (32.0, "fail"): 1.0}


def test_each_topology_is_a_line_of_its_own_against_the_reference_in_it():
    """tp1: a sustains 32, b 64 (2×); tp2: a 16, b 64 (4×): the reference's capacity in each."""
    spec = SPEC | {"users": [16, 32, 64]}
    verdicts = {("a", "tp1"): (1, 1, 0), ("b", "tp1"): (1, 1, 1), ("a", "tp2"): (1, 0, 0), ("b", "tp2"): (1, 1, 1)}
    results = [
        level(stack, users, met=bool(ok), why=() if ok else (TTFT,), topology=topology)
        for (stack, topology), passes in verdicts.items()
        for users, ok in zip((16, 32, 64), passes)
    ]
    frames = measured(results, spec)
    ratios = frames["capacity"].select("stack", "topology", "sustainable_users", "vs_reference").rows()
    assert ratios == [("a", "tp1", 32, 1.0), ("a", "tp2", 16, 1.0), ("b", "tp1", 64, 2.0), ("b", "tp2", 64, 4.0)]
    html = K.answer(frames)
    tp1 = "(wide, greedy; tiny, tp1): a 32, broke at 64: p99 TTFT 3 s &gt; 2 s; b 64, no level failed. b / a 2×."
    tp2 = "(wide, greedy; tiny, tp2): a 16, broke at 32: p99 TTFT 3 s &gt; 2 s; b 64, no level failed. b / a 4×."
    assert html.index(tp1) < html.index(tp2) and html.count("<p class='headline'>") == 2


def test_the_chart_draws_each_measured_level_pass_or_fail_with_the_cliff_and_leaves_skipped_levels_out():
    chart, data = drawn(measured(ladder()))
    output = {
        (r["series"], r["level"]): (r["verdict"], r["value"], r["cliff"])
        for r in data
        if r["metric"] == "output tokens/s"
    }
    assert output == {
        ("a (tp1)", 16.0): ("pass", 100.0, 64.0),
        ("a (tp1)", 32.0): ("pass", 180.0, 64.0),
        ("a (tp1)", 64.0): ("fail", 200.0, 64.0),  # a's 96 was skipped: not drawn
        **{("b (tp1)", float(u)): ("pass", 100.0, None) for u in (16, 32, 64, 96)},  # no cliff
    }  # c measured nothing at 16 (its server died): no throughput
    c = [(r["metric"], r["level"], r["verdict"], r["value"], r["cliff"]) for r in data if r["series"] == "c (tp1)"]
    assert c == [("failed", 16.0, "fail", 0.0, 16.0)]
    assert {r["value"] for r in data if r["metric"] == "goodput (requests/s)"} == {2.0}
    assert chart["spec"]["layer"][0]["encoding"]["x"]["title"] == "concurrent users"
    subtitle = chart["title"]["subtitle"]
    assert subtitle == [
        "hardware: CPU: Test CPU",
        "levels past the cliff that were skipped are listed in tables/capacity, not drawn",
    ]


def test_the_chart_names_the_memory_cap_the_servers_ran_under_and_not_one_that_was_not_applied():
    def capped(res, gib, applied):
        reason = None if applied else "not on a CUDA card"
        cap = MemoryCap(
            card_memory_gib=gib, applied=applied, card_total_gib=80.0, fraction=0.5, how=None, reason=reason
        )
        res.server.memory_cap = cap
        return res

    results = [
        capped(level("a", 16), 40.0, True),
        capped(level("b", 16), 24.0, True),
        capped(level("c", 16), 8.0, False),
    ]
    frames = measured(results, SPEC | {"users": [16]})
    assert frames["capacity"]["card_memory_gib"].to_list() == [40.0, 24.0, None]
    chart, _ = drawn(frames)
    assert chart["title"]["subtitle"][1] == "memory cap: 24, 40 GiB per card"


def test_a_ladder_of_rates_is_judged_answered_and_drawn_in_requests_a_second():
    """a passes 1 and 2 req/s and misses TTFT at 4; b passes all three: 4 / 2 = 2×."""
    results = [rate_level("a", 1), rate_level("a", 2), rate_level("a", 4, met=False, why=(TTFT,))]
    results += [rate_level("b", r) for r in (1, 2, 4)]
    frames = measured(results, {"workload": "mix", "sampling": "greedy", "rates": [1, 2, 4], "reference": "a"})
    a = frames["capacity"].row(0, named=True)
    assert (a["sustainable_rps"], a["first_failing_rps"], a["first_failing_why"]) == (2.0, 4.0, TTFT)
    assert (a["passing_rps"], a["failing_rps"], a["skipped_rps"]) == ([1.0, 2.0], [4.0], [])
    assert (a["sustainable_users"], a["passing_users"], a["levels"][0]) == (None, [], "1 rps: pass")
    line = (
        "Sustainable req/s within the objectives (mix, greedy; tiny, tp1): a 2, broke at 4: p99 TTFT 3 s &gt; 2 s; "
        "b 4, no level failed. b / a 2×."
    )
    assert K.answer(frames) == f"<h3>Capacity</h3><p class='headline'>{line}</p>"
    chart, data = drawn(frames)
    assert chart["spec"]["layer"][0]["encoding"]["x"]["title"] == "request rate (requests/s)"
    output = {(r["series"], r["level"], r["verdict"], r["value"]) for r in data if r["metric"] == "output tokens/s"}
    assert output == {
        ("a (tp1)", 1.0, "pass", 100.0),
        ("a (tp1)", 2.0, "pass", 200.0),
        ("a (tp1)", 4.0, "fail", 400.0),
    } | {("b (tp1)", float(r), "pass", 100.0 * r) for r in (1, 2, 4)}
    assert {r["cliff"] for r in data if r["series"] == "a (tp1)"} == {4.0}


def test_the_section_tabulates_every_stacks_row_with_its_levels():
    html = K.section(measured(ladder()), {})
    assert html.startswith("<h2>Capacity</h2>\n<p class='note'>The capacity sweep (config <i>capacity</i>)")
    assert "<th>sustainable_users</th><th>first_failing_users</th>" in html and html.count("<tr><td>tiny</td>") == 3
    a = "<tr><td>tiny</td><td>a</td><td>tp1</td><td>wide</td><td>greedy</td>"
    a += "<td>16: pass, 32: pass, 64: p99 TTFT 3 s &gt; 2 s, 96: skipped</td><td>32</td><td>64</td>"
    assert a in html
