import json
import math
from pathlib import Path

import polars as pl
import pytest
from records import fake_result, write_result

from speedsplit import cli
from speedsplit.analysis import chains
from speedsplit.analysis import frames as T
from speedsplit.core import formats
from speedsplit.core.record import ResultError, read_result
from speedsplit.output import aggregate, plots, report


@pytest.fixture()
def result_files(tmp_path):
    paths = []
    speeds = {"hf-fp16": 100.0, "vllm-fp16": 190.0, "vllm-marlin": 258.4}
    for users, scale in ((8, 1.0), (64, 2.0)):
        for stack, base in speeds.items():
            for run in range(3):
                p = tmp_path / f"{stack}-{users}-{run}.json"
                write_result(p, fake_result(stack, users, run, base * scale * (1 + 0.01 * (run - 1))))
                paths.append(p)
    p = tmp_path / "marlin-failed.json"
    write_result(p, fake_result("vllm-marlin", 128, 0, None, status="startup_failed"))
    paths.append(p)
    p = tmp_path / "hf-128.json"
    write_result(p, fake_result("hf-fp16", 128, 0, 50.0))
    paths.append(p)
    return paths


def runs_of(paths):
    return T.runs_frame([read_result(p) for p in paths])


def test_cells_and_attribution_tables(result_files, tmp_path):
    runs = runs_of(result_files)
    assert runs.height == len(result_files)
    cells = T.cells_frame(runs)
    row = cells.filter((pl.col("stack") == "vllm-fp16") & (pl.col("users") == 8)).row(0, named=True)
    gm = (190.0 * 0.99 * 190.0 * 190.0 * 1.01) ** (1 / 3)  # the runs' geometric mean
    assert row["output_tok_s"] == pytest.approx(gm, rel=1e-12)
    assert row["output_tok_s_lo"] <= gm <= row["output_tok_s_hi"] and row["runs_ok"] == 3
    assert row["values_from"] == "clean runs" and row["interval"] == "95% t over runs"
    att = chains.attribution_frame(runs, {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]})
    u8 = att.filter(pl.col("users") == 8)
    factors = u8.filter(pl.col("position") > 0)["value"].to_list()
    total = u8.filter(pl.col("factor") == "total")["value"].item()
    assert factors == pytest.approx([1.9, 1.36])
    assert math.prod(factors) == pytest.approx(total, rel=1e-12)
    failed = att.filter(pl.col("users") == 128)
    assert failed["value"].null_count() == failed.height
    assert "vllm-marlin: no clean run (run0: startup_failed)" in failed["note"][0]
    cross = chains.crossover_frame(att)
    assert cross["crossover_users"].to_list() == [None] and cross["users_max"].to_list() == [128]
    stab = chains.stability_frame(att)
    assert stab.filter(pl.col("factor") == "vllm-fp16/hf-fp16")["spread_pct"].to_list() == [0.0, 0.0, None]


def test_flagged_runs_are_left_out_of_the_factors_and_counted(tmp_path):
    """A flagged run would move the factor (1000 tok/s); by default it is left out and said so."""
    paths = []
    for stack, speeds in {
        "hf-fp16": [100.0, 102.0],
        "vllm-fp16": [200.0, 1000.0],
        "vllm-marlin": [300.0, 303.0],
    }.items():
        for run, tok_s in enumerate(speeds):
            flags = ["kernel_mismatch"] if (stack, run) == ("vllm-fp16", 1) else []
            if (stack, run) == ("vllm-marlin", 1):
                flags = ["short_measurement"]
            p = tmp_path / f"{stack}-{run}.json"
            write_result(p, fake_result(stack, 8, run, tok_s, flags=flags))
            paths.append(p)
    p = tmp_path / "hf-died.json"
    write_result(p, fake_result("hf-fp16", 8, 2, None, status="server_died"))
    runs = runs_of(paths + [p])
    chain = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
    att = chains.attribution_frame(runs, chain)
    rt = att.filter(pl.col("factor") == "vllm-fp16/hf-fp16").row(0, named=True)
    gm_hf = math.sqrt(100.0 * 102.0)  # values over runs are geometric means
    assert rt["value"] == pytest.approx(200.0 / gm_hf)  # the 1000 tok/s run is not in it
    assert rt["runs_used"] == 3 and rt["runs_excluded"] == 2
    assert rt["excluded"] == ["hf-fp16 run2: server_died", "vllm-fp16 run1: kernel_mismatch"]
    total = att.filter(pl.col("factor") == "total").row(0, named=True)
    assert total["runs_used"] == 4 and total["runs_excluded"] == 3
    # tolerated flags count again
    tolerant = chains.attribution_frame(runs, chain, tolerate_flags=["kernel_mismatch", "short_measurement"])
    tolerated = math.sqrt(200.0 * 1000.0) / gm_hf
    assert tolerant.filter(pl.col("factor") == "vllm-fp16/hf-fp16")["value"].item() == pytest.approx(tolerated)
    # a stack with no clean run: its factors are undefined with the reason; the others stand
    only_bad = [q for q in paths if "vllm-marlin-0" not in q.name]
    att = chains.attribution_frame(runs_of(only_bad), chain)
    kq = att.filter(pl.col("factor") == "vllm-marlin/vllm-fp16").row(0, named=True)
    assert kq["value"] is None and "vllm-marlin: no clean run (run1: short_measurement)" in kq["note"]
    assert att.filter(pl.col("factor") == "vllm-fp16/hf-fp16")["value"].item() == pytest.approx(200.0 / gm_hf)
    assert att.filter(pl.col("factor") == "total")["value"].item() is None


def test_corrupt_or_truncated_results_are_refused(result_files, tmp_path):
    text = result_files[0].read_text()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: len(text) // 2])
    with pytest.raises(ResultError, match="truncated.json is corrupt or truncated"):
        aggregate.build_frames(result_files + [truncated], {})
    alien = tmp_path / "alien.json"
    alien.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ResultError, match="not a speedsplit result"):
        aggregate.build_frames([alien], {})


def test_results_of_different_machines_are_never_pooled(result_files, tmp_path, capsys):
    from speedsplit.core.facts import Gpu

    other = fake_result("vllm-fp16", 8, 3, 500.0)
    other.provenance.hardware.gpus = [Gpu(index="0", name="NVIDIA H200", driver="580", memory="143771 MiB")]
    failed_elsewhere = fake_result("vllm-fp16", 8, 4, None, status="startup_failed")
    failed_elsewhere.provenance.hardware.gpus = other.provenance.hardware.gpus
    # a failed run measured nothing: it pools nothing
    aggregate.build_frames(result_files + [write_result(tmp_path / "f.json", failed_elsewhere)], {})
    with pytest.raises(T.MixedHardware, match=r"2 kinds of hardware \(CPU: Test CPU; NVIDIA H200\)"):
        aggregate.build_frames(result_files + [write_result(tmp_path / "h200.json", other)], {})
    gathered = tmp_path / "gathered"
    for i, path in enumerate(result_files + [tmp_path / "h200.json"]):
        (gathered / f"bench/x/run{i}.json").parent.mkdir(parents=True, exist_ok=True)
        (gathered / f"bench/x/run{i}.json").write_bytes(Path(path).read_bytes())
    assert cli.main(["aggregate", "--results", str(gathered), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("speedsplit: results measured on 2 kinds of hardware")


def test_tables_round_trip_typed_and_read_as_people_read_them(result_files, tmp_path):
    frames = aggregate.build_frames(result_files, {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]})
    formats.write_frames(frames, tmp_path, markdown=("crossover",))
    for name, df in frames.items():
        back = formats.read_frame(tmp_path / f"{name}.parquet")
        assert back.schema == df.schema and back.equals(df)  # the types survive, nothing guessed
        assert pl.read_csv(tmp_path / f"{name}.csv").height == df.height
    assert frames["runs"].schema["flags"] == pl.List(pl.Utf8)
    assert frames["attribution"].schema["excluded"] == pl.List(pl.Utf8)
    md = (tmp_path / "crossover.md").read_text()
    assert md.startswith("| chain |") and "none in range" in md and "| 8-128 |" in md


def test_plots_and_report_render_offline(result_files, tmp_path):
    frames = aggregate.build_frames(result_files, {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]})
    svgs = {}
    for name, chart in aggregate.charts(frames, ["study"]).items():
        out = plots.save(chart, tmp_path / "plots" / name)
        assert out["png"].stat().st_size > 1000
        assert "<svg" in out["svg"].read_text()[:500]
        assert "https://cdn" not in out["html"].read_text()  # JavaScript inlined
        svgs[name] = out["svg"]
    assert set(svgs) == {
        "throughput",
        "latency",
        "tradeoff",
        "factors-study",
        "shares-study",
    }  # no request files: no timeline
    # every total within 5% of 1: no shares to draw, so no (empty) shares chart in the report
    flat_totals = frames["attribution"].with_columns(pl.lit(None, dtype=pl.Float64).alias("log_share"))
    assert "shares-study" not in aggregate.charts({**frames, "attribution": flat_totals}, ["study"])
    html = tmp_path / "report.html"
    report.build(
        html,
        config={"models": {"tiny": {}}},
        provenance=read_result(result_files[0]).provenance,
        frames=frames,
        svgs=svgs,
    )
    text = html.read_text()
    assert text.count("<svg") >= 4 and "startup_failed" in text and "Test CPU" in text
