"""Coordination as an analysis: when the config turns it on, the table it builds from the profile
files the profile rule writes (each tp<k> decode step against tp1's), and its report section
(output/analyses/coordination.py)."""

import polars as pl
import pytest

from speedsplit.core.results import write_json_atomic
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import coordination as K
from speedsplit.planning import config as C

PARTS = ("compute_ms", "communication_ms", "copy_ms", "gap_ms")
CELL = "u8-wide-greedy"


def profile(topology, tp, step, compute, communication, copy, gap, model="tiny", cell=CELL) -> dict:
    """A profile as measuring/coordination.profile_cell writes it: its breakdown the mean of its
    ranks' split of one decode step, in ms."""
    breakdown = {"step_ms": step, "communication_ms": communication, "compute_ms": compute}
    breakdown |= {"copy_ms": copy, "gap_ms": gap}
    return {
        "model": model,
        "stack": "vllm-fp16",
        "topology": topology,
        "cell": cell,
        "users": 8,
        "tensor_parallel": tp,
        "platform": "cuda",
        "delay_iterations": 16,
        "iterations": 32,
        "started": "2026-11-30T00:00:00+00:00",
        "status": "ok",
        "load": {"output_tok_s": 500.0, "completed": 8, "failed": 0},
        "ranks": [{"trace": f"rank{r}.pt.trace.json.gz", **breakdown, "kernels": 100} for r in range(tp)],
        "breakdown": breakdown,
        "traces": [f"rank{r}.pt.trace.json.gz" for r in range(tp)],
        "finished": "2026-11-30T00:01:00+00:00",
        "provenance": {"workflow_commit": "abc"},
    }


def failed(topology, tp, error, model="tiny", cell=CELL) -> dict:
    """A profile whose job failed: no breakdown, why in `error` (as profile_cell records it)."""
    out = {k: v for k, v in profile(topology, tp, 1, 1, 0, 0, 0, model, cell).items() if k not in ("breakdown", "load")}
    return out | {"status": "error", "error": error, "ranks": [], "traces": []}


def cpu(topology, tp, cell=CELL) -> dict:
    """A profile of a server with no GPU: traces with no kernel events, nothing to split."""
    note = "no GPU kernel events in the traces (no GPU: nothing to split)"
    return profile(topology, tp, 1, 1, 0, 0, 0, cell=cell) | {"breakdown": None, "note": note, "ranks": []}


# tp1: 12 ms a step (10 compute, 0.5 copies, 1.5 idle). tp4: 5 ms (2.6 compute, 1.5 communication,
# 0.2 copies, 0.7 idle). Ideal tp4 step 12 / 4 = 3 ms: shortfall 2 ms = compute 2.6 - 10/4 = 0.1
# + communication 1.5 - 0 = 1.5 + copies 0.2 - 0.5/4 = 0.075 + idle 0.7 - 1.5/4 = 0.325;
# coordination (communication + idle) 1.825 / 2 = 0.9125 of it; the step 12 / 5 = 2.4 times faster.
TP1 = profile("tp1", 1, 12.0, 10.0, 0.0, 0.5, 1.5)
TP4 = profile("tp4", 4, 5.0, 2.6, 1.5, 0.2, 0.7)


def measured(tmp_path, profiles) -> dict[str, pl.DataFrame]:
    """The analysis's tables from these profiles, written as the profile rule writes them."""
    paths = []
    for i, p in enumerate(profiles):
        path = tmp_path / "profile" / p["model"] / p["stack"] / p["topology"] / f"{p['cell']}-{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, p)
        paths.append(path)
    empty = pl.DataFrame()
    return K.build(Basis(runs=empty, cells=empty, by_throughput=empty, chains={}, profile_paths=tuple(paths)))


def test_the_config_turns_it_on_and_it_needs_nothing_from_the_config_to_build():
    off = C.load()
    assert not K.ANALYSIS.enabled(off) and "coordination" not in table_names(off)
    on = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"coordination": {"enabled": True, "topologies": ["tp1"]}}))
    assert K.ANALYSIS.enabled(on) and "coordination" in table_names(on)
    assert K.ANALYSIS.spec(on) is None and K.ANALYSIS.tables == ("coordination",)
    # no chart and no block of the first screen
    frames = {"coordination": pl.DataFrame()}
    assert K.ANALYSIS.charts(frames) == {} and K.ANALYSIS.answer(frames) == ""


def test_no_profile_files_build_nothing_and_a_missing_table_has_no_section(tmp_path):
    assert measured(tmp_path, []) == {}
    assert K.section({}, {}) == "" and K.section({"cells": pl.DataFrame()}, {}) == ""


def test_the_shortfall_against_ideal_scaling_splits_into_its_parts(tmp_path):
    frames = measured(tmp_path, [TP4, TP1])  # in any order
    (row,) = frames["coordination"].iter_rows(named=True)
    assert (row["model"], row["stack"], row["cell"]) == ("tiny", "vllm-fp16", CELL)
    assert (row["topology"], row["tensor_parallel"]) == ("tp4", 4)
    assert (row["step_ms_tp1"], row["step_ms"]) == (12.0, 5.0)
    assert (row["ideal_step_ms"], row["shortfall_ms"]) == pytest.approx((3.0, 2.0))
    excess = [row[f"excess_{p}"] for p in PARTS]
    assert excess == pytest.approx([0.1, 1.5, 0.075, 0.325])
    assert sum(excess) == pytest.approx(row["shortfall_ms"])  # the parts add up to the shortfall
    assert (row["coordination_share"], row["step_speedup"]) == pytest.approx((0.9125, 2.4))
    assert row["note"] == ""


def test_the_section_tabulates_each_tp_against_tp1(tmp_path):
    html = K.section(measured(tmp_path, [TP1, TP4, profile("tp2", 2, 7.0, 5.2, 1.0, 0.3, 0.5)]), {})
    assert html.startswith("<h2>Where tensor parallelism loses time</h2>\n<p class='note'>From profiler traces")
    head = "<th>model</th><th>stack</th><th>cell</th><th>topology</th><th>tensor_parallel</th><th>step_ms_tp1</th>"
    assert head in html and "<th>coordination_share</th><th>step_speedup</th><th>note</th>" in html
    # tp2: ideal 6 ms, shortfall 1 ms; coordination (1.0 + 0.5 - 1.5 / 2) / 1 = 0.75; 12 / 7 = 1.714
    tp2 = f"<tr><td>tiny</td><td>vllm-fp16</td><td>{CELL}</td><td>tp2</td><td>2</td><td>12</td><td>7</td><td>6</td>"
    assert tp2 + "<td>1</td>" in html and "<td>0.75</td><td>1.714</td><td></td></tr>" in html
    assert html.index("<td>tp2</td>") < html.index("<td>tp4</td>")  # by tensor-parallel size
    assert "<td>tp1</td>" not in html  # tp1 is the baseline, not a row


def test_tp1_profiled_alone_is_an_empty_table_the_section_says_so(tmp_path):
    frames = measured(tmp_path, [TP1])
    coordination = frames["coordination"]
    assert coordination.height == 0 and "coordination_share" in coordination.columns
    html = K.section(frames, {})
    assert html.endswith("<p>No tp<i>k</i> was profiled beside tp1.</p>") and "<table>" not in html


def test_a_failed_or_empty_profile_or_a_missing_tp1_is_a_row_that_says_why(tmp_path):
    """At u8 tp4 splits and tp2 failed (the profiler wrote no trace); u2's tp1 was on no GPU;
    u4 has a tp2 and no tp1: each tp<k> row without a split says why."""
    profiles = [
        TP1,
        TP4,
        failed("tp2", 2, "the profiler wrote no trace"),
        cpu("tp1", 1, cell="u2-wide-greedy"),
        TP4 | {"cell": "u2-wide-greedy"},
        profile("tp2", 2, 7.0, 5.2, 1.0, 0.3, 0.5, cell="u4-wide-greedy"),
    ]
    frames = measured(tmp_path, profiles)
    rows = frames["coordination"].select("cell", "topology", "note", "shortfall_ms", "coordination_share").rows()
    assert rows == [
        ("u2-wide-greedy", "tp4", "tp1: no GPU kernel events in the traces (no GPU: nothing to split)", None, None),
        ("u4-wide-greedy", "tp2", "no tp1 profile", None, None),
        (CELL, "tp2", "tp2: the profiler wrote no trace", None, None),
        (CELL, "tp4", "", pytest.approx(2.0), pytest.approx(0.9125)),
    ]
    html = K.section(frames, {})
    assert "<td>tp2: the profiler wrote no trace</td></tr>" in html and "<td>no tp1 profile</td></tr>" in html


def test_a_tp_that_scales_better_than_ideal_has_no_shortfall_and_no_share(tmp_path):
    """tp2 at 5.5 ms against tp1's 12: ideal 6, shortfall -0.5 ms; 12 / 5.5 = 2.18 times faster."""
    frames = measured(tmp_path, [TP1, profile("tp2", 2, 5.5, 4.5, 0.5, 0.2, 0.3)])
    (row,) = frames["coordination"].iter_rows(named=True)
    assert row["shortfall_ms"] == pytest.approx(-0.5) and row["coordination_share"] is None
    assert row["step_speedup"] == pytest.approx(12 / 5.5) and row["note"] == "no shortfall: scales at least ideally"


def test_each_model_is_set_against_its_own_tp1(tmp_path):
    """small: tp1 12 ms, tp4 5 ms (2.4×); large: tp1 40 ms, tp4 12 ms (ideal 10: 3.33×)."""
    large = [profile("tp1", 1, 40.0, 36.0, 0.0, 1.0, 3.0, model="large")]
    large += [profile("tp4", 4, 12.0, 9.5, 1.5, 0.3, 0.7, model="large")]
    frames = measured(tmp_path, [TP4 | {"model": "small"}, *large, TP1 | {"model": "small"}])
    rows = frames["coordination"].select("model", "step_ms_tp1", "ideal_step_ms", "shortfall_ms", "step_speedup").rows()
    assert rows == [("large", 40.0, 10.0, 2.0, pytest.approx(40 / 12)), ("small", 12.0, 3.0, 2.0, 2.4)]
