import json
import random

import pytest
from transformers import AutoTokenizer

from speedsplit.models import checkpoint as M
from speedsplit.models.prompts import exact_prompt


def test_tiny_shape_suits_vllm_cpu(tiny_model):
    cfg = json.loads((tiny_model / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert head_dim in (32, 64, 80, 96, 112, 128)
    assert cfg["vocab_size"] == 1024 and cfg["num_key_value_heads"] == 2
    assert (tiny_model / "model.safetensors").is_file()
    assert M.model_info(tiny_model) == {
        "source": "synthetic",
        "shape": "tiny",
        "weights": "random",
        "seed": 0,
        "tokenizer": "wordlevel",
    }


@pytest.mark.parametrize(
    "shape, hidden, layers, vocab",
    [
        ("llama-3.1-8b", 4096, 32, 128256),
        ("mistral-7b", 4096, 32, 32768),
        ("qwen2.5-7b", 3584, 28, 152064),
        ("llama-3.1-70b", 8192, 80, 128256),
    ],
)
def test_published_shapes(shape, hidden, layers, vocab):
    cfg = M.shape_config(shape)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (hidden, layers, vocab)


@pytest.mark.parametrize("n", [1, 7, 64, 512])
def test_prompts_have_exact_token_counts(tiny_model, n):
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    rng = random.Random(n)
    for _ in range(3):
        text = exact_prompt(tok, n, rng)
        assert len(tok.encode(text, add_special_tokens=False)) == n
        assert len(tok.encode(text)) == n  # no special tokens are added either


def test_same_seed_same_weights(tmp_path):
    M.synthesize("tiny", tmp_path / "a", seed=3)
    M.synthesize("tiny", tmp_path / "b", seed=3)
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()


def test_dummy_weights_write_no_tensors(tmp_path):
    M.synthesize("llama-3.1-8b", tmp_path / "m", weights="dummy")
    assert not list((tmp_path / "m").glob("*.safetensors"))
    assert M.is_dummy(tmp_path / "m")
    assert json.loads((tmp_path / "m/config.json").read_text())["hidden_size"] == 4096


def test_bad_model_folders_give_one_line_errors(tmp_path, tiny_model):
    with pytest.raises(M.ModelError, match="does not exist"):
        M.check_model(tmp_path / "nope", "fp16")
    (tmp_path / "empty").mkdir()
    with pytest.raises(M.ModelError, match="has no config.json"):
        M.check_model(tmp_path / "empty", "fp16")
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text('{"hidden_size": 12')
    with pytest.raises(M.ModelError, match="config.json is corrupt"):
        M.check_model(bad, "fp16")
    with pytest.raises(M.ModelError, match="is not GPTQ-quantized"):
        M.check_model(tiny_model, "gptq")
    M.check_model(tiny_model, "fp16")


def test_unquantized_weights_under_a_gptq_config_are_refused(tmp_path, tiny_model):
    import shutil

    fake = tmp_path / "fake-gptq"
    shutil.copytree(tiny_model, fake)
    cfg = json.loads((fake / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (fake / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(M.ModelError, match="holds no int4 .qweight tensors"):
        M.check_model(fake, "gptq")


def test_hub_download_failure_is_clear_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(M.ModelError, match="not in the local cache and the hub is unreachable"):
        M.download("meta-llama/Llama-3.1-8B-Instruct", "main", tmp_path / "m")
    assert not (tmp_path / "m").exists()
