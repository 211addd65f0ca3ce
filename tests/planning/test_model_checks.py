"""What serving the config's models needs beyond the config (planning/model_checks.py): local and
pre-quantized checkpoints, weight formats the platform can make or run, llama.cpp's tools. Each
refusal is one line naming the key, raised while the config is read."""

import json
import struct

import pytest
import yaml
from conftest import REPO

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning.experiment import Experiment
from speedsplit.planning.model_checks import check_formats, check_own_weights

BUILD_HINT = "make llama-cpp builds it (envs/llama.cpp.sh)"
SHAPES = "tiny, tiny-draft, small, small-draft"


def load(tmp_path, top: dict) -> Experiment:
    """config/config.yaml with `top` merged over it, as `--configfile top.yaml` would."""
    path = tmp_path / "top.yaml"
    path.write_text(yaml.safe_dump(top))
    return C.load(REPO / "config/config.yaml", path)


def refusal(tmp_path, top: dict) -> str:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, top)
    assert "\n" not in str(err.value)
    return str(err.value)


def model_folder(path, quantization: dict | None = None, tokenizer: bool = True, qweights: bool = True):
    """A model folder as inspect_folder reads it: config.json, a tokenizer, one safetensors shard
    whose header names its tensors (no tensor is read)."""
    path.mkdir(parents=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float16"}
    if quantization:
        cfg["quantization_config"] = quantization
    (path / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    name = "model.layers.0.self_attn.q_proj." + ("qweight" if qweights else "weight")
    header = json.dumps({name: {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    return path


@pytest.fixture()
def llama_cpp(tmp_path, monkeypatch):
    """An empty llama.cpp install prefix, the only place llama-server or its converter is looked for."""
    prefix = tmp_path / "llama.cpp-prefix"
    prefix.mkdir()
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", str(prefix))
    monkeypatch.delenv("SPEEDSPLIT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    return prefix


def install_llama_cpp(prefix):
    (prefix / "bin").mkdir()
    (prefix / "bin" / "llama-server").write_text("")
    (prefix / "share" / "llama.cpp").mkdir(parents=True)
    (prefix / "share" / "llama.cpp" / "convert_hf_to_gguf.py").write_text("")


def test_the_default_config_passes_the_model_checks_on_a_cpu(tmp_path):
    """A trained tiny model, GPTQ and FP16 stacks: nothing the platform cannot make or run."""
    cfg = load(tmp_path, {"platform": "cpu"})
    assert cfg.models["tiny"].weights == "trained"
    assert check_own_weights(cfg, "tiny", cfg.models["tiny"]) is None and check_formats(cfg) is None


@pytest.mark.parametrize(
    "tiny, expect",
    [
        (
            {"source": "local", "weights": "random"},
            "config error at models.tiny.path: a local model needs the folder's path",
        ),
        ({"path": "/models/mine"}, "config error at models.tiny.path: a path is for source local, not synthetic"),
        (
            {"source": "hub", "repo": "org/m", "weights": "random", "path": "/models/mine"},
            "config error at models.tiny.path: a path is for source local, not hub",
        ),
        (
            {"source": "hub", "repo": "org/m"},
            f"config error at models.tiny.weights: trained is for a synthetic model of shape {SHAPES} (it trains in "
            "the model rule), not hub tiny",
        ),
        (
            {"shape": "llama-3.1-8b"},
            f"config error at models.tiny.weights: trained is for a synthetic model of shape {SHAPES} (it trains in "
            "the model rule), not synthetic llama-3.1-8b",
        ),
        (
            {"shape": "small"},
            "config error at models.tiny.shape: a trained small model trains on a CUDA card (a few hundred million "
            "parameters); on a CPU train shape tiny or tiny-draft",
        ),
        (
            {"shape": "small-draft"},
            "config error at models.tiny.shape: a trained small-draft model trains on a CUDA card (a few hundred "
            "million parameters); on a CPU train shape tiny or tiny-draft",
        ),
        (
            {"tokenizer": "gpt2"},
            "config error at models.tiny.tokenizer: weights trained learn their own tokenizer (byte-level BPE); "
            "tokenizer gpt2 needs weights random",
        ),
    ],
)
def test_a_model_entry_that_cannot_be_made_as_given_is_refused_naming_its_key(tmp_path, tiny, expect):
    assert refusal(tmp_path, {"platform": "cpu", "models": {"tiny": tiny}}) == expect


def test_a_draft_model_is_checked_as_a_benchmarked_one_is(tmp_path):
    """A model that only drafts is made by the model rule too: its entry is refused while the
    config is read, not when its job runs; a draft of a stack not benchmarked is not checked."""
    top = {"platform": "cpu", "benchmark": {"stacks": ["vllm-fp16-draft"]}}
    for draft, expect in (
        ({"source": "local"}, "config error at models.tiny-draft.path: a local model needs the folder's path"),
        (
            {"source": "local", "path": str(tmp_path)},
            "config error at models.tiny-draft.weights: trained is for a synthetic model of shape",
        ),
    ):
        assert refusal(tmp_path, {**top, "models": {"tiny-draft": draft}}).startswith(expect)
    assert load(tmp_path, {"platform": "cpu", "models": {"tiny-draft": {"source": "local"}}})


def test_a_trained_small_model_is_accepted_on_a_cuda_card(tmp_path):
    cfg = load(tmp_path, {"platform": "cuda", "models": {"tiny": {"shape": "small"}}})
    assert cfg.models["tiny"].shape == "small" and cfg.models["tiny"].weights == "trained"


def test_a_complete_local_folder_is_accepted(tmp_path):
    folder = model_folder(tmp_path / "mine", qweights=False)
    tiny = {"source": "local", "weights": "random", "path": str(folder)}
    cfg = load(tmp_path, {"platform": "cpu", "models": {"tiny": tiny}})
    assert cfg.models["tiny"].path == str(folder)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: None, "{p} does not exist or is not a folder"),
        (lambda p: model_folder(p, tokenizer=False), "{p} has no tokenizer (tokenizer.json or tokenizer.model)"),
        (
            lambda p: model_folder(p, quantization={"quant_method": "gptq", "bits": 4, "group_size": 128}),
            "{p} is gptq-quantized: give it as prequantized.gptq, and the FP16 model it came from as the path",
        ),
    ],
)
def test_a_local_folder_that_cannot_be_served_is_refused_at_its_path(tmp_path, make, says):
    """The folder's own fault, after the key that names it."""
    folder = tmp_path / "mine"
    make(folder)
    top = {"platform": "cpu", "models": {"tiny": {"source": "local", "weights": "random", "path": str(folder)}}}
    assert refusal(tmp_path, top) == "config error at models.tiny.path: " + says.format(p=folder.resolve())


@pytest.mark.parametrize(
    "method, quantization, group_size",
    [
        ("gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128}, 128),
        ("gptq", {"quant_method": "gptq", "bits": 4, "group_size": 64}, 64),
        ("awq", {"quant_method": "awq", "w_bit": 4, "q_group_size": 128}, 128),  # AutoAWQ's names
    ],
)
def test_a_prequantized_checkpoint_of_the_configs_bits_and_group_size_is_accepted(
    tmp_path, method, quantization, group_size
):
    ckpt = model_folder(tmp_path / method, quantization=quantization)
    top = {"quantization": {"group_size": group_size}, "models": {"tiny": {"prequantized": {method: str(ckpt)}}}}
    cfg = load(tmp_path, {"platform": "cpu", **top})
    assert getattr(cfg.models["tiny"].prequantized, method) == str(ckpt)


@pytest.mark.parametrize(
    "method, quantization, qweights, says",
    [
        (
            "gptq",
            {"quant_method": "gptq", "bits": 8, "group_size": 128},
            True,
            "{p} holds 8-bit weights, not the 4 bits of quantization.bits",
        ),
        (
            "gptq",
            {"quant_method": "gptq", "bits": 4, "group_size": 64},
            True,
            "{p} has group size 64, not the 128 of quantization.group_size",
        ),
        (
            "awq",
            {"quant_method": "gptq", "bits": 4, "group_size": 128},
            True,
            "{p} is not a AWQ checkpoint (quant_method 'gptq')",
        ),
        (
            "gptq",
            {"quant_method": "gptq", "bits": 4, "group_size": 128},
            False,
            "{p} holds no 4-bit .qweight tensors: its weights are not quantized",
        ),
    ],
)
def test_a_prequantized_checkpoint_unlike_the_config_is_refused_at_its_key(
    tmp_path, method, quantization, qweights, says
):
    ckpt = model_folder(tmp_path / "ckpt", quantization=quantization, qweights=qweights)
    top = {"platform": "cpu", "models": {"tiny": {"prequantized": {method: str(ckpt)}}}}
    expect = f"config error at models.tiny.prequantized.{method}: " + says.format(p=ckpt.resolve())
    assert refusal(tmp_path, top) == expect


def test_a_prequantized_checkpoint_is_refused_with_the_dummy_method(tmp_path):
    """Only the checkpoint given is checked (awq here, gptq left empty)."""
    ckpt = model_folder(tmp_path / "awq", quantization={"quant_method": "awq", "w_bit": 4, "q_group_size": 128})
    top = {
        "platform": "cpu",
        "quantization": {"method": "dummy"},
        "models": {"tiny": {"prequantized": {"awq": str(ckpt)}}},
    }
    assert refusal(tmp_path, top) == (
        "config error at models.tiny.prequantized.awq: quantization.method dummy writes its own INT4 config; a "
        "checkpoint is used with method gptqmodel"
    )


def test_fp8_is_refused_on_a_cpu_and_accepted_on_a_cuda_card(tmp_path):
    top = {"platform": "cpu", "benchmark": {"stacks": ["vllm-fp16", "vllm-fp8"]}}
    assert refusal(tmp_path, top) == (
        "config error at stacks.vllm-fp8.variant: fp8 (vLLM's dynamic W8A8) needs a CUDA card with FP8 units "
        "(Ada, Hopper or newer); this config's platform is cpu"
    )
    assert load(tmp_path, {**top, "platform": "cuda"}).benchmark.stacks == ["vllm-fp16", "vllm-fp8"]


def test_an_awq_stack_is_refused_with_the_dummy_method_and_accepted_with_gptqmodel(tmp_path):
    """dummy writes GPTQ configs only: the GPTQ stacks of the default chain take it."""
    assert load(tmp_path, {"platform": "cpu", "quantization": {"method": "dummy"}}).quantization.method == "dummy"
    top = {"platform": "cpu", "benchmark": {"stacks": ["vllm-awq"]}}
    message = refusal(tmp_path, {**top, "quantization": {"method": "dummy"}})
    # (a checkpoint of one's own is no way out: dummy refuses it too)
    assert message == (
        "config error at quantization.method: dummy writes GPTQ configs only; stack vllm-awq serves AWQ (use gptqmodel)"
    )
    assert load(tmp_path, top).benchmark.stacks == ["vllm-awq"]


def test_a_llama_cpp_stack_refuses_a_synthetic_model_whose_tokenizer_llama_cpp_cannot_read(tmp_path, llama_cpp):
    install_llama_cpp(llama_cpp)
    top = {"platform": "cpu", "models": {"tiny": {"weights": "random"}}, "benchmark": {"stacks": ["llamacpp-f16"]}}
    assert refusal(tmp_path, top) == (
        "config error at models.tiny.tokenizer: stack llamacpp-f16 serves it through llama.cpp, which cannot read "
        "the wordlevel tokenizer: set tokenizer: gpt2"
    )


def test_a_llama_cpp_stack_is_accepted_where_llama_cpp_is_installed(tmp_path, llama_cpp):
    """The server from the prefix's bin/, the converter from its share/; a hub model's own
    tokenizer is not the config's to judge."""
    install_llama_cpp(llama_cpp)
    stacks = {"benchmark": {"stacks": ["llamacpp-f16", "llamacpp-q8_0"]}}
    synthetic = {"platform": "cpu", "models": {"tiny": {"weights": "random", "tokenizer": "gpt2"}}, **stacks}
    assert load(tmp_path, synthetic).models["tiny"].tokenizer == "gpt2"
    hub = {"platform": "cpu", "models": {"tiny": {"source": "hub", "repo": "org/m", "weights": "random"}}, **stacks}
    assert load(tmp_path, hub).models["tiny"].tokenizer == "wordlevel"


def test_a_llama_cpp_stack_without_llama_server_is_refused_at_its_args(tmp_path, llama_cpp):
    top = {
        "platform": "cpu",
        "models": {"tiny": {"weights": "random", "tokenizer": "gpt2"}},
        "benchmark": {"stacks": ["llamacpp-f16"]},
    }
    assert refusal(tmp_path, top) == (
        f"config error at stacks.llamacpp-f16.args: llama-server not found ({BUILD_HINT}, or set "
        "SPEEDSPLIT_LLAMA_SERVER)"
    )


def test_without_llama_cpps_converter_a_gguf_stack_or_a_gpt2_tokenizer_is_refused(tmp_path, llama_cpp, monkeypatch):
    """The converter makes the GGUF file and is where a gpt2 tokenizer is read from: the first
    thing that needs it is named."""
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_SERVER", "/opt/llama/llama-server")  # taken as given
    share = llama_cpp / "share" / "llama.cpp"
    gpt2 = {"platform": "cpu", "models": {"tiny": {"weights": "random", "tokenizer": "gpt2"}}}
    assert refusal(tmp_path, {**gpt2, "benchmark": {"stacks": ["llamacpp-f16"]}}) == (
        f"config error at stacks.llamacpp-f16.variant: gguf: llama.cpp's converter is not in {share}: {BUILD_HINT}"
    )
    assert refusal(tmp_path, gpt2) == (
        f"config error at models.tiny.tokenizer: gpt2: llama.cpp's converter is not in {share}: {BUILD_HINT}"
    )


def test_a_llama_cpp_stack_that_is_not_benchmarked_needs_no_llama_cpp(tmp_path, llama_cpp):
    """config/config.yaml declares llamacpp-f16 beside a wordlevel model; its chain leaves it out."""
    cfg = load(tmp_path, {"platform": "cpu"})
    assert "llamacpp-f16" in cfg.stacks and cfg.models["tiny"].tokenizer == "wordlevel"
