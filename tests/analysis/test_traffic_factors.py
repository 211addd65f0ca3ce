"""The decomposition under traffic: factors on goodput and latency at open-loop cells, as
speedups that still multiply to the total, with which way each goes."""

import statistics

import pytest
from records import fake_result, with_wall, write_result

from speedsplit.core.record import Distribution, Slo
from speedsplit.output import aggregate

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
STEPS = {"study": ["runtime", "INT4 weights + kernel"]}


def open_loop(stack, rate, run, ttft, tpot, goodput, tok_s=100.0, flags=()):
    """A run of an open-loop cell r{rate}-mix-greedy with these medians (p99 twice them)."""
    arrival = {"pattern": "poisson", "rate_rps": float(rate), "requests": 10}
    res = fake_result(stack, 0, run, tok_s, workload="mix", flags=flags, arrival=arrival)
    res.cell = res.job.cell.name = f"r{rate:g}-mix-greedy"
    res.summary.offered_rps = float(rate)
    res.summary.ttft_s = Distribution(mean=ttft, median=ttft, p90=ttft, p99=2 * ttft)
    res.summary.tpot_s = Distribution(mean=tpot, median=tpot, p90=tpot, p99=2 * tpot)
    e2e = ttft + 15 * tpot
    res.summary.e2e_s = Distribution(mean=e2e, median=e2e, p90=e2e, p99=2 * e2e)
    with_wall(res, max(20.0, 4 * e2e))  # every request inside the measured phase
    res.slo = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1, met=goodput > 0, violations=[], good_requests=0, goodput_rps=goodput)
    return res


def frames(tmp_path, results):
    paths = [write_result(tmp_path / f"{i}.json", r) for i, r in enumerate(results)]
    return aggregate.build_frames(paths, CHAINS, steps=STEPS, specs={"traffic": True})


def test_latency_factors_are_old_over_new_and_multiply_to_the_total(tmp_path):
    results = []
    for run in range(3):
        results += [
            open_loop("hf-fp16", 4, run, ttft=2.0 + run * 0.1, tpot=0.08, goodput=1.0 + run * 0.1),
            open_loop("vllm-fp16", 4, run, ttft=0.1, tpot=0.01 + run * 0.001, goodput=4.0),
            open_loop("vllm-marlin", 4, run, ttft=0.1, tpot=0.008, goodput=4.0),
        ]
    f = frames(tmp_path, results)["traffic_factors"]
    rows = {(r["metric"], r["step"]): r for r in f.iter_rows(named=True)}
    gm = statistics.geometric_mean
    runtime_ttft = rows[("TTFT p50", "runtime")]
    assert runtime_ttft["value"] == pytest.approx(gm([2.0, 2.1, 2.2]) / 0.1) and runtime_ttft["verdict"] == "faster"
    int4_tpot = rows[("TPOT p50", "INT4 weights + kernel")]
    assert int4_tpot["value"] == pytest.approx(gm([0.010, 0.011, 0.012]) / 0.008)
    assert rows[("TPOT p50", "total")]["value"] == pytest.approx(
        rows[("TPOT p50", "runtime")]["value"] * int4_tpot["value"]
    )
    assert rows[("goodput", "runtime")]["value"] == pytest.approx(4.0 / gm([1.0, 1.1, 1.2]))
    assert runtime_ttft["interval"].startswith("95% t over runs (paired by run")
    # the same goodput on both vLLM stacks: an interval at exactly 1, no direction shown
    assert rows[("goodput", "INT4 weights + kernel")]["verdict"] == "no difference shown (the interval holds 1)"
    # TTFT p99 is its own metric (twice the median here): same factor
    assert rows[("TTFT p99", "runtime")]["value"] == pytest.approx(runtime_ttft["value"])


def test_a_stack_that_served_no_good_request_makes_the_goodput_factor_unbounded_and_says_so(tmp_path):
    results = []
    for run in range(2):
        results += [
            open_loop("hf-fp16", 16, run, ttft=30.0, tpot=0.2, goodput=0.0),
            open_loop("vllm-fp16", 16, run, ttft=0.1, tpot=0.01, goodput=16.0),
            open_loop("vllm-marlin", 16, run, ttft=0.1, tpot=0.01, goodput=16.0),
        ]
    f = frames(tmp_path, results)["traffic_factors"]
    good = {r["step"]: r for r in f.filter(f["metric"] == "goodput").iter_rows(named=True)}
    assert good["runtime"]["value"] is None and good["runtime"]["verdict"] == "undefined"
    assert "hf-fp16: goodput 0: no request met the objectives" in good["runtime"]["note"]
    assert good["INT4 weights + kernel"]["value"] == pytest.approx(1.0)  # its two stacks were measured


def test_a_run_whose_client_fell_behind_counts_in_no_factor(tmp_path):
    results = [
        open_loop("hf-fp16", 4, 0, ttft=2.0, tpot=0.08, goodput=1.0),
        open_loop("vllm-fp16", 4, 0, ttft=0.1, tpot=0.01, goodput=4.0),
        open_loop("vllm-fp16", 4, 1, ttft=9.0, tpot=0.01, goodput=4.0, flags=["client_lag"]),
        open_loop("vllm-marlin", 4, 0, ttft=0.1, tpot=0.01, goodput=4.0),
    ]
    f = frames(tmp_path, results)
    ttft = f["traffic_factors"].filter((f["traffic_factors"]["metric"] == "TTFT p50"))
    assert ttft.filter(ttft["step"] == "runtime")["value"][0] == pytest.approx(20.0)
    assert ttft.filter(ttft["step"] == "runtime")["verdict"][0] == "faster (one run: no interval)"


def test_closed_loop_cells_answer_in_the_headline_open_loop_ones_in_the_traffic_block(tmp_path):
    results = [open_loop(s, 4, 0, ttft=0.1, tpot=0.01, goodput=4.0) for s in CHAINS["study"]]
    results += [fake_result(s, 8, 0, t) for s, t in zip(CHAINS["study"], (10.0, 100.0, 120.0))]
    f = frames(tmp_path, results)
    assert f["answer"]["cell"].to_list() == ["u8-wide-greedy"]
    assert set(f["traffic"]["cell"]) == {"r4-mix-greedy"} and f["traffic"]["rate_rps"].to_list() == [4.0] * 3
    from speedsplit.output.analyses import traffic

    block = traffic.answer(f)
    assert "Under traffic" in block and "r4-mix-greedy" in block and "runtime" in block


def test_the_report_and_the_run_summary_answer_under_traffic_first(tmp_path):
    """The first screen opens with the traffic block (cells by rate, not as text), and the
    run's closing summary gives each chain's factors per open-loop cell."""
    from speedsplit.output import report, summary
    from speedsplit.output.analyses import answers
    from speedsplit.planning import config as C

    results = []
    for rate in (16, 4):  # given out of order
        for run in range(2):
            results += [
                open_loop("hf-fp16", rate, run, ttft=2.0 + run * 0.1, tpot=0.08, goodput=1.0),
                open_loop("vllm-fp16", rate, run, ttft=0.1, tpot=0.01 + run * 0.001, goodput=rate * 0.9),
                open_loop("vllm-marlin", rate, run, ttft=0.1, tpot=0.008, goodput=rate * 0.9),
            ]
    f = frames(tmp_path, results)
    out = tmp_path / "report.html"
    report.build(out, config=C.load().filled(), provenance=None, frames=f, svgs={}, answers=answers(f))
    page = out.read_text()
    first = page[page.index("<section id='answer'>") : page.index("</section>")]
    assert "Under traffic" in first and "No chain has every stack measured" not in first
    assert first.index("<td>r4-mix-greedy") < first.index("<td>r16-mix-greedy")  # the tables by rate
    assert "study at r16-mix-greedy (16 req/s), tiny: goodput: runtime" in first  # the headline: the top rate
    tables = tmp_path / "results" / "tables"
    aggregate.write_tables(
        [write_result(tmp_path / "r" / f"{i}.json", r) for i, r in enumerate(results)],
        tables,
        chains=CHAINS,
        steps=STEPS,
        specs={"traffic": True},
    )
    lines = summary.lines(tmp_path / "results")[0]
    r4 = next(line for line in lines if "study at r4-mix-greedy" in line)
    assert "goodput: runtime 3.6x, INT4 weights + kernel 1x" in r4 and "TTFT p50: runtime 20.5x" in r4


def test_trace_replay_cells_are_drawn_beside_the_rate_cells():
    """A trace's cells have no one rate: their factors get a chart of their own (they were in
    traffic_factors, and in no plot). On committed evidence with both kinds of cell."""
    from conftest import REPO

    from speedsplit.output.aggregate import evidence_frames
    from speedsplit.output.analyses import traffic as T

    frames = evidence_frames(REPO / "docs/evidence/h200-2026-12-01-traffic")[0]
    charts = T.charts(frames)
    assert sorted(charts) == ["traffic", "traffic_trace"]
    (data,) = charts["traffic_trace"].to_dict()["datasets"].values()
    assert {r["cell"] for r in data} == {"x2-conversation-greedy"}
    assert {r["metric"] for r in data} <= {"goodput", "TTFT p50", "TPOT p50", "E2E p50"} and len(data) > 0
    (data,) = charts["traffic"].to_dict()["datasets"].values()
    assert all(r["rate_rps"] is not None for r in data)


def test_an_open_loop_cell_is_known_by_its_load_not_its_name(tmp_path):
    """Each record says its load (job.cell.load.kind): a cell of arrivals at a rate is decomposed
    under traffic (its runs paired) whatever its name says, and a closed loop never is."""
    results = []
    for run in range(2):
        for stack, tpot in (("hf-fp16", 0.08), ("vllm-fp16", 0.01), ("vllm-marlin", 0.008)):
            res = open_loop(stack, 4, run, ttft=0.1, tpot=tpot, goodput=4.0)
            res.cell = res.job.cell.name = "steady-mix-greedy"  # a name no rule of naming reads
            results.append(res)
    f = frames(tmp_path, results)
    assert set(f["runs"]["load"]) == {"open"}
    assert set(f["traffic_factors"]["cell"]) == {"steady-mix-greedy"}
    assert set(f["traffic"]["cell"]) == {"steady-mix-greedy"}
    closed = [fake_result(s, 8, r, 100.0 + r) for s in CHAINS["study"] for r in range(2)]
    for res in closed:
        res.cell = res.job.cell.name = "r8-wide-greedy"  # named as a rate's cell, a closed loop
    (tmp_path / "closed").mkdir()
    g = frames(tmp_path / "closed", closed)
    assert set(g["runs"]["load"]) == {"closed"} and g["traffic_factors"].is_empty()
