"""Result files -> tables -> plots -> report: which tables are written and how, the attribution
of a chain of known speeds, failed and implausible runs, and what bad input is refused with."""

import json
import math

import polars as pl
import pytest
from conftest import REPO
from records import fake_result, write_result

from speedsplit.analysis.frames import MixedHardware
from speedsplit.core.errors import ConfigError
from speedsplit.core.formats import write_frames
from speedsplit.core.record import ResultError
from speedsplit.output import aggregate, analyses
from speedsplit.planning import config as cfgmod

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
# Each stack's output tok/s in runs 0 and 1: geometric means 200, 800, 2400 (factors 4 and 3).
SPEEDS = {"hf-fp16": (100.0, 400.0), "vllm-fp16": (400.0, 1600.0), "vllm-marlin": (1200.0, 4800.0)}
CORE = ["answer", "attribution", "calibration", "cells", "crossover", "mechanism", "runs", "stability", "timeline"]
# The analyses whose tables come without a config (each says "none" in its own way).
UNASKED = ["energy", "packing", "quantization", "scaling", "topologies"]
PLOTS = ["factors-study", "latency", "shares-study", "throughput", "tradeoff", "waterfall"]


def write_runs(root, speeds=SPEEDS, failed=(), edit=None):
    """Each stack's runs as result files under root/bench (`failed` stacks' as server errors);
    edit(stack, run, result) may change a result before it is written."""
    paths = []
    for stack, rates in speeds.items():
        for run, rate in enumerate(rates):
            ok = stack not in failed
            res = fake_result(stack, 8, run, rate if ok else None, status="ok" if ok else "server_error")
            if edit:
                edit(stack, run, res)
            paths.append(write_result(root / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run{run}.json", res))
    return paths


def by_factor(frame: pl.DataFrame) -> dict[str, dict]:
    return {r["factor"]: r for r in frame.iter_rows(named=True)}


def test_each_frame_is_written_as_parquet_and_csv_and_the_attribution_also_as_markdown(tmp_path):
    paths = write_runs(tmp_path)
    aggregate.write_tables(paths, tmp_path / "tables", chains=CHAINS)
    names = sorted(CORE + UNASKED)
    written = sorted(p.name for p in (tmp_path / "tables").iterdir())  # no temp file left beside them
    assert written == sorted([f"{n}.parquet" for n in names] + [f"{n}.csv" for n in names] + ["attribution.md"])
    built = aggregate.build_frames(paths, CHAINS)
    read = aggregate.read_tables(tmp_path / "tables")
    assert sorted(read) == names
    for name in names:  # parquet keeps each frame whole, with its types
        assert read[name].equals(built[name]), name
    assert pl.read_csv(tmp_path / "tables/runs.csv")["output_tok_s"].to_list() == [
        100.0, 400.0, 400.0, 1600.0, 1200.0, 4800.0,
    ]  # fmt: skip
    md = (tmp_path / "tables/attribution.md").read_text().splitlines()
    assert len(md) == 2 + 3 and "| study | 1 | vllm-fp16/hf-fp16 | 4 | 4 |" in md[2]


def test_a_three_stack_chain_factors_are_the_ratios_of_geometric_means_and_multiply_to_the_total(tmp_path):
    frames = aggregate.build_frames(write_runs(tmp_path), CHAINS)
    rows = by_factor(frames["attribution"])
    assert list(rows) == ["vllm-fp16/hf-fp16", "vllm-marlin/vllm-fp16", "total"]
    first, second, total = rows["vllm-fp16/hf-fp16"], rows["vllm-marlin/vllm-fp16"], rows["total"]
    assert first["value"] == pytest.approx(4.0, rel=1e-12) and second["value"] == pytest.approx(3.0, rel=1e-12)
    assert total["value"] == pytest.approx(12.0, rel=1e-12)
    assert first["value"] * second["value"] == pytest.approx(total["value"], rel=1e-14)
    assert first["log_share"] == pytest.approx(math.log(4) / math.log(12), rel=1e-12)
    assert second["log_share"] == pytest.approx(math.log(3) / math.log(12), rel=1e-12)
    assert total["log_share"] == 1.0 and [r["position"] for r in rows.values()] == [1, 2, 0]
    assert [r["runs_used"] for r in rows.values()] == [4, 4, 6] and {r["note"] for r in rows.values()} == {""}
    assert all(r["value"] == r["raw_value"] for r in rows.values())  # no client calibration to take out
    cells = dict(frames["cells"].select("stack", "output_tok_s").iter_rows())
    assert cells == pytest.approx({"hf-fp16": 200.0, "vllm-fp16": 800.0, "vllm-marlin": 2400.0}, rel=1e-12)


def test_a_stack_whose_runs_all_failed_leaves_its_factors_and_the_total_undefined_with_the_cause(tmp_path):
    paths = write_runs(tmp_path, failed=("vllm-marlin",))
    aggregate.write_tables(paths, tmp_path / "tables", chains=CHAINS)
    tables = aggregate.read_tables(tmp_path / "tables")
    failed = tables["runs"].filter(pl.col("stack") == "vllm-marlin")
    assert failed.select("run", "status", "output_tok_s", "error").rows() == [
        (0, "server_error", None, "the server server_error"),
        (1, "server_error", None, "the server server_error"),
    ]
    rows = by_factor(tables["attribution"])
    why = "vllm-marlin: no clean run (run0: server_error, run1: server_error)"
    assert {r["note"] for r in rows.values()} == {f"a stack of the chain has no clean run; {why}"}
    assert rows["vllm-fp16/hf-fp16"]["value"] == pytest.approx(4.0, rel=1e-12)  # its two stacks measured
    assert rows["vllm-marlin/vllm-fp16"]["value"] is None and rows["total"]["value"] is None
    out = ["vllm-marlin run0: server_error", "vllm-marlin run1: server_error"]
    assert rows["total"]["excluded"] == out and rows["total"]["runs_excluded"] == 2
    csv = pl.read_csv(tmp_path / "tables/attribution.csv")
    assert csv.filter(pl.col("factor") == "total")["excluded"].to_list() == ["; ".join(out)]
    cells = tables["cells"].filter(pl.col("stack") == "vllm-marlin")
    assert cells.select("output_tok_s", "values_from").rows() == [(None, "flagged runs (none clean)")]
    assert tables["answer"]["sentence"][0].endswith(
        f"measured; no total (a stack of the chain has no clean run; {why})."
    )


def test_an_implausible_result_is_said_on_stderr_flagged_and_counts_in_no_factor(tmp_path, capsys):
    def edit(stack, run, res):
        if (stack, run) == ("hf-fp16", 1):
            res.summary.output_tokens = 10  # 400 tok/s over 2 s cannot count 10 tokens

    paths = write_runs(tmp_path, edit=edit)
    frames = aggregate.build_frames(paths, CHAINS)
    assert capsys.readouterr().err == (
        f"speedsplit: {paths[1]}: implausible, in no factor: 400 tokens/s over 2 s is 800 tokens, not the 10 counted\n"
    )
    assert frames["runs"].filter(pl.col("flags").list.len() > 0)[["stack", "run"]].rows() == [("hf-fp16", 1)]
    assert frames["runs"]["flags"][1].to_list() == ["implausible"]
    rows = by_factor(frames["attribution"])  # hf-fp16 from run 0 alone: 100 tok/s
    assert rows["vllm-fp16/hf-fp16"]["value"] == pytest.approx(8.0, rel=1e-12)
    assert rows["total"]["value"] == pytest.approx(24.0, rel=1e-12)
    assert rows["total"]["excluded"] == ["hf-fp16 run1: implausible"]


def test_a_truncated_result_is_refused_and_the_tables_written_before_stay_as_they_were(tmp_path):
    paths = write_runs(tmp_path)
    aggregate.write_tables(paths, tmp_path / "tables", chains=CHAINS)
    before = {p.name: p.read_bytes() for p in (tmp_path / "tables").iterdir()}
    paths[3].write_text(paths[3].read_text()[:200])  # a copy cut short
    with pytest.raises(ResultError, match=rf"^result file {paths[3]} is corrupt or truncated \(Unterminated string"):
        aggregate.write_tables(paths, tmp_path / "tables", chains=CHAINS)
    assert {p.name: p.read_bytes() for p in (tmp_path / "tables").iterdir()} == before


def test_results_measured_on_two_kinds_of_hardware_are_refused(tmp_path):
    def edit(stack, run, res):
        if stack == "vllm-marlin":
            res.provenance.hardware.host_cpu = "Other CPU"

    with pytest.raises(MixedHardware) as err:
        aggregate.build_frames(write_runs(tmp_path, edit=edit), CHAINS)
    assert str(err.value) == (
        "results measured on 2 kinds of hardware (CPU: Other CPU; CPU: Test CPU) would pool into one median: "
        "aggregate each apart (speedsplit aggregate --results DIR per machine)"
    )


def test_the_bandwidth_file_gives_each_cell_its_bandwidth_and_a_missing_file_none(tmp_path):
    (tmp_path / "bandwidth.json").write_text(json.dumps({"gb_s_median": 50.0, "gb_s_best": 60.0}))
    assert aggregate.bandwidth_gb_s(tmp_path / "bandwidth.json") == 50.0
    assert aggregate.bandwidth_gb_s(tmp_path / "absent.json") is None and aggregate.bandwidth_gb_s(None) is None
    frames = aggregate.build_frames(write_runs(tmp_path), CHAINS, bandwidth_json=tmp_path / "bandwidth.json")
    assert frames["cells"]["bandwidth_gb_s"].to_list() == [50.0, 50.0, 50.0]


def test_tables_written_again_without_an_analysis_keep_none_of_its_old_tables(tmp_path):
    paths = write_runs(tmp_path)
    config = cfgmod.load(REPO / "config/config.yaml")  # its quality analysis on
    aggregate.write_tables(paths, tmp_path / "tables", **analyses.analysis_spec(config))
    assert "quality" in aggregate.read_tables(tmp_path / "tables")
    aggregate.write_tables(paths, tmp_path / "tables", chains=CHAINS)
    assert sorted(aggregate.read_tables(tmp_path / "tables")) == sorted(CORE + UNASKED)


def with_chains(chains: dict, **sections):
    """The default config with exactly these chains (and these sections merged over it), validated."""
    return cfgmod.validate(cfgmod.merge({**cfgmod.read_yaml(cfgmod.DEFAULT_CONFIG), "chains": chains}, sections))


def test_a_config_is_told_which_chains_the_results_leave_undecomposed_or_refused_when_it_names_none():
    config = with_chains({**CHAINS, "references": ["hf-generate", "hf-generate-b64"]})
    assert aggregate.config_meets_results(config, {"hf-fp16", "vllm-fp16", "vllm-marlin"}) == [
        "chains with no stack measured here, not in the tables: references"
    ]
    assert aggregate.config_meets_results(config, {"vllm-fp16", "hf-fp16"}) == [
        "chain study: no results of vllm-marlin; its factors through them are undefined",
        "chains with no stack measured here, not in the tables: references",
    ]
    with pytest.raises(ConfigError) as err:
        aggregate.config_meets_results(config, {"mine-b", "mine-a"})
    assert str(err.value) == (
        "the config's chains (study, references) name none of the stacks these results hold (mine-a, mine-b): "
        "give the config they were measured with (--configfile)"
    )
    # no chain benchmarks every stack unless told: on a CPU the offload stacks would be refused
    no_chain = with_chains({}, benchmark={"stacks": CHAINS["study"]})
    assert aggregate.config_meets_results(no_chain, {"mine-a"}) == []


def test_folders_without_result_files_stop_the_aggregation_naming_each_bench_folder(tmp_path):
    config = cfgmod.load(REPO / "config/config.yaml")
    with pytest.raises(SystemExit) as err:
        aggregate.aggregate_folders(config, [tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert str(err.value) == f"speedsplit: no result files under {tmp_path}/a/bench, {tmp_path}/b/bench"
    assert not (tmp_path / "out").exists()


def test_several_results_folders_make_one_set_of_tables_plots_replaced_whole_and_a_report(tmp_path, capsys):
    config = cfgmod.load(REPO / "config/config.yaml")
    write_runs(tmp_path / "a", {s: SPEEDS[s] for s in ("hf-fp16", "vllm-fp16")})
    write_runs(tmp_path / "b", {"vllm-marlin": SPEEDS["vllm-marlin"]})
    (tmp_path / "b/hardware").mkdir()
    (tmp_path / "b/hardware/bandwidth.json").write_text(json.dumps({"gb_s_median": 50.0}))
    (tmp_path / "out/plots").mkdir(parents=True)
    (tmp_path / "out/plots/stale.svg").write_text("<svg/>")
    report = aggregate.aggregate_folders(config, [tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert report == tmp_path / "out/report.html" and "vllm-marlin/vllm-fp16" in report.read_text()
    assert "speedsplit:" not in capsys.readouterr().err  # every stack of the chain measured, none implausible
    tables = aggregate.read_tables(tmp_path / "out/tables")
    assert sorted(tables) == sorted(analyses.table_names(config))
    assert tables["runs"]["stack"].to_list() == ["hf-fp16"] * 2 + ["vllm-fp16"] * 2 + ["vllm-marlin"] * 2
    assert tables["cells"]["bandwidth_gb_s"].to_list() == [50.0, 50.0, 50.0]  # from the second folder
    assert by_factor(tables["attribution"])["total"]["value"] == pytest.approx(12.0, rel=1e-12)
    plots = sorted(p.name for p in (tmp_path / "out/plots").iterdir())
    assert plots == sorted(f"{n}.{ext}" for n in PLOTS for ext in ("html", "png", "svg"))


def test_an_evidence_folder_rebuilds_its_committed_attribution_from_its_raw_results(tmp_path):
    folder = REPO / "docs/evidence/h100-2026-12-07-lmcache"
    frames, config = aggregate.evidence_frames(folder)
    assert config.chains == {
        "study": ["vllm-fp16", "vllm-fp16-offload"],
        "kernel": ["vllm-fp16", "vllm-fp16-lmcache"],
    }
    assert set(analyses.table_names(config)) <= set(frames)
    assert frames["runs"].height == 12 and frames["cells"]["bandwidth_gb_s"].unique().to_list() == [3017.9598495714126]
    write_frames({"attribution": frames["attribution"]}, tmp_path, parquet=False)
    assert (tmp_path / "attribution.csv").read_text() == (folder / "tables/attribution.csv").read_text()
    rows = {(r["chain"], r["factor"]): r["value"] for r in frames["attribution"].iter_rows(named=True)}
    assert rows[("study", "vllm-fp16-offload/vllm-fp16")] == 1.0527978743902426
    assert rows[("kernel", "vllm-fp16-lmcache/vllm-fp16")] == 0.7427530756091194
