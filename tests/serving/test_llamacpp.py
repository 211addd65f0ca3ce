"""A chain across engines: llama.cpp's own server (built by `make llama-cpp`) on the model
converted to GGUF by the gguf rule, beside the HF stack, measured and decomposed like any other
(stacks llamacpp-f16 and llamacpp-q8_0 of config/config.yaml)."""

import json
from pathlib import Path

import pytest
import yaml

from speedsplit.models import gguf
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as cfgmod
from speedsplit.planning.grid import chain_steps, stack_params
from conftest import run_snakemake

ENGINES = {
    "models": {"tiny": {"tokenizer": "gpt2", "weights": "random"}},
    "chains": {"engines": ["hf-generate", "llamacpp-f16", "llamacpp-q8_0"]},
    "workloads": {"eng": {"prompt_tokens": 64, "output_tokens": 32, "requests_per_user": 4, "warmup_requests": 1}},
    "grid": {"users": [4], "workloads": ["eng"], "sampling": ["greedy"], "runs": 2},
    "benchmark": {
        "stacks": ["hf-generate", "llamacpp-f16", "llamacpp-q8_0"],
        "min_measured_s": 0.2,
        "server_reuse": "per_stack",  # one start per stack, not one per run
    },
    "platform": "cpu",
}


def _config(tmp_path, overlay):
    path = tmp_path / "engines.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return cfgmod.load(path)


def test_the_steps_of_a_chain_across_engines_are_named():
    given = cfgmod.read_yaml(cfgmod.DEFAULT_CONFIG)
    chains = {"x": ["vllm-fp16", "llamacpp-f16", "llamacpp-q8_0"], "y": ["hf-fp16", "llamacpp-f16"]}
    # benchmarking the FP16 stacks only: a benchmarked llama.cpp stack needs a gpt2 tokenizer and llama.cpp's tools
    benchmark = {**given["benchmark"], "stacks": ["hf-fp16", "vllm-fp16"]}
    config = cfgmod.validate({**given, "chains": chains, "benchmark": benchmark})
    assert chain_steps(config) == {"x": ["runtime", "GGUF Q8_0 weights"], "y": ["runtime"]}


def test_only_a_stack_that_drops_connections_says_so_in_its_params():
    config = cfgmod.load(cfgmod.DEFAULT_CONFIG)
    assert stack_params(config, "tiny", "llamacpp-q8_0", "tp1")["keep_alive"] is False
    assert "keep_alive" not in stack_params(config, "tiny", "vllm-fp16", "tp1")  # finished cells stay as they were


def test_what_a_llama_cpp_stack_lacks_is_one_line_at_config_time(tmp_path, monkeypatch):
    wordlevel = {**ENGINES, "models": {"tiny": {"tokenizer": "wordlevel", "weights": "random"}}}
    with pytest.raises(ConfigError, match=r"models\.tiny\.tokenizer: .* set tokenizer: gpt2"):
        _config(tmp_path, wordlevel)

    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", str(tmp_path / "nothing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SPEEDSPLIT_LLAMA_SERVER", raising=False)
    with pytest.raises(ConfigError, match=r"stacks\.llamacpp-f16\.args: llama-server not found \(make llama-cpp"):
        _config(tmp_path, ENGINES)
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_SERVER", "/usr/bin/true")
    with pytest.raises(
        ConfigError,
        match=r"stacks\.llamacpp-f16\.variant: gguf: llama.cpp's converter is not in .*: make llama-cpp",
    ):
        _config(tmp_path, ENGINES)


def test_a_folder_without_a_gguf_file_is_refused(tmp_path):
    from speedsplit.models.checkpoint import ModelError, check_model

    with pytest.raises(ModelError, match="has no model.gguf"):
        check_model(tmp_path, "gguf")
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        check_model(tmp_path, "gguf")


@pytest.mark.slow
def test_a_chain_crosses_engines_and_is_decomposed(tmp_path):
    assert gguf.server_binary() and (gguf.prefix() / "share/llama.cpp").is_dir(), "llama.cpp: run make llama-cpp"
    (tmp_path / "engines.yaml").write_text(yaml.safe_dump(ENGINES))
    out = run_snakemake(["--configfile", "engines.yaml", "--cores", "2", "--resources", "gpu=1"], tmp_path, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]

    # llama.cpp's converter wrote both files from the one FP16 checkpoint
    for kind in ("f16", "q8_0"):
        info = json.loads((tmp_path / f"resources/models/tiny/gguf-{kind}/speedsplit-model.json").read_text())
        assert info["gguf_type"] == kind and info["converted_from"].endswith("resources/models/tiny/fp16")
        assert (tmp_path / f"resources/models/tiny/gguf-{kind}/model.gguf").read_bytes()[:4] == b"GGUF"

    # every request of every run answered with exactly the lengths asked (usage counted by the server)
    results = sorted((tmp_path / "results/bench/tiny").glob("*/tp1/*/run*.json"))
    assert len(results) == 6
    for path in results:
        r = json.loads(path.read_text())
        s = r["summary"]
        assert r["status"] == "ok" and s["failed"] == 0 and s["completed"] == 4 * 4, path
        assert s["wrong_prompt_length"] == 0 and s["wrong_output_length"] == 0, path
        if "/llamacpp-" in str(path):
            assert r["weights"]["variant"] == "gguf"
            # its engine's steps are its llama_decode() calls (llamacpp:n_decode_total)
            assert r["telemetry"]["server"]["engine_steps"] > 0, path
    log = next((tmp_path / "results/logs/sessions").glob("tiny__llamacpp-q8_0__*.server0.log")).read_text()
    assert "llama-server" in log.splitlines()[0] and "--host 127.0.0.1" in log.splitlines()[0]

    # the chain's steps, each a factor, multiplying to the whole
    import polars as pl

    att = pl.read_parquet(tmp_path / "results/tables/attribution.parquet").filter(pl.col("chain") == "engines")
    steps = dict(zip(att["step"], att["value"], strict=True))
    assert set(steps) == {"runtime", "GGUF Q8_0 weights", "total"}
    assert steps["runtime"] * steps["GGUF Q8_0 weights"] == pytest.approx(steps["total"], rel=1e-9)
    assert "engines (hf-generate → llamacpp-f16 → llamacpp-q8_0)" in out.stdout + out.stderr


def test_the_converter_refuses_an_unknown_type(tmp_path):
    from speedsplit.models.checkpoint import ModelError

    with pytest.raises(ModelError, match="unknown GGUF type 'q4_k'"):
        gguf.convert(tmp_path, tmp_path / "out", "q4_k")
    assert not (tmp_path / "out").exists()


def test_the_server_binary_is_looked_for_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_SERVER", "/opt/x/llama-server")
    assert gguf.server_binary() == "/opt/x/llama-server"
    monkeypatch.delenv("SPEEDSPLIT_LLAMA_SERVER")
    own = tmp_path / "bin" / "llama-server"
    own.parent.mkdir()
    own.write_text("")
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", str(tmp_path))
    assert gguf.server_binary() == str(own)
    assert Path(gguf.BUILD_HINT.split()[0]).name == "make"
