"""Why, kernel by kernel, as an analysis (output/analyses/step_time.py): when the config turns it
on, the two tables it builds from the runs' profiled windows, its first-screen line per chain
step, its chart of each decode step by kernel class and its report section; failed profiles."""

import html

import polars as pl
import pytest
from records import fake_result

from speedsplit.analysis import frames as F
from speedsplit.analysis.step_time import CLASSES
from speedsplit.core.facts import ServerTelemetry, Telemetry
from speedsplit.core.trace_split import ProfileRecord, ProfileWindow, StepSplit
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import step_time as S
from speedsplit.planning import config as C

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
# ms per decode step by class: FP16 12 ms (dense GEMM 8), Marlin 8 ms (its GEMMs quantized, 3).
FP16 = dict(dense_gemm=8.0, attention=2.0, other=1.0, idle=1.0)
MARLIN = dict(dense_gemm=1.0, quantized_gemm=3.0, attention=2.0, other=1.0, idle=1.0)
# Marlin against FP16: 12 -> 8 ms, 33% faster; dense GEMM -7 and quantized GEMM +3 ms are the
# classes that moved (5% of the largest change, 0.35 ms, is the least said), attention did not.
SAID = (
    "decode step 12 → 8 ms (33% faster; by kernel class): dense GEMM -7 ms, quantized GEMM +3 ms; attention unchanged"
)


def split(device="gpu", scale=1.0, **ms) -> StepSplit:
    parts = {f"{c}_ms": scale * ms.get(c, 0.0) for c in CLASSES}
    return StepSplit(device=device, step_ms=sum(parts.values()), steps=32, kernels=100, **parts)


def profiled(stack, ms, topology="tp1", tp=1, engine_steps=None, device="gpu", scale=1.0):
    """Run 0 of u8-wide-greedy whose window split as `ms` (times `scale`); the engine counted
    engine_steps in its measured phase (2 s of wall)."""
    res = fake_result(stack, 8, 0, 100.0, topology=topology, tp=tp)
    res.profile = ProfileRecord(status="ok", window=ProfileWindow(), ranks=[split(device, scale, **ms)], seconds=3.0)
    if engine_steps is not None:
        server = dict.fromkeys(["kv_cache_usage_peak", "kv_cache_usage_mean", "running_mean", "waiting_mean"])
        server |= {"waiting_peak": None, "preemptions": None, "prefix_cache_hit_rate": None}
        server |= {"samples": 4, "prefix_cache_hits_flagged": False, "series": {}, "engine_steps": engine_steps}
        res.telemetry = Telemetry(interval_s=0.5, server=ServerTelemetry(**server))
    return res


def not_profiled(stack, status="server_died"):
    """A run whose cell failed: the bench job records why its window has no split."""
    res = fake_result(stack, 8, 0, None, status=status)
    res.profile = ProfileRecord(status="error", window=ProfileWindow(), error=f"not profiled: the cell is {status}")
    return res


def measured(results, chains=CHAINS, spec=None) -> dict[str, pl.DataFrame]:
    """The analysis's tables, as aggregate builds them from these results (spec: the cells the
    config names, where it names any)."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs)
    basis = Basis(
        runs=runs, cells=cells, by_throughput=pl.DataFrame(), chains=chains, results=tuple(results), spec=spec
    )
    return S.build(basis)


def bars(chart) -> dict[tuple, float]:
    """What each bar of the chart adds up to: its rows' ms summed per bar (x) and panel (column, row)."""
    spec = chart.to_dict()
    (data,) = spec["datasets"].values()
    x = spec["spec"]["encoding"]["x"]["field"]
    column, row = spec["facet"]["column"]["field"], spec["facet"]["row"]["field"]
    out: dict[tuple, float] = {}
    for r in data:
        key = (r[row], r[column], r[x])
        out[key] = out.get(key, 0.0) + r["ms"]
    return out


def test_naming_a_cell_to_profile_turns_the_analysis_on():
    plain = C.load()
    profile = C.validate(
        C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"mechanism": {"profile": {"cells": ["u8-wide-greedy"]}}})
    )
    assert S.ANALYSIS.enabled(profile) and not S.ANALYSIS.enabled(plain)
    assert {"step_time", "step_time_changes"} <= set(table_names(profile))
    assert not {"step_time", "step_time_changes"} & set(table_names(plain))


def test_runs_without_a_profiled_window_build_nothing_and_there_is_no_section_answer_or_chart():
    assert measured([fake_result(s, 8, 0, 100.0) for s in CHAINS["study"]]) == {}
    assert measured([]) == {}
    assert S.section({}, {}) == "" and S.answer({}) == "" and S.charts({}) == {}


def test_asked_for_but_not_profiled_it_builds_empty_tables_and_a_section_that_says_why():
    """The workflow declares both tables once a cell is named (a run of hf-fp16 alone once failed
    its tables job, the files it promised missing): they are written empty."""
    for results in ([fake_result(s, 8, 0, 100.0) for s in CHAINS["study"]], []):
        frames = measured(results, spec=["u8-wide-greedy"])
        assert set(frames) == {"step_time", "step_time_changes"} and not any(f.height for f in frames.values())
        assert "No run profiled a window" in S.section(frames, {})
        assert S.answer(frames) == "" and S.charts(frames) == {}


def test_each_chain_step_whose_stacks_were_both_profiled_is_a_line_of_the_answer():
    """hf-fp16 was not profiled (transformers has no vLLM profiler): its step has no line."""
    frames = measured(
        [fake_result("hf-fp16", 8, 0, 50.0), profiled("vllm-fp16", FP16), profiled("vllm-marlin", MARLIN)]
    )
    assert frames["step_time"].select("stack", "status", "step_ms").rows() == [
        ("vllm-fp16", "ok", 12.0),
        ("vllm-marlin", "ok", 8.0),
    ]
    (change,) = frames["step_time_changes"].iter_rows(named=True)
    assert (change["step"], change["position"], change["delta_ms"]) == ("vllm-fp16 → vllm-marlin", 2, -4.0)
    assert change["step_speedup"] == pytest.approx(1.5)
    assert S.answer(frames) == (
        "<h3>Why, kernel by kernel (a profiled window of decode steps)</h3>"
        f"<p class='headline'>vllm-fp16 → vllm-marlin at 8 users (u8-wide-greedy; study; tiny, tp1): {SAID}</p>"
    )


def test_the_measured_phase_stands_beside_the_profiled_step_and_a_side_the_profiler_slowed_is_said():
    """FP16's measured phase: 2 s over 200 steps, 10 ms a step, so its 12 ms profiled step is 20%
    slower (beyond the 10% the profiler is allowed); Marlin's 250 steps, 8 ms: as profiled."""
    frames = measured(
        [profiled("vllm-fp16", FP16, engine_steps=200), profiled("vllm-marlin", MARLIN, engine_steps=250)]
    )
    step = frames["step_time"]
    assert step["measured_step_ms"].to_list() == pytest.approx([10.0, 8.0])
    assert step["profiled_over_measured"].to_list() == pytest.approx([1.2, 1.0])
    assert html.unescape(S.answer(frames)).endswith(
        f"{SAID}; the measured phase's steps (prefill in them) 10 → 8 ms "
        "(the profiler slowed vllm-fp16's 20% beyond them: idle there is partly the profiler's)</p>"
    )


def test_on_a_cpu_the_classes_are_the_hosts_ops():
    frames = measured([profiled("vllm-fp16", FP16, device="cpu"), profiled("vllm-marlin", MARLIN, device="cpu")])
    on_cpu = SAID.replace("by kernel class", "on the CPU, by op")
    assert S.answer(frames).endswith(f"(u8-wide-greedy; study; tiny, tp1): {on_cpu}</p>")


def test_the_chart_is_a_bar_per_profiled_stack_its_classes_adding_up_to_its_step():
    frames = measured([profiled("vllm-fp16", FP16), profiled("vllm-marlin", MARLIN)])
    chart = S.charts(frames)["step-time"]
    assert bars(chart) == pytest.approx(
        {("tiny", "u8-wide-greedy", "vllm-fp16"): 12.0, ("tiny", "u8-wide-greedy", "vllm-marlin"): 8.0}
    )
    spec = chart.to_dict()
    (data,) = spec["datasets"].values()
    names = ["communication", "attention", "quantized GEMM", "dense GEMM", "copies", "other kernels", "GPU idle"]
    assert spec["spec"]["encoding"]["color"]["sort"] == names  # stacked in the classes' order
    marlin = {r["class"]: r["ms"] for r in data if r["stack"] == "vllm-marlin"}
    assert marlin == {
        "communication": 0.0, "attention": 2.0, "quantized GEMM": 3.0, "dense GEMM": 1.0, "copies": 0.0,
        "other kernels": 1.0, "GPU idle": 1.0,
    }  # fmt: skip


def test_a_failed_profile_is_a_row_that_says_why_and_no_change_bar_or_line():
    frames = measured([profiled("vllm-fp16", FP16), not_profiled("vllm-marlin")])
    failed = frames["step_time"].filter(pl.col("stack") == "vllm-marlin").row(0, named=True)
    assert (failed["status"], failed["error"], failed["step_ms"]) == (
        "error",
        "not profiled: the cell is server_died",
        None,
    )
    assert frames["step_time_changes"].height == 0 and S.answer(frames) == ""
    assert set(bars(S.charts(frames)["step-time"])) == {("tiny", "u8-wide-greedy", "vllm-fp16")}
    section = S.section(frames, {})
    assert section.startswith("<h2>Why, kernel by kernel</h2>")
    assert "<td>not profiled: the cell is server_died</td>" in section
    assert section.endswith("<p>No chain step had both its stacks profiled.</p>")
    # every profile failed: the tables say so, and there is nothing to draw
    none = measured([not_profiled("vllm-fp16", "server_hung"), not_profiled("vllm-marlin")])
    assert none["step_time"]["status"].to_list() == ["error", "error"] and S.charts(none) == {}
    assert "<td>not profiled: the cell is server_hung</td>" in S.section(none, {})


def test_the_section_shows_both_tables():
    frames = measured([profiled("vllm-fp16", FP16), profiled("vllm-marlin", MARLIN)])
    steps, changes = S.section(frames, {}).split("</table></div>")[:2]
    assert "<th>step_ms</th>" in steps and "<td>vllm-marlin</td>" in steps
    assert "<th>delta_ms</th>" in changes and "<td>vllm-fp16 → vllm-marlin</td>" in changes
    assert "<td>-7</td>" in changes  # dense GEMM's delta


def test_a_stack_profiled_on_two_topologies_is_two_bars_and_two_lines_that_say_which():
    """tp2 halves every class: 6 -> 4 ms. Each topology's bar adds up to its own step (they were
    one bar of 18 ms), and each line names its topology (two lines read alike)."""
    results = [profiled("vllm-fp16", FP16), profiled("vllm-marlin", MARLIN)]
    results += [
        profiled(s, ms, topology="tp2", tp=2, scale=0.5) for s, ms in (("vllm-fp16", FP16), ("vllm-marlin", MARLIN))
    ]
    frames = measured(results)
    assert frames["step_time_changes"]["topology"].to_list() == ["tp1", "tp2"]
    per_bar = bars(S.charts(frames)["step-time"])
    assert sorted(per_bar.values()) == pytest.approx([4.0, 6.0, 8.0, 12.0])
    said = S.answer(frames)
    assert "at 8 users (u8-wide-greedy; study; tiny, tp1): decode step 12 → 8 ms" in said
    assert "at 8 users (u8-wide-greedy; study; tiny, tp2): decode step 6 → 4 ms" in said
