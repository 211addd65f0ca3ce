"""How long a grid will take: measured rates first, then the roofline, then the configured rate;
server starts on a session's first job only; lanes side by side."""

import pytest
from conftest import REPO
from records import fake_result, write_result

from speedsplit import cli
from speedsplit.models.checkpoint import shape_config
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning import estimate as E
from speedsplit.planning import plan, roofline
from speedsplit.planning.experiment import Experiment


def given(*paths, top: dict | None = None) -> dict:
    """What C.load(*paths) validates (the files merged over the default config), `top` over it."""
    data = C.read_yaml(C.DEFAULT_CONFIG)
    for path in paths:
        data = C.merge(data, C.read_yaml(path))
    return C.merge(data, top or {})


def ci_with(top: dict | None = None) -> Experiment:
    """tests/config/ci.yaml on the CPU, `top` merged over it."""
    return C.validate(given(REPO / "tests/config/ci.yaml", top=C.merge({"platform": "cpu"}, top or {})))


def smoke_with(top: dict) -> Experiment:
    """config/h200-smoke.yaml, `top` merged over it."""
    return C.validate(given(REPO / "config/h200-smoke.yaml", top=top))


@pytest.fixture
def ci():
    return ci_with()


def tokens(cfg, cell_name):
    c = G.cell_params(cfg, G.cell_by_name(cfg, cell_name))
    return c["users"] * (c["requests_per_user"] + c["warmup_requests"]) * c["output_tokens"]


def test_without_results_every_job_runs_at_the_configured_rate_and_each_session_starts_once(ci, tmp_path):
    est = E.job_estimates(ci, results=str(tmp_path / "none/*.json"))
    assert [e.job for e in est] == plan.bench_jobs(ci)
    for e in est:
        assert e.source == "configured" and e.rate_tok_s == 20
        assert e.load_s == pytest.approx(tokens(ci, e.job.cell) / 20 + 5)  # the load, and the job's overhead
    starts = [e for e in est if e.start_s]
    assert [e.job.stack for e in starts] == list(dict.fromkeys(e.job.stack for e in est))  # one per session
    assert all(e.start_s == 90 for e in starts)
    assert E.grid_seconds(est) == pytest.approx(sum(e.total_s for e in est))  # one lane on a CPU


def test_a_closed_loop_job_lasts_its_users_ramp_and_thinking_too(ci, tmp_path):
    """Not served, yet in the job's time: the last user joins (users - 1) / users of the ramp late
    and thinks think_s between its requests (core/loads.ClosedLoopSettings.waiting_s)."""
    plain = E.job_estimates(ci, results=str(tmp_path / "none/*.json"))
    cfg = ci_with({"workloads": {w: {"ramp_s": 2, "think_s": 3} for w in ci.workloads}})
    est = E.job_estimates(cfg, results=str(tmp_path / "none/*.json"))
    for a, b in zip(plain, est):
        c = G.cell_params(cfg, G.cell_by_name(cfg, b.job.cell))
        waits = 2 * (c["users"] - 1) / c["users"] + 3 * (c["requests_per_user"] - 1)
        assert b.load_s == pytest.approx(a.load_s + waits), b.job


def test_measured_rates_and_start_ups_come_first(ci, tmp_path):
    from speedsplit.core.record import Timing

    for run, rate in ((0, 100.0), (1, 300.0)):
        res = fake_result("hf-fp16", 4, run, rate, workload="ci-wide")
        res.server.reused, res.server.lease_wait_s = run > 0, 2.0  # run 0 started the server (10 s)
        res.timing = Timing(job_start=0.0, job_end=40.0 + 10 * run)
        write_result(tmp_path / f"r{run}.json", res)
    failed = fake_result("hf-fp16", 2, 0, 0.0, status="server_died", workload="ci-narrow")
    write_result(tmp_path / "failed.json", failed)
    est = {(e.job.stack, e.job.cell, e.job.run): e for e in E.job_estimates(ci, results=str(tmp_path / "*.json"))}
    wide = est[("hf-fp16", "u4-ci-wide-greedy", 0)]
    assert wide.source == "measured" and wide.rate_tok_s == 200.0  # the median of the ok runs
    assert wide.start_s == 10.0  # the measured start-up of that stack's sessions
    assert wide.load_s == (40.0 - 12.0 + 50.0) / 2  # the jobs' median time beyond their server's start
    assert est[("hf-fp16", "u2-ci-narrow-greedy", 0)].source == "configured"  # a failed run says nothing
    assert est[("vllm-fp16", "u4-ci-wide-greedy", 0)].start_s == 90  # no result for that stack


def test_results_of_the_other_platform_are_not_used(ci, tmp_path):
    res = fake_result("hf-fp16", 4, 0, 500.0, workload="ci-wide")
    res.job.stack = res.job.stack.model_copy(update={"platform": "cuda"})
    write_result(tmp_path / "r.json", res)
    est = E.job_estimates(ci, results=str(tmp_path / "*.json"))
    assert {e.source for e in est} == {"configured"}


def test_the_roofline_on_cuda_reads_every_weight_once_per_decode_step(tmp_path):
    cfg = smoke_with({"estimate": {"bandwidth_gb_s": 4000.0}})
    est = {(e.job.stack, e.job.cell): e for e in E.job_estimates(cfg, results=str(tmp_path / "*.json"))}
    wide = est[("vllm-fp16", "u64-h200-wide-greedy")]
    step_s = roofline.decode_step_bytes(shape_config("llama-3.1-8b"), "fp16", 64, 512 + 256 / 2) / (4000e9 * 0.5)
    assert wide.source == "roofline" and wide.rate_tok_s == pytest.approx(64 / step_s)
    assert est[("vllm-marlin", "u64-h200-wide-greedy")].rate_tok_s > 1.5 * wide.rate_tok_s  # 4-bit weights


def test_lanes_run_side_by_side(tmp_path):
    cfg = smoke_with({"gpus_available": 2})
    est = E.job_estimates(cfg, results=str(tmp_path / "*.json"))
    lanes = {e.lane for e in est}
    assert lanes == {0, 1}
    per_lane = [sum(e.total_s for e in est if e.lane == lane) for lane in lanes]
    assert E.grid_seconds(est) == max(per_lane) < sum(per_lane)


def test_a_jobs_runtime_request_is_its_estimate_with_the_margin(ci, tmp_path):
    est = E.job_estimates(ci, results=str(tmp_path / "*.json"))
    long = max(est, key=lambda e: e.total_s)
    assert E.runtime_minutes(ci, long) == -(-long.total_s * 2.0 // 60)  # whole minutes, rounded up
    short = min(est, key=lambda e: e.total_s)
    floor = ci_with({"estimate": {"min_runtime_min": 30}})
    assert E.runtime_minutes(floor, short) == 30
    slow = ci_with({"estimate": {"output_tok_s": {"cpu": 0.01}, "margin": 1.5}})
    e = E.job_estimates(slow, results=str(tmp_path / "*.json"))[0]
    assert E.runtime_minutes(slow, e) == -(-e.total_s * 1.5 // 60) > 30


def test_the_command_prints_every_job_and_the_grid(capsys, tmp_path):
    assert (
        cli.main(["estimate", "--configfile", str(REPO / "tests/config/ci.yaml"), "--results", str(tmp_path / "x")])
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("tiny/") == len(plan.bench_jobs(C.load(REPO / "tests/config/ci.yaml")))
    assert "grid: " in out and "lane(s)" in out


def test_warming_up_only_at_a_sessions_start_counts_the_warm_up_once(ci, tmp_path):
    once = ci_with({"benchmark": {"warmup": "session_start"}})
    every = {e.job: e for e in E.job_estimates(ci, results=str(tmp_path / "none/*.json"))}
    for e in E.job_estimates(once, results=str(tmp_path / "none/*.json")):
        cell = G.cell_params(ci, G.cell_by_name(ci, e.job.cell))
        warm_up = cell["users"] * cell["warmup_requests"] * cell["output_tokens"] / 20
        saved = 0.0 if e.start_s else warm_up  # the session's first job still warms up
        assert e.load_s == pytest.approx(every[e.job].load_s - saved)


def test_the_estimate_is_told_the_platform_and_an_open_loop_job_lasts_its_arrivals(tmp_path, capsys):
    """A CPU login host prices a GPU grid with --platform cuda (the GPU's start-up and roofline,
    not the CPU's rate); an open-loop job takes as long as its schedule on any platform."""
    from speedsplit import cli

    args = ["estimate", "--configfile", str(REPO / "config/h200-traffic.yaml"), "--results", str(tmp_path)]
    minutes = {}
    for platform in ("cpu", "cuda"):
        assert cli.main(args + ["--platform", platform]) == 0
        out = capsys.readouterr().out
        job = next(line for line in out.splitlines() if "vllm-fp16/tp1/r4-mix-greedy/run1" in line)
        assert "30.0" in job.split() and job.split()[-1] == "schedule"  # 100 requests at 4/s + 5 s overhead
        minutes[platform] = float(out.split("about ")[1].split(" min")[0])
    assert minutes["cuda"] != minutes["cpu"]  # start-ups priced per platform


def test_a_vllm_session_after_one_that_filled_its_compile_cache_starts_warm(tmp_path):
    """Sessions of one vLLM stack that follow a finished start read the shared compile cache
    (estimate.startup_warm_s, or what warm results measured); HF has no such cache; two lanes
    starting the same stack at once both compile."""
    smoke = {"benchmark": {"server_reuse": "per_run"}}
    cfg = smoke_with(smoke)
    est = E.job_estimates(cfg, results=str(tmp_path / "*.json"))
    starts = [(e.job.stack, e.start_s) for e in est if e.start_s]
    for stack in ("vllm-fp16", "vllm-marlin"):
        assert [s for st, s in starts if st == stack] == [200, 70]  # run 0 compiles, run 1 reads it back
    assert [s for st, s in starts if st == "hf-fp16"] == [200, 200]
    two = E.job_estimates(smoke_with({**smoke, "gpus_available": 2}), results=str(tmp_path / "*.json"))
    first = [e for e in two if e.start_s and e.job.stack == "vllm-fp16" and e.job.run == 0]
    assert first and all(e.start_s == 200 for e in first)
    res = fake_result("vllm-fp16", 64, 0, 6000.0, workload="h200-wide")
    res.model, res.topology = "llama-3.1-8b", "tp1"
    res.job.stack = res.job.stack.model_copy(update={"platform": "cuda"})
    res.engine.compile_cache, res.server.startup_s = "warm", 64.0
    write_result(tmp_path / "warm.json", res)
    est = E.job_estimates(cfg, results=str(tmp_path / "*.json"))
    assert [e.start_s for e in est if e.start_s and e.job.stack == "vllm-fp16"] == [200, 64.0]


def test_a_model_is_estimated_at_its_own_shape(tmp_path, monkeypatch):
    """A local model at its folder's config.json (its `shape` is the tiny default, which said
    nothing of it); a hub model at its stated shape until downloaded, then at its own."""
    import json

    from speedsplit.planning.estimate import model_shape

    own = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/config.json").write_text(json.dumps(own))
    monkeypatch.chdir(tmp_path)
    config = Experiment.model_validate(  # typed, not validated: only the models' shapes are read
        {
            "models": {
                "mine": {"source": "local", "path": str(tmp_path / "mine")},
                "hubbed": {"source": "hub", "repo": "org/m", "shape": "mistral-7b"},
                "synth": {"source": "synthetic", "shape": "llama-3.1-8b"},
            }
        }
    )
    assert model_shape(config, "mine") == own
    assert model_shape(config, "hubbed") == shape_config("mistral-7b")
    assert model_shape(config, "synth") == shape_config("llama-3.1-8b")
    (tmp_path / "resources/models/hubbed/fp16").mkdir(parents=True)
    (tmp_path / "resources/models/hubbed/fp16/config.json").write_text(json.dumps(own))
    assert model_shape(config, "hubbed") == own
