import json
import subprocess

import pytest
import yaml
from conftest import REPO, snakemake_bin

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.grid import draft_models


def base() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def given(*paths, top: dict | None = None) -> dict:
    """What C.load(*paths) validates (the files merged over the default config), `top` over it."""
    data = C.read_yaml(C.DEFAULT_CONFIG)
    for path in paths:
        data = C.merge(data, C.read_yaml(path))
    return C.merge(data, top or {})


def test_default_and_study_configs_validate():
    for name in ("config.yaml", "study.yaml", "h200-smoke.yaml"):
        cfg = C.load(REPO / "config" / name)
        assert cfg.models and G.cells(cfg)


def test_defaults_are_filled():
    cfg = C.validate(
        {
            "models": {"m": {}},
            "stacks": {"s": {"args": ["x"]}},
            "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
            "sampling": {"greedy": {}},
        }
    )
    filled = cfg.filled()
    assert filled["models"]["m"]["shape"] == "tiny"
    assert filled["stacks"]["s"]["on_cpu"]["dtype"] == "bfloat16"
    assert filled["grid"]["workloads"] == ["w"] and filled["grid"]["runs"] == 3
    assert filled["topologies"] == {"tp1": {"tensor_parallel": 1, "instances": 1}}


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda c: c["models"]["tiny"].update(shap="tiny"), "config error at models.tiny: unknown key 'shap'"),
        (lambda c: c["grid"].update(users=[-3]), "config error at grid.users[0]: -3 is less than the minimum of 1"),
        (
            lambda c: c["chains"].update(study=["hf-fp16", "nope"]),
            "config error at chains.study[1]: unknown stack 'nope'",
        ),
        (lambda c: c["workloads"]["wide"].update(output_tokens=5000), "exceeds models.tiny.max_model_len"),
        (
            lambda c: c.update(platform="cuda", topologies={"tp1": {"tensor_parallel": 8}}),
            "config error at topologies.tp1: needs 8 GPUs but gpus_available is 1",
        ),
        (lambda c: c["stacks"]["hf-fp16"].update(variant="int3"), "config error at stacks.hf-fp16.variant"),
        (
            lambda c: c["stacks"]["vllm-fp16"].setdefault("env", {}).update(HF_TOKEN="hf_x"),
            "config error at stacks.vllm-fp16.env.HF_TOKEN: a secret never goes into the config",
        ),
        (
            lambda c: c["stacks"]["vllm-fp16"].setdefault("add_args", []).extend(["--api-key", "sk-1"]),
            "config error at stacks.vllm-fp16.args[",
        ),
        (  # a secret under a name that does not say so
            lambda c: c["stacks"]["vllm-fp16"]
            .setdefault("env", {})
            .update(HF_ENDPOINT="https://me:pa55word@hub.example"),
            "config error at stacks.vllm-fp16.env.HF_ENDPOINT: a secret never goes into the config",
        ),
        (
            lambda c: c["stacks"]["hf-fp16"]["on_cpu"]
            .setdefault("env", {})
            .update(AUTH="hf_abcdefghijklmnopqrstuvwxyz01"),
            "config error at stacks.hf-fp16.on_cpu.env.AUTH: a secret never goes into the config",
        ),
        (
            lambda c: c["stacks"]["vllm-fp16"]
            .setdefault("add_args", [])
            .extend(["--hub", "https://me:pa55word@hub.example/x"]),
            "config error at stacks.vllm-fp16.args[",
        ),
        (  # another service's key under a name that does not say so (#52: it reached job files and the report)
            lambda c: c["stacks"]["vllm-fp16"]
            .setdefault("env", {})
            .update(OPENAI_ORG_HEADER="sk-live-0123456789abcdefXYZ"),
            "config error at stacks.vllm-fp16.env.OPENAI_ORG_HEADER: a secret never goes into the config",
        ),
        (
            lambda c: c["stacks"]["vllm-fp16"].setdefault("env", {}).update(OPENAI_AUTH="Bearer-style-value"),
            "config error at stacks.vllm-fp16.env.OPENAI_AUTH: a secret never goes into the config",
        ),
        (
            lambda c: c.update(analysis={"tolerate_flags": ["kernel_mismach"]}),
            "config error at analysis.tolerate_flags[0]",
        ),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_key(edit, expect):
    cfg = base()
    edit(cfg)
    with pytest.raises(ConfigError) as err:
        C.validate(cfg)
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


def test_the_factorial_names_known_stacks_and_sampling():
    def with_factorial(factorial: dict) -> dict:
        return given(REPO / "config/config.yaml", top={"factorial": factorial})

    with pytest.raises(ConfigError, match="config error at factorial.high: unknown stack 'hf-generate-b128'"):
        C.validate(with_factorial({"enabled": True, "high": "hf-generate-b128"}))
    with pytest.raises(ConfigError, match=r"factorial.sampling\[1\]: unknown sampling 'nucleus'"):
        C.validate(with_factorial({"enabled": True, "sampling": ["greedy", "nucleus"]}))
    cfg = C.validate(with_factorial({"enabled": True}))
    assert G.factorial_spec(cfg)["workload"] == G.cells(cfg)[0].workload


def test_auto_platform_is_refused_for_a_cluster_run():
    cfg = C.validate(base())
    assert cfg.platform == "auto"  # fine where this machine runs the jobs
    with pytest.raises(ConfigError, match="config key platform: 'auto' cannot be resolved for a cluster run"):
        G.check_cluster_platform(cfg)
    G.check_cluster_platform(C.validate({**base(), "platform": "cuda"}))


@pytest.mark.snakemake
def test_misspelled_key_fails_fast_in_snakemake(tmp_path):
    bad = base()
    bad["grid"]["userz"] = [1]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = subprocess.run(
        [snakemake_bin(), "-n", "--configfile", str(path), "--cores", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "config error" in ln]
    assert lines and "grid: unknown key 'userz'" in lines[0], out.stderr
    # fast: while the Snakefile is read, before any job is planned (not timed: a busy machine)
    assert "Building DAG of jobs" not in out.stdout + out.stderr, out.stderr


def test_cells_and_params_are_plain_builtins():
    cfg = C.load(REPO / "config" / "config.yaml")
    cell = G.cells(cfg)[0]
    params = G.cell_params(cfg, cell)
    stack = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    allowed = (int, float, str, bool, list, dict, type(None))
    assert all(isinstance(v, allowed) for v in {**params, **stack}.values())
    assert params["cell"] == cell.name == f"u{cell.users}-{cell.workload}-{cell.sampling}"


def test_cpu_isolation_applies_on_cuda_and_on_a_cpu():
    """On cuda a card's share of the cores; on a CPU the split between server and client."""
    for platform in ("cpu", "cuda"):
        on = C.validate(given(top={"platform": platform}))
        assert G.stack_params(on, "tiny", "vllm-fp16", "tp1")["cpu_isolation"]
    cuda = given(top={"platform": "cuda"})
    assert G.stack_params(C.validate(cuda), "tiny", "vllm-fp16", "tp1")["cpu_isolation"] is True
    off = C.validate(C.merge(cuda, {"benchmark": {"cpu_isolation": False}}))
    assert G.stack_params(off, "tiny", "vllm-fp16", "tp1")["cpu_isolation"] is False


def test_with_a_capacity_sweep_the_report_headlines_the_grid_not_the_ladders_top():
    files = (REPO / "config/h200-smoke.yaml", REPO / "config/h200-capacity.yaml")
    cfg = C.load(*files)
    assert max(c.users for c in G.cells(cfg)) == 512  # the ladder's top, past any cliff there
    assert G.headline(cfg) == [{"users": 64, "workload": "h200-wide", "sampling": "greedy"}]
    assert G.headline(C.load()) == []  # no sweep: the answer's own default (the most users)
    headline = given(*files, top={"report": {"headline": [{"users": 32, "workload": "h200-wide"}]}})
    assert G.headline(C.validate(headline)) == [{"users": 32, "workload": "h200-wide"}]


def test_a_job_file_holds_no_secret_the_environment_has(tmp_path, monkeypatch):
    """Job files (results/jobs/...) are written redacted: a value the environment holds as a
    secret, or a password in a URL, never lands there."""
    from speedsplit.core.results import write_job_file

    monkeypatch.setenv("HF_TOKEN", "hf_PlantedJobFileToken0123456789")
    stack = {"stack": "s", "args": ["--x", "hf_PlantedJobFileToken0123456789"], "env": {"U": "http://a:b1b2b3@h/"}}
    write_job_file(tmp_path / "job.json", {"stack": stack, "cell": {"cell": "c"}, "run": 0})
    text = (tmp_path / "job.json").read_text()
    assert "hf_Planted" not in text and "b1b2b3" not in text and "<HF_TOKEN>" in text


def open_loop_config(**arrival):
    raw = {
        "workloads": {
            "mix": {
                "prompt_tokens": 64,
                "output_tokens": 16,
                "warmup_requests": 2,
                "arrival": {"pattern": "gamma", "rates": [0.5, 2], "burstiness": 0.5, "requests": 10, **arrival},
                "lengths": {"kind": "lognormal", "prompt_spread": 0.4, "output_spread": 0.3},
            }
        },
        "grid": {"workloads": ["wide", "mix"], "users": [2], "sampling": ["greedy"]},
    }
    return C.validate(given(REPO / "config/config.yaml", top=raw))


def test_an_open_loop_workload_is_a_cell_per_rate_whose_job_file_holds_its_arrivals():
    cfg = open_loop_config()
    names = [c.name for c in G.cells(cfg)]
    assert names == ["u2-wide-greedy", "r0.5-mix-greedy", "r2-mix-greedy"]
    p = G.cell_params(cfg, G.cell_by_name(cfg, "r2-mix-greedy"))
    assert p["users"] == 0 and p["arrival"] == {
        "pattern": "gamma",
        "rate_rps": 2.0,
        "burstiness": 0.5,
        "requests": 10,
    }
    assert p["lengths"]["kind"] == "lognormal" and p["max_client_lag_s"] == 0.1
    assert "arrival" not in G.cell_params(cfg, G.cell_by_name(cfg, "u2-wide-greedy"))  # closed loop as it was


@pytest.mark.parametrize(
    "arrival, lengths, message",
    [
        ({"rates": [0]}, None, r"workloads.mix.arrival.rates\[0\]"),
        ({"requests": 10, "duration_s": 5}, None, r"workloads.mix.arrival"),
        ({}, {"kind": "file", "path": "/nonexistent/mix.txt"}, "length file not found: /nonexistent/mix.txt"),
        ({}, {"kind": "fixed"}, None),
    ],
)
def test_bad_open_loop_settings_fail_in_one_line(arrival, lengths, message):
    mix = {"prompt_tokens": 64, "output_tokens": 16, "arrival": {"rates": [1], "requests": 3, **arrival}}
    if "duration_s" in arrival:
        mix["arrival"]["requests"] = 10
    if lengths:
        mix["lengths"] = lengths
    raw = given(REPO / "config/config.yaml", top={"workloads": {"mix": mix}, "grid": {"workloads": ["mix"]}})
    if message is None:
        C.validate(raw)
        return
    with pytest.raises(ConfigError, match=message) as err:
        C.validate(raw)
    assert "\n" not in str(err.value)


def trace_workload(**trace):
    excerpt = str(REPO / "tests/data/mooncake-conversation-excerpt.jsonl")
    return {"trace": {"path": excerpt, "requests": 20, "speedups": [1, 4], "length_scale": 0.05, **trace}}


def test_a_trace_workload_is_a_cell_per_speedup():
    top = {"workloads": {"conv": trace_workload()}, "grid": {"workloads": ["conv"]}}
    cfg = C.validate(given(REPO / "config/config.yaml", top=top))
    assert [c.name for c in G.cells(cfg)] == ["x1-conv-greedy", "x4-conv-greedy"]
    p = G.cell_params(cfg, G.cell_by_name(cfg, "x4-conv-greedy"))
    assert p["trace"]["speedup"] == 4.0 and p["trace"]["length_scale"] == 0.05 and "speedups" not in p["trace"]


@pytest.mark.parametrize(
    "trace, message",
    [
        ({"path": "/nonexistent/trace.jsonl"}, r"workloads.conv.trace: trace not found: /nonexistent/trace.jsonl"),
        ({"speedups": [0]}, r"workloads.conv.trace.speedups\[0\]"),
        ({"start_s": 10_000}, "no request in the window"),
    ],
)
def test_bad_trace_settings_fail_in_one_line(trace, message):
    top = {"workloads": {"conv": trace_workload(**trace)}, "grid": {"workloads": ["conv"]}}
    raw = given(REPO / "config/config.yaml", top=top)
    with pytest.raises(ConfigError, match=message) as err:
        C.validate(raw)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["config/config.yaml", "tests/config/ci.yaml", "tests/config/truth.yaml"])
def test_every_job_of_a_config_is_a_job_spec_its_file_reads_back(tmp_path, name):
    """The job file is a JobSpec's JSON (workflow_scripts/job_file.py): every stack and cell a
    config resolves is one, with no key its types do not know, and reads back as written. A job
    file written before the run was in it (stack and cell only) reads too."""
    from speedsplit.core.results import write_job_file
    from speedsplit.core.specs import JobSpec, read_job
    from speedsplit.planning.plan import bench_jobs

    cfg = C.load(REPO / name)
    for j in bench_jobs(cfg):
        stack = G.stack_params(cfg, j.model, j.stack, j.topology)
        cell = G.cell_params(cfg, G.cell_by_name(cfg, j.cell))
        job = JobSpec(stack=stack, cell=cell, run=j.run)
        write_job_file(tmp_path / "job.json", job.model_dump(mode="json"))
        assert read_job(tmp_path / "job.json", j.run) == (job, [])
    write_job_file(tmp_path / "old.json", {"stack": stack, "cell": cell})
    assert read_job(tmp_path / "old.json", 1) == (job.model_copy(update={"run": 1}), [])


def test_kv_cache_offload_on_a_cpu_is_refused_in_one_line_naming_the_stack(tmp_path):
    import yaml

    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"benchmark": {"stacks": ["vllm-fp16", "vllm-fp16-offload"]}}))
    with pytest.raises(
        ConfigError, match=r"^config error at stacks.vllm-fp16-offload: vLLM offloads its KV cache on CUDA"
    ):
        C.load(top)
    top.write_text(yaml.safe_dump({"platform": "cuda", "benchmark": {"stacks": ["vllm-fp16", "vllm-fp16-offload"]}}))
    assert C.load(top).benchmark.stacks == ["vllm-fp16", "vllm-fp16-offload"]
    top.write_text(yaml.safe_dump({"benchmark": {"stacks": ["vllm-fp16-lmcache"]}}))
    with pytest.raises(
        ConfigError,
        match=r"^config error at stacks.vllm-fp16-lmcache: LMCache's kernels are built for CUDA \(its wheel links libcudart\); "
        "measure this stack on a GPU",
    ):
        C.load(top)


def test_a_model_that_only_drafts_is_not_benchmarked_and_a_draft_is_checked_in_one_line(tmp_path):
    """models.tiny-draft drafts for vllm-fp16-draft: the default benchmark leaves it out; a
    draft that is no model of the config, one the stack's args never name, or one of another
    tokenizer is refused naming the stack."""
    cfg = C.load()
    assert "tiny-draft" in cfg.models and G.bench_models(cfg) == ["tiny"]
    assert G.stack_params(cfg, "tiny", "vllm-fp16-draft", "tp1")["draft_model"] == "tiny-draft"
    assert "draft_model" not in G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")  # other stacks' params as they were
    top = tmp_path / "top.yaml"
    for stack, error in (
        ({"draft_model": "nope"}, r"stacks.vllm-fp16-draft.draft_model: unknown model 'nope'"),
        (
            {"add_args": ["--seed", "1"]},
            r"stacks.vllm-fp16-draft.draft_model: the stack's args never name \{draft_dir\}",
        ),
    ):
        top.write_text(
            yaml.safe_dump({"stacks": {"vllm-fp16-draft": stack}, "benchmark": {"stacks": ["vllm-fp16-draft"]}})
        )
        with pytest.raises(ConfigError, match=error):
            C.load(top)
    other = {"models": {"tiny-draft": {"weights": "random", "tokenizer": "gpt2"}}}
    top.write_text(yaml.safe_dump(other))
    assert C.load(top)  # a stack not benchmarked is not checked
    top.write_text(yaml.safe_dump({**other, "benchmark": {"stacks": ["vllm-fp16", "vllm-fp16-draft"]}}))
    with pytest.raises(ConfigError, match=r"draft_model: tiny-draft and models.tiny have different tokenizers"):
        C.load(top)
    # learnt tokenizers of another vocabulary, or from another text, differ too
    for draft in ({"shape": "small-draft"}, {"training": {"corpus_bytes": 8_000_000}}):
        top.write_text(
            yaml.safe_dump(
                {"platform": "cuda", "models": {"tiny-draft": draft}, "benchmark": {"stacks": ["vllm-fp16-draft"]}}
            )
        )
        with pytest.raises(ConfigError, match=r"tiny-draft and models.tiny have different tokenizers"):
            C.load(top)


def test_the_speculative_gpu_config_serves_the_small_pair():
    """config/h100-speculative.yaml: the small model benchmarked, its draft trained beside it
    (the same learnt tokenizer), n-gram and draft-model steps from vLLM FP16."""
    cfg = C.load(REPO / "config/h200-smoke.yaml", REPO / "config/h100-speculative.yaml")
    assert G.bench_models(cfg) == ["small"] and draft_models(cfg) == {"small-draft"}
    assert G.stack_params(cfg, "small", "vllm-fp16-draft", "tp1")["draft_model"] == "small-draft"
    assert cfg.filled()["chains"] == {
        "study": ["vllm-fp16", "vllm-fp16-ngram"],
        "kernel": ["vllm-fp16", "vllm-fp16-draft"],
    }


def test_the_lmcache_gpu_config_sets_both_offload_steps_side_by_side():
    """config/h100-sessions-lmcache.yaml over the sessions: vLLM FP16, then its native offload or
    LMCache's, each held to the same 4 GiB card cache, the steps named by their backend."""
    cfg = C.load(
        REPO / "config/h200-smoke.yaml", REPO / "config/h200-sessions.yaml", REPO / "config/h100-sessions-lmcache.yaml"
    )
    assert cfg.benchmark.stacks == ["vllm-fp16", "vllm-fp16-offload", "vllm-fp16-lmcache"]
    assert G.chain_steps(cfg) == {"study": ["KV-cache offload (native)"], "kernel": ["KV-cache offload (LMCache)"]}
    lmcache = G.stack_params(cfg, "llama-3.1-8b", "vllm-fp16-lmcache", "tp1")
    assert lmcache["kv_cache_gib"] == 4 and lmcache["env"]["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "16"
    at = lmcache["args"].index("--kv-transfer-config")
    assert json.loads(lmcache["args"][at + 1].format()) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
