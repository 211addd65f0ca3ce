"""The capacity sweep: ladder levels as cells, the stop rule past the cliff, and the table of
sustainable users against a reference stack."""

import copy
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO, run_snakemake, snakemake_bin
from records import cell_spec, fake_result, write_result

from speedsplit.core.record import Slo, read_result
from speedsplit.measuring.bench import capacity_skip
from speedsplit.output import aggregate
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning import plan as P


def level(stack, users, met=True, status="ok", why=(), arrival=None):
    res = fake_result(stack, users, 0, 100.0 if status == "ok" else None, status=status, arrival=arrival)
    if status == "ok":
        res.slo = Slo(ttft_p99_s=2.0, tpot_p99_s=0.1, met=met, violations=list(why), good_requests=4, goodput_rps=2.0)
    return res


def write_levels(root, stack, verdicts):
    for users, (met, status, why) in verdicts.items():
        write_result(root / f"u{users}-wide-greedy" / "run0.json", level(stack, users, met, status, why))


def cell(below, stop_after=2):
    return cell_spec(capacity_below=[f"u{u}-wide-greedy" for u in below], capacity_stop_after=stop_after)


def test_a_level_above_two_failing_ones_is_skipped_with_their_reasons(tmp_path):
    write_levels(
        tmp_path,
        "vllm-fp16",
        {
            16: (True, "ok", ()),
            32: (False, "ok", ("p99 TTFT 3 s > 2 s",)),
            64: (True, "server_died", ()),
        },
    )
    out = tmp_path / "u96-wide-greedy" / "run0.json"
    why = capacity_skip(out, 0, cell([16, 32, 64]))
    assert why == "the 2 levels below failed (u32-wide-greedy: p99 TTFT 3 s > 2 s | u64-wide-greedy: server_died)"
    assert capacity_skip(out, 0, cell([16, 32, 64], stop_after=3)) is None  # u16 passed
    assert capacity_skip(out, 1, cell([16, 32, 64])) is None  # run 1 of the levels below not measured: measure
    assert capacity_skip(out, 0, cell([16])) is None and capacity_skip(out, 0, cell_spec()) is None
    # a skipped level counts as failing: everything above the cliff is skipped
    write_result(tmp_path / "u96-wide-greedy" / "run0.json", level("vllm-fp16", 96, status="skipped"))
    assert "u96-wide-greedy: skipped" in capacity_skip(
        tmp_path / "u128-wide-greedy/run0.json", 0, cell([16, 32, 64, 96])
    )


def test_the_table_gives_sustainable_users_the_first_failure_and_the_ratio(tmp_path):
    paths = []
    verdicts = {
        "vllm-fp16": {16: (True, "ok", ()), 32: (True, "ok", ()), 64: (False, "ok", ("p99 TPOT 120 ms > 100 ms",))},
        "vllm-marlin": {16: (True, "ok", ()), 32: (True, "ok", ()), 64: (True, "ok", ())},
    }
    verdicts["vllm-fp16"][96] = (True, "skipped", ())
    for stack, levels in verdicts.items():
        for users, (met, status, why) in levels.items():
            paths.append(write_result(tmp_path / f"{stack}-{users}.json", level(stack, users, met, status, why)))
    spec = {"workload": "wide", "sampling": "greedy", "users": [16, 32, 64, 96], "reference": "vllm-fp16"}
    cap = {
        r["stack"]: r
        for r in aggregate.build_frames(paths, {}, specs={"capacity": spec})["capacity"].iter_rows(named=True)
    }
    fp16, marlin = cap["vllm-fp16"], cap["vllm-marlin"]
    assert fp16["sustainable_users"] == 32 and fp16["first_failing_users"] == 64
    assert fp16["first_failing_why"] == "p99 TPOT 120 ms > 100 ms" and fp16["skipped_users"] == [96]
    assert fp16["levels"] == ["16: pass", "32: pass", "64: p99 TPOT 120 ms > 100 ms", "96: skipped"]
    assert marlin["sustainable_users"] == 64 and marlin["first_failing_users"] is None
    assert marlin["vs_reference"] == pytest.approx(2.0) and fp16["vs_reference"] == pytest.approx(1.0)


def test_a_level_whose_run_measured_another_kernel_or_platform_fails(tmp_path):
    """A run flagged kernel_mismatch or platform_mismatch met its objectives on something other
    than the stack asked for: its level fails, for the stop rule and the table alike."""
    paths = []
    for users, flags in {16: [], 32: ["kernel_mismatch"], 64: ["platform_mismatch"], 96: ["short_measurement"]}.items():
        res = level("vllm-marlin", users)
        res.flags = flags
        paths.append(write_result(tmp_path / f"u{users}-wide-greedy" / "run0.json", res))
    why = capacity_skip(tmp_path / "u128-wide-greedy" / "run0.json", 0, cell([16, 32, 64]))
    assert why == (
        "the 2 levels below failed (u32-wide-greedy: flagged kernel_mismatch | u64-wide-greedy: flagged platform_mismatch)"
    )
    spec = {"workload": "wide", "sampling": "greedy", "users": [16, 32, 64, 96], "reference": "vllm-marlin"}
    (row,) = aggregate.build_frames(paths, {}, specs={"capacity": spec})["capacity"].iter_rows(named=True)
    assert row["passing_users"] == [16, 96] and row["failing_users"] == [32, 64]
    assert row["first_failing_why"] == "flagged kernel_mismatch"


def test_ladder_levels_are_cells_of_the_sweeping_stacks_run_zero_only():
    given = C.read_yaml(REPO / "config" / "config.yaml")
    given["capacity"] = {"enabled": True, "users": [8, 2, 16], "stacks": ["vllm-fp16", "vllm-marlin"]}
    cfg = C.validate(given)
    levels = [c for c in G.cells(cfg) if c.below or c.users == 16]
    # u2 and u8 wide are grid cells already; u16 is new, above both
    assert [(c.name, c.below, c.runs) for c in levels] == [("u16-wide-greedy", ("u2-wide-greedy", "u8-wide-greedy"), 1)]
    jobs = [j for j in P.bench_jobs(cfg) if j.cell == "u16-wide-greedy"]
    assert {(j.stack, j.run) for j in jobs} == {("vllm-fp16", 0), ("vllm-marlin", 0)}
    params = G.cell_params(cfg, levels[0])
    assert params["capacity_below"] == ["u2-wide-greedy", "u8-wide-greedy"] and params["capacity_stop_after"] == 2
    assert G.capacity_spec(cfg)["reference"] == "vllm-fp16"
    given["capacity"]["stacks"] = ["vllm-fp17"]
    with pytest.raises(ConfigError, match=r"capacity.stacks\[0\]: unknown stack 'vllm-fp17'"):
        C.validate(given)


@pytest.mark.slow
@pytest.mark.serial  # its levels pass or fail on p99 TTFT: a second worker's load would move the cliff
def test_a_kv_budget_makes_a_real_cliff(tmp_path):
    """vLLM's CPU build with room for 8 requests in its KV cache (tests/config/cliff.yaml): the
    sweep finds the cliff at 16 users, where the server's own counters show the cache full and
    requests waiting, and skips the level above it. (An interrupted sweep's resume:
    test_an_interrupted_sweep_resumes_keeping_the_levels_it_measured, on the reference server.)"""
    shutil.copy(REPO / "tests/config/cliff.yaml", tmp_path / "cliff.yaml")
    out = run_snakemake(["--configfile", "cliff.yaml", "--cores", "2", "--resources", "gpu=1"], tmp_path, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    level = tmp_path / "results/bench/tiny/vllm-8-blocks/tp1/{}-cliff-greedy/run0.json"
    cap = pl.read_parquet(tmp_path / "results/tables/capacity.parquet").row(0, named=True)
    assert (cap["sustainable_users"], cap["first_failing_users"]) == (8, 16), cap["levels"]
    assert cap["first_failing_why"].startswith("p99 TTFT"), cap
    assert (cap["passing_users"], cap["failing_users"], cap["skipped_users"]) == ([4, 8], [16], [32])
    # why: the cache the engine reported (9 x 512 tokens) was full and requests queued for it
    assert cap["kv_cache_tokens"] == 9 * 512
    assert cap["kv_cache_peak_at_cliff"] > 0.99 and cap["waiting_mean_at_cliff"] > 0
    skipped = read_result(Path(str(level).format("u32")))
    assert skipped.status == "skipped" and "u16-cliff-greedy" in skipped.error.message
    # a CPU has no card: the cap asked for is recorded as not applied, never silently dropped
    eight = read_result(Path(str(level).format("u8")))
    assert eight.server.memory_cap.card_memory_gib == 1 and not eight.server.memory_cap.applied
    assert "not on a CUDA card" in eight.server.memory_cap.reason
    assert (tmp_path / "results/plots/capacity.svg").exists() and (tmp_path / "results/plots/server.svg").exists()


# The cliff's sweep on the reference server: 8 requests at a time (--max-concurrency 8), each
# 1.37 s long (a 20 ms first token, 3 ms a token after it), so from 16 users on half of them
# wait a whole request for their first token, far past the 0.5 s objective, on any machine.
REFERENCE_CLIFF = {
    "stacks": {
        "ref-8-slots": {
            "args": ["{python}", "-m", "speedsplit.serving.reference", "--model", "{model_dir}",
                     "--served-model-name", "{served_name}", "--host", "{host}", "--port", "{port}",
                     "--ttft-s", "0.02", "--itl-s", "0.003", "--max-concurrency", "8"],
            "startup_timeout_s": 60,
        }
    },
    "benchmark": {"stacks": ["ref-8-slots"]},
    "capacity": {"stacks": ["ref-8-slots"], "reference": "ref-8-slots"},
    "card_memory_gib": None,
}  # fmt: skip


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_keeping_the_levels_it_measured(tmp_path):
    """Ctrl-C after the first level, then a rerun keeps that level and finds the cliff at 16
    users (the sweep of tests/config/cliff.yaml, on the reference server)."""
    import yaml

    config = C.merge(yaml.safe_load((REPO / "tests/config/cliff.yaml").read_text()), REFERENCE_CLIFF)
    (tmp_path / "cliff.yaml").write_text(yaml.safe_dump(config))
    args = ["--configfile", "cliff.yaml", "--cores", "2", "--resources", "gpu=1"]
    cmd = [snakemake_bin(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)
    level = tmp_path / "results/bench/tiny/ref-8-slots/tp1/{}-cliff-greedy/run0.json"
    deadline = time.monotonic() + 600
    next_log = tmp_path / "results/logs/bench/tiny/ref-8-slots/tp1/u8-cliff-greedy/run0.log"
    while not next_log.exists():  # the first level's job is done, the next one under way
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    first = Path(str(level).format("u4"))
    assert first.exists()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    kept = first.read_bytes()
    assert not Path(str(level).format("u32")).exists()  # interrupted before the sweep's end

    out = run_snakemake(args, tmp_path, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert first.read_bytes() == kept  # the level measured before Ctrl-C was not measured again
    cap = pl.read_parquet(tmp_path / "results/tables/capacity.parquet").row(0, named=True)
    assert (cap["passing_users"], cap["failing_users"], cap["skipped_users"]) == ([4, 8], [16], [32]), cap["levels"]
    assert cap["first_failing_why"].startswith("p99 TTFT"), cap


def test_an_open_loop_workload_sweeps_a_ladder_of_rates(tmp_path):
    """Levels are request rates (cells r{rate}-...), judged like users; the table gives the
    sustainable rate and its ratio to the reference."""
    given = C.read_yaml(REPO / "config" / "config.yaml")
    given["workloads"]["mix"] = {"prompt_tokens": 16, "output_tokens": 8, "arrival": {"rates": [1], "requests": 4}}
    given["grid"]["cells"] = [{"users": 1, "workload": "mix", "sampling": "greedy"}]
    given["capacity"] = {"enabled": True, "workload": "mix", "stacks": ["vllm-fp16"]}
    with pytest.raises(ConfigError, match=r"^config error at capacity.rates: an open-loop capacity workload needs"):
        C.validate(copy.deepcopy(given))
    given["capacity"]["rates"] = [4, 1, 2]
    cfg = C.validate(given)
    levels = [(c.name, c.below) for c in G.cells(cfg) if c.below or c.rate == 4]
    assert levels == [
        ("r2-mix-greedy", ("r1-mix-greedy",)),
        ("r4-mix-greedy", ("r1-mix-greedy", "r2-mix-greedy")),
    ]
    assert G.cell_params(cfg, G.cell_by_name(cfg, "r4-mix-greedy"))["arrival"]["rate_rps"] == 4.0

    paths = []
    for stack, verdicts in {"vllm-fp16": (True, True, False), "vllm-marlin": (True, True, True)}.items():
        for rate, met in zip((1, 2, 4), verdicts):
            arrival = {"pattern": "poisson", "rate_rps": float(rate)}
            res = level(stack, 0, met, why=() if met else ("p99 TTFT 3 s > 2 s",), arrival=arrival)
            res.cell = res.job.cell.name = f"r{rate}-mix-greedy"
            res.job.cell.workload = "mix"
            paths.append(write_result(tmp_path / f"{stack}-{rate}.json", res))
    spec = {"workload": "mix", "sampling": "greedy", "rates": [1, 2, 4], "reference": "vllm-fp16"}
    frames = aggregate.build_frames(paths, {}, specs={"capacity": spec})
    cap = {r["stack"]: r for r in frames["capacity"].iter_rows(named=True)}
    fp16, marlin = cap["vllm-fp16"], cap["vllm-marlin"]
    assert fp16["sustainable_rps"] == 2.0 and fp16["first_failing_rps"] == 4.0 and fp16["sustainable_users"] is None
    assert fp16["levels"] == ["1 rps: pass", "2 rps: pass", "4 rps: p99 TTFT 3 s > 2 s"]
    assert marlin["sustainable_rps"] == 4.0 and marlin["vs_reference"] == pytest.approx(2.0)
    from speedsplit.output.analyses.capacity import charts

    assert "capacity" in charts(frames)  # drawn against the rate


def test_a_trace_cannot_be_the_capacity_workload():
    cfg = C.read_yaml(REPO / "config" / "config.yaml")
    trace = {"path": str(REPO / "tests/data/mooncake-conversation-excerpt.jsonl"), "requests": 4, "speedups": [1]}
    cfg["workloads"]["replay"] = {"trace": trace}
    cfg["capacity"] = {"enabled": True, "workload": "replay", "rates": [1]}
    with pytest.raises(ConfigError, match=r"^config error at capacity.workload: a trace workload sets its own load"):
        C.validate(cfg)
