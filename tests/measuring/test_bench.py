import pytest
from conftest import REPO, measure_alone
from records import cell_spec, stack_spec

from speedsplit.core.specs import CellParams
from speedsplit.measuring import bench, checks
from speedsplit.models.prompts import prompts_of
from speedsplit.probes import loadspec
from speedsplit.planning import config as C


from speedsplit.planning import grid as G


def test_prompts_differ_between_cells_and_runs_and_match_across_stacks(tiny_model):
    wide, narrow = cell_spec(cell="u8-wide-greedy"), cell_spec(cell="u2-narrow-greedy", users=2)
    seeds = {loadspec.prompt_seed(c, r) for c in (wide, narrow) for r in (0, 1)}
    assert len(seeds) == 4
    a = prompts_of(tiny_model, [32] * 8, loadspec.prompt_seed(wide, 0))
    b = prompts_of(tiny_model, [32] * 8, loadspec.prompt_seed(wide, 1))
    again = prompts_of(tiny_model, [32] * 8, loadspec.prompt_seed(wide, 0))
    assert a == again  # every stack of a chain gets the same prompts
    assert not set(a) & set(b) and len(set(a)) == 8


def test_a_length_mix_with_a_shared_prefix_opens_every_prompt_with_the_same_tokens(tiny_model):
    """shared_prefix_tokens: the first N tokens of every measured prompt are one system prompt
    (a shorter prompt is a cut of it), the rest each prompt's own; lengths stay exact."""
    from speedsplit.models.prompts import load_tokenizer

    cell = cell_spec(
        cell="r2-mix-greedy", users=0, prompt_tokens=24, output_tokens=4, requests_per_user=1,
        request_timeout_s=10.0, stall_timeout_s=10.0,
        arrival={"pattern": "poisson", "rate_rps": 2.0, "requests": 12},
        lengths={"kind": "lognormal", "prompt_spread": 0.6, "output_spread": 0.3, "shared_prefix_tokens": 16},
    )  # fmt: skip
    stack = stack_spec(max_model_len=256)
    load = loadspec.cell_load(["http://127.0.0.1:1"], "m", stack, cell, 0, tiny_model)
    tok = load_tokenizer(tiny_model)
    ids = [tok.encode(p, add_special_tokens=False) for p in load.prompts[1:]]  # after the warm-up
    assert [len(x) for x in ids] == [a.prompt_tokens for a in load.schedule]
    assert min(len(x) for x in ids) < 16 < max(len(x) for x in ids)  # the mix spans the prefix's length
    prefix = next(x for x in ids if len(x) >= 16)[:16]
    assert all(x[:16] == prefix[: len(x)] for x in ids)
    assert len({tuple(x[16:]) for x in ids if len(x) > 17}) == len([x for x in ids if len(x) > 17])  # own tails
    assert tok.encode(load.prompts[0], add_special_tokens=False)[:16] != prefix  # the warm-up is not it
    again = loadspec.cell_load(["http://127.0.0.1:1"], "m", stack, cell, 1, tiny_model)
    assert tok.encode(again.prompts[1], add_special_tokens=False)[:16] != prefix  # each run its own system prompt


def test_honesty_flags():
    from records import fake_result, with_wall

    from speedsplit.core.record import EngineFacts

    result = with_wall(fake_result("vllm-marlin", 8, 0, 100.0), 0.5)
    result.summary.failed, result.summary.wrong_output_length = 1, 2
    result.engine = EngineFacts(linear_kernel="MacheteLinearKernel")
    flags = checks.honesty_flags(result, stack_spec(expect_kernel="Marlin"), cell_spec(min_measured_s=1.0))
    assert flags == ["request_failures", "output_length_mismatch", "short_measurement", "kernel_mismatch"]
    assert result.kernel_ok is False
    ok = fake_result("vllm-marlin", 8, 0, 100.0)
    ok.engine = EngineFacts(linear_kernel="MarlinLinearKernel")
    assert checks.honesty_flags(ok, stack_spec(expect_kernel="Marlin"), cell_spec(min_measured_s=1.0)) == []
    assert ok.kernel_ok is True
    ok.summary.client_stall_s = 0.3  # the client's loop did not run for 0.3 s (core/awake.py)
    assert checks.honesty_flags(ok, stack_spec(expect_kernel="Marlin"), cell_spec(min_measured_s=1.0)) == [
        "client_stalled"
    ]


def _skipped_level(tmp_path, tiny_model, **kw):
    """A capacity level above two failing ones: measured without any server, so every
    failure below is the job's own."""
    from conftest import REPO
    from records import fake_result, write_result

    from speedsplit.core import procs
    from speedsplit.planning import config as C
    from speedsplit.core.specs import SessionPlan

    cfg = C.load(REPO / "config/config.yaml")
    stack = kw.pop("stack", None) or G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    cell = G.cell_params(cfg, G.cells(cfg)[0])
    cell.update(capacity_below=["u2-wide-greedy", "u4-wide-greedy"], capacity_stop_after=2, cell="u8-wide-greedy")
    cell = kw.pop("cell", cell)
    for users in (2, 4):
        write_result(
            tmp_path / f"u{users}-wide-greedy/run0.json", fake_result("vllm-fp16", users, 0, None, "server_died")
        )
    plan = SessionPlan(
        "t/vllm-fp16/tp1/run0", str(tmp_path / "s.log"), str(tmp_path / "c"), "other", 60.0, 60.0, 60.0, 60.0, 60.0
    )
    args = dict(
        job={"stack": stack, "cell": cell, "run": 0},
        run=0,
        session=plan,
        model_dir=tiny_model,
        tokenizer_dir=tiny_model,
        out_json=tmp_path / "u8-wide-greedy/run0.json",
        out_requests=tmp_path / "u8-wide-greedy/run0.requests.jsonl",
        owner=procs.me(),
    )
    return bench.measure(**{**args, **kw}), args["out_json"]


def test_a_plan_that_cannot_be_read_still_ends_in_a_result(tmp_path, tiny_model):
    from speedsplit.core.record import read_result
    from speedsplit.core.specs import session_of

    res, path = _skipped_level(tmp_path, tiny_model, session=lambda: session_of(tmp_path / "absent.json", "x"))
    assert res.status == "error" and res.error.type == "FileNotFoundError" and "absent.json" in res.error.message
    assert read_result(path).status == "error"


def test_a_result_its_own_type_refuses_is_written_as_an_error_result(tmp_path, tiny_model, monkeypatch):
    """A writer bug (here: the redaction mangles a value) fails the result's own check: the job
    still writes a small, valid error result instead of none (which would block its lane)."""
    from speedsplit.core import results
    from speedsplit.core.record import read_result

    monkeypatch.setattr(bench, "redact", lambda text, workdir=None: results.redact(text).replace('"skipped"', '"odd"'))
    res, path = _skipped_level(tmp_path, tiny_model)
    assert res.status == "error" and "writing the result failed" in res.error.message
    assert read_result(path).status == "error" and read_result(path).cell == "u8-wide-greedy"


def test_a_job_file_with_keys_of_another_version_is_an_error_result(tmp_path, tiny_model):
    """A job file of another version (a key the record type does not know): an error result
    naming the key, not a job that dies without one."""
    from conftest import REPO

    from speedsplit.core.record import read_result
    from speedsplit.planning import config as C

    cfg = C.load(REPO / "config/config.yaml")
    cell = {**G.cell_params(cfg, G.cells(cfg)[0]), "rate_rps": 3.0}
    res, path = _skipped_level(tmp_path, tiny_model, cell=cell)
    assert res.status == "error" and "rate_rps" in res.error.message and read_result(path).status == "error"
    stack = {**G.stack_params(cfg, "tiny", "vllm-fp16", "tp1"), "gpu_arch": "sm90"}
    res, path = _skipped_level(tmp_path / "stack", tiny_model, stack=stack)
    assert res.status == "error" and "stack: gpu_arch" in res.error.message
    assert read_result(path).job.stack.variant == "fp16"  # recorded without it


@pytest.mark.slow
def test_an_open_loop_cell_on_a_real_server(tiny_model, tmp_path):
    """Poisson arrivals with a lognormal length mix on the stock generate() server: every
    request sent when due with its own lengths, verified, and the run's rate recorded."""
    from speedsplit.core.requestlog import read_requests
    from speedsplit.core import traffic
    from speedsplit.core.record import read_result

    cfg = C.read_yaml(REPO / "config/config.yaml")
    mix = {
        "prompt_tokens": 24,
        "output_tokens": 6,
        "warmup_requests": 1,
        "arrival": {"pattern": "poisson", "rates": [4], "requests": 12},
        "lengths": {"kind": "lognormal", "prompt_spread": 0.5, "output_spread": 0.5},
    }
    cfg = C.validate(C.merge(cfg, {"workloads": {"mix": mix}, "grid": {"workloads": ["mix"]}}))
    stack = G.stack_params(cfg, "tiny", "hf-generate", "tp1")
    cell = G.cell_params(cfg, G.cell_by_name(cfg, "r4-mix-greedy"))
    cell.update(min_measured_s=0.0)
    res, _ = measure_alone(stack, cell, tiny_model, tmp_path, startup_timeout_s=300.0)
    assert res.status == "ok", res.error
    s = res.summary
    assert s.completed == 12 and s.wrong_output_length == 0 and s.wrong_prompt_length == 0
    seed = loadspec.prompt_seed(CellParams.model_validate(cell), 0)
    expected = traffic.schedule(cell["arrival"], cell["lengths"], 24, 6, seed, 1024)
    measured = sorted(
        (r for r in read_requests(tmp_path / "r.requests.jsonl") if r.phase == "measured"), key=lambda r: r.index
    )
    assert [(r.due, r.prompt_tokens, r.output_tokens) for r in measured] == [
        (round(a.due_s, 6), a.prompt_tokens, a.output_tokens) for a in expected
    ]
    assert len({r.prompt_tokens for r in measured}) > 3  # a mix, not one length
    assert s.offered_rps is not None and s.lag_s.p99 is not None
    assert ("client_lag" in res.flags) == (s.lag_s.p99 > 0.1)
    # the host's own speed, timed around the load (measuring/hostspeed.py), in the record as written
    written = read_result(tmp_path / "r.json").host_speed
    assert written == res.host_speed and written.before_ms > 0 and written.after_ms > 0


@pytest.mark.slow
def test_a_trace_window_on_vllm_reaches_its_prefix_cache(tiny_model, tmp_path):
    """A window of the Mooncake conversation trace, scaled to the tiny model: every request
    with the trace's lengths (scaled), and vLLM's prefix cache hits on the shared blocks."""

    cfg = C.read_yaml(REPO / "config/config.yaml")
    excerpt = str(REPO / "tests/data/mooncake-conversation-excerpt.jsonl")
    conv = {"warmup_requests": 1, "prompt_tokens": 16, "output_tokens": 4}
    conv["trace"] = {"path": excerpt, "requests": 24, "speedups": [8], "length_scale": 0.25, "over_context": "cap"}
    cfg = C.validate(C.merge(cfg, {"workloads": {"conv": conv}, "grid": {"workloads": ["conv"]}}))
    stack = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    cell = G.cell_params(cfg, G.cell_by_name(cfg, "x8-conv-greedy"))
    cell.update(min_measured_s=0.0, telemetry_s=0.1)
    res, _ = measure_alone(stack, cell, tiny_model, tmp_path)
    assert res.status == "ok", res.cause
    s = res.summary
    assert s.completed == 24 - s.trace_skipped and s.wrong_output_length == 0 and s.wrong_prompt_length == 0
    assert s.trace_capped is not None and s.offered_rps is not None
    hit = res.telemetry.server.prefix_cache_hit_rate if res.telemetry and res.telemetry.server else None
    assert hit is not None and hit > 0, res.telemetry
