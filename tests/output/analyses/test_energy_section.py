"""Energy as an analysis: the chains' factors in output tokens per joule it builds from runs whose
cards' energy counter was read, its chart of joules per token, and its report section, which says
why there are no readings where there are none (output/analyses/energy.py)."""

import math

import polars as pl
import pytest
from records import fake_result

from speedsplit.analysis import chains as ch
from speedsplit.analysis import frames as F
from speedsplit.core.facts import GpuTelemetry, Telemetry
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import energy as E
from speedsplit.output.chart_parts import ERRORBARS
from speedsplit.planning import config as C

CHAINS = {"study": ["a", "b", "c"]}
STEPS = {"study": ["engine", "kernel"]}
CELL = "u8-wide-greedy"
NO_METRICS = "the server has no Prometheus /metrics endpoint (HTTP 404)"
# Joules per output token in runs 0, 1, 2 (tokens per joule: a 2, 2, 2; b 2, 4, 8; c 4, 8, 16).
JOULES = {"a": (0.5, 0.5, 0.5), "b": (0.5, 0.25, 0.125), "c": (0.25, 0.125, 0.0625)}
POWER = {"a": 300.0, "b": 250.0, "c": 200.0}
# Unpaired (a closed loop), each stack's runs apart, in log2: a 1, 1, 1 (sd 0), b 1, 2, 3 (sd 1),
# c 2, 3, 4 (sd 1). b/a and c/a: only b's or c's spread, Welch df 2, half an interval t(0.975, 2) =
# 4.3027 standard errors (1 / √3): K2 = 2^(4.3027 / √3) = 5.595. c/b: both spreads, standard error
# √(2/3), df 4, t(0.975, 4) = 2.7764: K4 = 2^(2.7764 √(2/3)) = 4.813.
K2 = 2 ** (4.302652729749752 / math.sqrt(3))
K4 = 2 ** (2.7764451051977987 * math.sqrt(2 / 3))


def gpu_run(stack, run, joules=None, status="ok") -> object:
    """Run `run` of u8-wide-greedy with its cards' energy counter read over the measured phase
    (`joules` a token, from JOULES by default); the server's counters were not."""
    res = fake_result(stack, 8, run, 100.0, status=status)
    if status != "ok":
        return res
    j = JOULES[stack][run] if joules is None else joules
    gpu = GpuTelemetry(
        devices=["0"],
        samples=4,
        energy_j=j * res.summary.output_tokens,
        energy_per_output_token_j=j,
        power_mean_w=POWER[stack],
        power_peak_w=POWER[stack] + 50.0,
        sm_util_mean_pct=80.0,
        memory_peak_gib=10.0,
        series={},
    )
    res.telemetry = Telemetry(interval_s=0.5, gpu=gpu, server_absent=NO_METRICS)
    return res


def unread_run(stack, run, gpu_absent) -> object:
    """A run whose cards' energy counter could not be read, and why."""
    res = fake_result(stack, 8, run, 100.0)
    res.telemetry = Telemetry(interval_s=0.5, server_absent=NO_METRICS, gpu_absent=gpu_absent)
    return res


def measured(results, chains=CHAINS) -> dict[str, pl.DataFrame]:
    """The cells and the analysis's table, as aggregate builds them from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs)
    by_throughput = ch.attribution_frame(runs, chains)
    basis = Basis(runs=runs, cells=cells, by_throughput=by_throughput, chains=chains, steps=STEPS)
    return {"cells": cells} | E.build(basis)


def every(stacks="abc", runs=3) -> list:
    return [gpu_run(s, r) for s in stacks for r in range(runs)]


def factors(frames) -> dict[str, dict]:
    return {r["step"]: r for r in frames["energy"].iter_rows(named=True)}


def test_it_is_always_on_and_needs_nothing_from_the_config():
    config = C.load()
    assert E.ANALYSIS.enabled(config) and E.ANALYSIS.spec(config) is None
    assert "energy" in table_names(config) and E.ANALYSIS.tables == ("energy",)


def test_each_step_of_a_chain_is_a_factor_in_tokens_per_joule_with_its_interval():
    """b/a 2× [2 / K2, 2 K2], c/b 2× [2 / K4, 2 K4], a to c 4× [4 / K2, 4 K2]."""
    energy = factors(measured(every()))
    engine, kernel, total = energy["engine"], energy["kernel"], energy["total"]
    assert (engine["factor"], kernel["factor"], total["factor"]) == ("b/a", "c/b", "total")
    assert (engine["value"], engine["lo"], engine["hi"]) == pytest.approx((2, 2 / K2, 2 * K2))
    assert (kernel["value"], kernel["lo"], kernel["hi"]) == pytest.approx((2, 2 / K4, 2 * K4))
    assert (total["value"], total["lo"], total["hi"]) == pytest.approx((4, 4 / K2, 4 * K2))
    assert (engine["runs_used"], kernel["runs_used"], total["runs_used"]) == (6, 6, 9)
    assert {r["runs_excluded"] for r in energy.values()} == {0} and engine["note"] == ""
    assert (engine["chain"], engine["cell"], engine["position"], total["position"]) == ("study", CELL, 1, 0)


def test_the_section_shows_joules_per_token_per_cell_and_the_factors():
    """Each stack's joules per token over runs (geometric mean): a 0.5 [0.5, 0.5], b 0.25
    [0.25 / K2, 0.25 K2] = [0.04468, 1.399], c 0.125 [0.02234, 0.6994]; its power, the median."""
    frames = measured(every())
    html = E.section(frames, {})
    assert html.startswith("<h2>Energy</h2><p class='note'>From NVML's total-energy counter")
    per_cell = "<th>energy_per_token_j</th><th>energy_per_token_j_lo</th><th>energy_per_token_j_hi</th>"
    assert per_cell + "<th>power_mean_w</th><th>sm_util_mean_pct</th></tr>" in html
    row = f"<tr><td>tiny</td><td>{{}}</td><td>tp1</td><td>{CELL}</td>{{}}</tr>"
    assert row.format("a", "<td>0.5</td><td>0.5</td><td>0.5</td><td>300</td><td>80</td>") in html
    assert row.format("b", "<td>0.25</td><td>0.04468</td><td>1.399</td><td>250</td><td>80</td>") in html
    assert row.format("c", "<td>0.125</td><td>0.02234</td><td>0.6994</td><td>200</td><td>80</td>") in html
    head = "<th>chain</th><th>model</th><th>topology</th><th>cell</th><th>step</th><th>factor</th><th>value</th>"
    assert head + "<th>lo</th><th>hi</th><th>note</th></tr>" in html
    step = f"<tr><td>study</td><td>tiny</td><td>tp1</td><td>{CELL}</td>{{}}<td></td></tr>"
    assert step.format("<td>engine</td><td>b/a</td><td>2</td><td>0.3575</td><td>11.19</td>") in html
    assert step.format("<td>kernel</td><td>c/b</td><td>2</td><td>0.4155</td><td>9.626</td>") in html
    assert step.format("<td>total</td><td>total</td><td>4</td><td>0.7149</td><td>22.38</td>") in html


def test_the_chart_draws_each_cells_joules_per_token_with_its_interval():
    chart = E.charts(measured(every()))["energy"].to_dict()
    (data,) = chart["datasets"].values()
    bars = {
        r["stack"]: (r["cell"], r["energy_per_token_j"], r["energy_per_token_j_lo"], r["energy_per_token_j_hi"])
        for r in data
    }
    assert bars == {
        "a": (CELL, 0.5, 0.5, 0.5),
        "b": (CELL, pytest.approx(0.25), pytest.approx(0.25 / K2), pytest.approx(0.25 * K2)),
        "c": (CELL, pytest.approx(0.125), pytest.approx(0.125 / K2), pytest.approx(0.125 * K2)),
    }
    assert chart["title"]["subtitle"] == ["model: tiny | hardware: CPU: Test CPU", ERRORBARS]


def test_one_run_a_stack_makes_factors_without_an_interval():
    frames = measured(every(runs=1))
    engine = factors(frames)["engine"]
    assert (engine["value"], engine["lo"], engine["hi"], engine["runs_used"]) == (1.0, None, None, 2)
    total = factors(frames)["total"]
    assert total["value"] == pytest.approx(2.0) and total["lo"] is None  # a 2, c 4 tokens per joule in run 0
    html = E.section(frames, {})
    assert f"<td>{CELL}</td><td>total</td><td>total</td><td>2</td><td>—</td><td>—</td>" in html


def test_a_failed_run_is_left_out_of_the_factors_and_said():
    """b's run 2 failed: b/a from b's 2 and 4 tokens per joule, their geometric mean 2√2 over a's
    2 = √2; b's spread alone (log2 1, 2: sd 1/√2, standard error 1/2, df 1, t(0.975, 1) = 12.706):
    √2 [√2 / K1, √2 K1] with K1 = 2^(12.706 / 2)."""
    k1 = 2 ** (12.706204736174696 / 2)
    results = [gpu_run("a", r) for r in range(3)] + [gpu_run("b", r) for r in range(2)]
    results.append(gpu_run("b", 2, status="server_died"))
    frames = measured(results, {"pair": ["a", "b"]})
    (b_over_a,) = frames["energy"].filter(pl.col("position") == 1).iter_rows(named=True)
    r2 = math.sqrt(2)
    assert (b_over_a["value"], b_over_a["lo"], b_over_a["hi"]) == pytest.approx((r2, r2 / k1, r2 * k1))
    assert (b_over_a["runs_used"], b_over_a["runs_excluded"], b_over_a["excluded"]) == (5, 1, ["b run2: server_died"])
    b = frames["cells"].filter(pl.col("stack") == "b").row(0, named=True)
    assert (b["energy_per_token_j"], b["runs_ok"]) == (pytest.approx(1 / (2 * r2)), 2)


def test_a_stack_whose_cards_were_not_read_leaves_its_factors_undefined_with_the_reason():
    """a ran where NVML could not be read: no b/a, no total; c/b still is one."""
    results = [unread_run("a", r, "NVML unavailable (NVMLError: driver not loaded)") for r in range(3)]
    frames = measured(results + every("bc"))
    energy = factors(frames)
    assert energy["engine"]["value"] is None and energy["total"]["value"] is None
    assert energy["kernel"]["value"] == pytest.approx(2.0)
    assert "a: no tokens_per_joule in its clean runs" in energy["engine"]["note"]
    html = E.section(frames, {})
    assert "No energy readings" not in html
    assert f"<tr><td>tiny</td><td>a</td><td>tp1</td><td>{CELL}</td><td>—</td><td>—</td><td>—</td>" in html
    assert "<td>engine</td><td>b/a</td><td>—</td><td>—</td><td>—</td>" in html
    (data,) = E.charts(frames)["energy"].to_dict()["datasets"].values()
    assert {r["stack"] for r in data} == {"b", "c"}  # a's cells have no bar


def test_no_readings_build_an_empty_table_no_chart_and_a_section_that_says_why():
    """The cards' reasons (NVML, GPU), escaped; not the server's."""
    results = [unread_run("a", 0, "no GPU: the run was on the CPU")]
    results += [unread_run("b", 0, "NVML unavailable (ImportError: No module named 'pynvml')")]
    frames = measured(results)
    energy = frames["energy"]
    by_throughput = ch.attribution_frame(F.runs_frame(results), CHAINS)
    assert energy.height == 0 and energy.columns == [*by_throughput.columns, "step"]  # its columns, no rows
    assert E.charts(frames) == {}
    why = "NVML unavailable (ImportError: No module named &#x27;pynvml&#x27;); no GPU: the run was on the CPU"
    assert E.section(frames, {}) == f"<h2>Energy</h2><p class='note'>No energy readings: {why}.</p>"
    unsampled = measured([fake_result("a", 8, 0, 100.0)])  # a record with no telemetry at all
    assert E.section(unsampled, {}) == "<h2>Energy</h2><p class='note'>No energy readings: not sampled.</p>"


def test_readings_of_stacks_in_no_chain_are_shown_not_said_to_be_absent():
    """No chain (a capacity-only config: chains default to none), or a chain of stacks not
    measured here: no factor, but the cards' energy was read and the chart draws it."""
    for chains in ({}, {"other": ["x", "y"]}):
        frames = measured(every("ab"), chains)
        assert frames["energy"].height == 0 and list(E.charts(frames)) == ["energy"]
        html = E.section(frames, {})
        assert "No energy readings" not in html
        assert f"<tr><td>tiny</td><td>b</td><td>tp1</td><td>{CELL}</td><td>0.25</td>" in html
        assert html.endswith("<p>No chain's stacks were measured here: no factors.</p>")
