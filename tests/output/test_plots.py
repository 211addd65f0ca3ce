"""The core charts (speedsplit/output/plots.py) drawn from the frames of a chain of known speeds:
which charts a run gets, what each one holds, and the files save writes."""

import math
import os

import polars as pl
import pytest
from records import fake_result, write_result

from speedsplit.core.facts import ServerTelemetry, Telemetry
from speedsplit.core.formats import flat
from speedsplit.core.requestlog import RequestRecord
from speedsplit.output import aggregate, chart_parts, plots

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
STEPS = {"study": ["runtime", "INT4 weights + kernel"]}
# Two runs a stack at 8 users, geometric means 200, 800, 2400 (factors 4 and 3, total 12); at
# 2 users a quarter of that. hf-fp16's runs are 4x apart: every interval through it is wider
# than the waterfall's axis. vllm-marlin-b (INT4, outside the chain) reports no kernel.
RUNS = {"hf-fp16": (100.0, 400.0), "vllm-fp16": (800 * 0.98, 800 / 0.98), "vllm-marlin": (2400 * 0.98, 2400 / 0.98)}
CELLS = [(s, u) for s in RUNS for u in (2, 8)] + [("vllm-marlin-b", 8)]  # every (stack, users) measured
TRAFFIC = [(0.0, 0.0), (0.3, 1.0)]  # run 0's measured requests: (sent, first token); each ends 0.5 s later


def write_chain(root, users=(2, 8), runs=RUNS, failed=(), sampling="greedy"):
    paths = []
    for stack, rates in runs.items():
        for u in users:
            for run, rate in enumerate(rates):
                ok = stack not in failed
                status = "ok" if ok else "server_error"
                res = fake_result(stack, u, run, rate * u / 8 if ok else None, status, sampling=sampling)
                cell = f"bench/tiny/{stack}/tp1/{res.cell}"
                paths.append(write_result(root / f"{cell}/run{run}.json", res))
    return paths


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    paths = write_chain(root)
    for run, (peak, waiting, preempted) in enumerate([(0.5, 1.0, 1.0), (0.7, 3.0, 2.0)]):
        res = fake_result("vllm-fp16", 8, run, RUNS["vllm-fp16"][run])
        res.telemetry = Telemetry(interval_s=1.0, server=ServerTelemetry(
            samples=3, kv_cache_usage_peak=peak, kv_cache_usage_mean=peak, running_mean=4.0, waiting_mean=waiting,
            waiting_peak=waiting, preemptions=preempted, prefix_cache_hit_rate=0.0, prefix_cache_hits_flagged=False,
            series={}))  # fmt: skip
        write_result(root / f"bench/tiny/vllm-fp16/tp1/u8-wide-greedy/run{run}.json", res)
    for run in (0, 1):
        res = fake_result("vllm-marlin-b", 8, run, 900.0)
        res.engine.linear_kernel = None
        paths.append(write_result(root / f"bench/tiny/vllm-marlin-b/tp1/u8-wide-greedy/run{run}.json", res))
    for stack in CHAINS["study"]:
        records = [RequestRecord(user=i, index=0, phase="measured", url="http://x", sent=s, first_token=f, end=s + 0.5)
                   for i, (s, f) in enumerate(TRAFFIC)]  # fmt: skip
        warm = RequestRecord(user=0, index=0, phase="warmup", url="http://x", sent=-1.0, end=-0.5)
        lines = [r.model_dump_json() for r in [warm, *reversed(records)]]
        (root / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run0.requests.jsonl").write_text("\n".join(lines))
    return paths, aggregate.build_frames(paths, CHAINS, steps=STEPS)


@pytest.fixture(scope="module")
def charts(built):
    return plots.core_charts(built[1], ["study"], kernel_reference="vllm-fp16")


def rows(chart) -> list[dict]:
    (data,) = chart.to_dict()["datasets"].values()
    return data


def layers(chart) -> list[dict]:
    return chart.to_dict()["spec"]["layer"]


def fields(layer: dict, *channels: str) -> tuple:
    return tuple(layer["encoding"][c]["field"] for c in channels)


def test_a_measured_chain_gets_every_core_chart_and_the_kernel_chart_only_against_a_reference(built, charts):
    core = ["waterfall", "throughput", "latency", "server", "tradeoff", "timeline", "factors-study", "shares-study"]
    assert list(charts) == core[:3] + ["kernels"] + core[3:]
    assert list(plots.core_charts(built[1], ["study"])) == core  # no reference named: no kernel chart


def test_the_waterfall_runs_each_factor_from_the_product_before_it_and_the_total_from_one(charts):
    got = [(r["bar"], r["start"], r["end"], r["direction"], r["label"], r["top"]) for r in rows(charts["waterfall"])]
    assert got == [
        ("1. runtime", 1.0, pytest.approx(4.0), "speeds up", "4.0x", pytest.approx(4.0)),
        ("2. INT4 weights + kernel", pytest.approx(4.0), pytest.approx(12.0), "speeds up", "3.0x", pytest.approx(12.0)),
        ("= total", 1.0, pytest.approx(12.0), "total", "12.0x", pytest.approx(12.0)),
    ]
    panels = {(r["where"], r["chain_model"]) for r in rows(charts["waterfall"])}
    assert panels == {("8 users, wide (tp1)", "study: tiny")}
    spec = charts["waterfall"].to_dict()
    bars = layers(charts["waterfall"])[0]
    assert fields(bars, "y", "y2") == ("start", "end")
    y = bars["encoding"]["y"]
    assert y["scale"] == {"type": "log", "domain": [pytest.approx(1 / 1.2), pytest.approx(12 * 1.6)], "nice": False}
    assert y["axis"]["values"] == [1.0, 2.0, 5.0, 10.0] and y["title"] == "speedup (log; bars add up to the total)"
    assert (spec["facet"]["column"]["field"], spec["facet"]["row"]["field"]) == ("where", "chain_model")
    assert spec["title"]["subtitle"][0] == "hardware: CPU: Test CPU"


def test_each_interval_is_drawn_where_its_bar_ends_and_stops_at_the_axis_with_an_arrow(built, charts):
    att = built[1]["attribution"].filter(pl.col("headline"))
    interval = {r["factor"]: (r["lo"], r["hi"]) for r in att.iter_rows(named=True)}
    low, high = 1 / 1.2, 12 * 1.6
    runtime, int4, total = rows(charts["waterfall"])
    assert (int4["end_lo"], int4["end_hi"]) == pytest.approx([4 * v for v in interval["vllm-marlin/vllm-fp16"]])
    assert low < int4["end_lo"] < 12 < int4["end_hi"] < high  # inside the axis: drawn whole, no arrow
    shown = (int4["shown_lo"], int4["shown_hi"], int4["off_lo"], int4["off_hi"])
    assert shown == (int4["end_lo"], int4["end_hi"], None, None)
    for bar, factor in ((runtime, "vllm-fp16/hf-fp16"), (total, "total")):  # through hf-fp16: past both ends
        assert (bar["end_lo"], bar["end_hi"]) == pytest.approx(interval[factor])
        assert interval[factor][0] < low and interval[factor][1] > high
        assert (bar["shown_lo"], bar["shown_hi"]) == pytest.approx((low, high))
        assert (bar["off_lo"], bar["off_hi"]) == ("▼", "▲")
    whiskers, off_hi, off_lo = layers(charts["waterfall"])[1:4]
    assert whiskers["mark"]["type"] == "rule" and fields(whiskers, "y", "y2") == ("shown_lo", "shown_hi")
    assert [fields(m, "text", "y") for m in (off_hi, off_lo)] == [("off_hi", "shown_hi"), ("off_lo", "shown_lo")]


def test_a_factor_that_slows_down_is_a_red_bar_downwards_on_an_axis_reaching_below_it(built):
    frames = aggregate.build_frames(built[0], {"back": ["vllm-marlin", "vllm-fp16"]})
    chart = plots.core_charts(frames, ["back"])["waterfall"]
    got = [(r["bar"], r["start"], r["end"], r["direction"], r["label"]) for r in rows(chart)]
    third = pytest.approx(1 / 3)
    slows = ("1. vllm-fp16/vllm-marlin", 1.0, third, "slows down", "0.333x")
    assert got == [slows, ("= total", 1.0, third, "total", "0.333x")]
    y = layers(chart)[0]["encoding"]["y"]
    assert y["scale"]["domain"] == [pytest.approx(1 / 3 / 1.2), pytest.approx(1.6)]
    assert y["axis"]["values"] == [0.5, 1.0]
    color = layers(chart)[0]["encoding"]["color"]["scale"]
    assert dict(zip(color["domain"], color["range"]))["slows down"] == "#e45756"


def test_the_factors_chart_draws_every_measured_factor_of_its_chain_against_users(charts):
    got = {(r["users"], r["factor"]): r["value"] for r in rows(charts["factors-study"])}
    factors = {"vllm-fp16/hf-fp16": 4.0, "vllm-marlin/vllm-fp16": 3.0, "total": 12.0}
    assert got == pytest.approx({(u, f): v for u in (2, 8) for f, v in factors.items()})
    spec = charts["factors-study"].to_dict()
    line, bars = spec["spec"]["layer"]
    y = line["encoding"]["y"]
    assert (y["title"], y["scale"]) == ("speedup factor (log)", {"type": "log"})
    assert line["encoding"]["x"]["title"] == "concurrent users" and fields(bars, "y", "y2") == ("lo", "hi")
    said = ("Speedup factors along chain 'study' vs concurrent users", "model: tiny | hardware: CPU: Test CPU")
    assert spec["title"] == {"text": said[0], "subtitle": [said[1], chart_parts.ERRORBARS], "anchor": "start"}


def test_the_shares_chart_stacks_each_factors_log_share_per_cell_leaving_out_the_total(charts):
    got = {(r["cell"], r["factor"]): r["log_share"] for r in rows(charts["shares-study"])}
    shares = {"vllm-fp16/hf-fp16": math.log(4) / math.log(12), "vllm-marlin/vllm-fp16": math.log(3) / math.log(12)}
    assert got == pytest.approx({(f"u{u}-wide-greedy", f): s for u in (2, 8) for f, s in shares.items()})
    enc = charts["shares-study"].to_dict()["spec"]["encoding"]
    titles = ("zero", "log share of total speedup", "cell (users-workload-sampling)")
    assert (enc["y"]["stack"], enc["y"]["title"], enc["x"]["title"]) == titles


def test_throughput_is_each_stacks_output_rate_per_users_with_its_interval_on_log_axes(built, charts):
    got = {(r["stack"], r["users"]): r["output_tok_s"] for r in rows(charts["throughput"])}
    geomeans = {"hf-fp16": 200.0, "vllm-fp16": 800.0, "vllm-marlin": 2400.0, "vllm-marlin-b": 900.0}
    assert got == pytest.approx({(s, u): geomeans[s] * u / 8 for s, u in CELLS})
    keys = ["stack", "users", "output_tok_s_lo", "output_tok_s_hi"]  # each drawn with the cell's interval
    assert {tuple(r[k] for k in keys) for r in rows(charts["throughput"])} == set(built[1]["cells"][keys].iter_rows())
    line, bars = layers(charts["throughput"])
    x, y = line["encoding"]["x"], line["encoding"]["y"]
    assert (y["title"], x["title"]) == ("output tokens/s (log)", "concurrent users")
    assert y["scale"] == x["scale"] == {"type": "log"}
    assert bars["mark"]["type"] == "errorbar" and fields(bars, "y", "y2") == ("output_tok_s_lo", "output_tok_s_hi")
    assert line["encoding"]["strokeDash"]["field"] == "topology"


def test_latency_draws_four_percentiles_in_seconds_without_intervals(charts):
    got = {(r["stack"], r["users"], r["metric"]): r["seconds"] for r in rows(charts["latency"])}
    per_cell = {"TTFT median": 0.1, "TTFT p99": 0.3, "TPOT median": 0.1, "E2E p99": 0.3}  # fake_result's
    assert got == pytest.approx({(s, u, m): v for s, u in CELLS for m, v in per_cell.items()})
    spec = charts["latency"].to_dict()
    assert spec["spec"]["encoding"]["y"]["title"] == "seconds (log; median over runs)"
    assert spec["title"]["subtitle"] == ["model: tiny | hardware: CPU: Test CPU"]  # no error bars drawn


def test_the_server_chart_holds_what_the_servers_reported_per_cell(charts):
    got = {(r["stack"], r["users"], r["metric"]): r["value"] for r in rows(charts["server"])}
    # the peak's highest run, the waiting queue's median, the preemptions summed over runs
    reported = {"KV cache peak (fraction)": 0.7, "waiting (mean)": 2.0, "preempted": 3.0}
    assert got == {("vllm-fp16", 8, metric): v for metric, v in reported.items()}
    assert charts["server"].to_dict()["resolve"] == {"scale": {"y": "independent"}}


def test_the_tradeoff_puts_tpot_in_milliseconds_against_throughput_one_point_per_users(charts):
    got = {(r["stack"], r["level"]): (r["order"], r["tpot_ms"]) for r in rows(charts["tradeoff"])}
    assert got == {(s, f"{u} users"): (float(u), pytest.approx(100.0)) for s, u in CELLS}  # fake_result's 0.1 s
    enc = charts["tradeoff"].to_dict()["spec"]["encoding"]
    assert (enc["x"]["title"], enc["y"]["title"]) == ("output tokens/s (log)", "TPOT median, ms (log)")


def test_the_kernel_chart_sets_each_int4_stack_against_the_fp16_reference_dashed(built, charts):
    cells = flat(built[1]["cells"])
    assert plots.kernel_sweep_ran(cells, "vllm-fp16")
    assert not plots.kernel_sweep_ran(cells.filter(pl.col("stack") != "vllm-marlin-b"), "vllm-fp16")  # one INT4 stack
    assert not plots.kernel_sweep_ran(cells, "sglang-fp16")  # the reference not measured
    got = {(r["kernel"], r["reference"]) for r in rows(charts["kernels"])}
    assert {("vllm-fp16 (FP16 reference)", True), ("vllm-marlin (CPUWNA16LinearKernel)", False)} < got
    assert "hf-fp16" not in {r["stack"] for r in rows(charts["kernels"])}
    dash = layers(charts["kernels"])[0]["encoding"]["strokeDash"]["scale"]
    assert dash == {"domain": [False, True], "range": [[1, 0], [6, 3]]}
    assert charts["kernels"].to_dict()["title"]["text"] == "INT4 kernels vs users, against vllm-fp16 (dashed)"


def test_an_int4_stack_whose_engine_named_no_kernel_is_labelled_kernel_not_reported(charts):
    got = {r["stack"]: r["kernel"] for r in rows(charts["kernels"])}
    assert got["vllm-marlin-b"] == "vllm-marlin-b (kernel not reported)"


def test_the_timeline_draws_run_zeros_measured_requests_by_send_time_a_row_per_stack(charts):
    got = [(r["stack"], r["request"], r["sent"], r["first_token"], r["end"]) for r in rows(charts["timeline"])]
    assert got == [(s, i, sent, first, sent + 0.5) for s in CHAINS["study"] for i, (sent, first) in enumerate(TRAFFIC)]
    spec = charts["timeline"].to_dict()
    assert spec["title"]["text"] == "Every request of run 0 at u8-wide-greedy (tiny, tp1)"
    span, first, due = spec["spec"]["layer"]
    assert fields(span, "x", "x2") + fields(first, "x") + fields(due, "x") == ("sent", "end", "first_token", "due")
    assert span["encoding"]["x"]["title"] == "seconds from the measured phase's start"
    assert spec["facet"]["row"]["field"] == "stack"


def test_a_failed_stack_leaves_no_waterfall_or_shares_and_no_point_of_its_own(tmp_path):
    frames = aggregate.build_frames(write_chain(tmp_path, users=(8,), failed=("vllm-marlin",)), CHAINS)
    charts = plots.core_charts(frames, ["study"])
    assert list(charts) == ["throughput", "latency", "tradeoff", "factors-study"]
    assert {(r["factor"], round(r["value"], 9)) for r in rows(charts["factors-study"])} == {("vllm-fp16/hf-fp16", 4.0)}
    assert {r["stack"] for r in rows(charts["throughput"])} == {"hf-fp16", "vllm-fp16"}


def test_when_every_run_failed_no_chart_is_drawn_empty(tmp_path):
    frames = aggregate.build_frames(write_chain(tmp_path, users=(8,), failed=tuple(RUNS)), CHAINS)
    assert plots.core_charts(frames, ["study"]) == {}


def test_two_headline_cells_differing_only_in_sampling_get_a_waterfall_panel_each(tmp_path):
    paths = write_chain(tmp_path, users=(8,)) + write_chain(tmp_path, users=(8,), sampling="random")
    chart = plots.core_charts(aggregate.build_frames(paths, CHAINS), ["study"])["waterfall"]
    assert len({r["where"] for r in rows(chart)}) == 2


def test_save_writes_html_with_its_javascript_svg_and_png_and_leaves_no_temp_file(charts, tmp_path):
    out = plots.save(charts["factors-study"], tmp_path / "plots" / "factors-study.v1")  # a dot in the name
    assert out == {ext: tmp_path / "plots" / f"factors-study.v1.{ext}" for ext in ("html", "svg", "png")}
    assert sorted(os.listdir(tmp_path / "plots")) == sorted(p.name for p in out.values())
    assert all(os.stat(p).st_mode & 0o777 == 0o644 for p in out.values())
    html = out["html"].read_text()
    assert "https://cdn" not in html and "Speedup factors along chain 'study'" in html and '"labelLimit": 400' in html
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "<svg" in out["svg"].read_text()[:500]
