"""Model checkpoints (speedsplit/models/checkpoint.py): synthesised models (config, tokenizer,
seeded FP16 weights), what is read back from a model folder, and its one-line checks."""

import copy
import json
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from transformers import AutoTokenizer

from speedsplit.models import checkpoint as M

DRAFT_TENSORS = {  # tiny-draft: hidden 64, intermediate 128, 2 heads and 1 KV head of 32, vocabulary 1024
    "lm_head.weight": (1024, 64),
    "model.embed_tokens.weight": (1024, 64),
    "model.norm.weight": (64,),
    "model.layers.0.input_layernorm.weight": (64,),
    "model.layers.0.post_attention_layernorm.weight": (64,),
    "model.layers.0.self_attn.q_proj.weight": (64, 64),
    "model.layers.0.self_attn.k_proj.weight": (32, 64),
    "model.layers.0.self_attn.v_proj.weight": (32, 64),
    "model.layers.0.self_attn.o_proj.weight": (64, 64),
    "model.layers.0.mlp.gate_proj.weight": (128, 64),
    "model.layers.0.mlp.up_proj.weight": (128, 64),
    "model.layers.0.mlp.down_proj.weight": (64, 128),
}
SYNTHETIC = {"source": "synthetic", "tokenizer": "wordlevel"}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """tiny-draft synthesised with seeds 7, 7 again, and 8: name -> (folder, returned info)."""
    base = tmp_path_factory.mktemp("drafts")
    return {
        name: (base / name, M.synthesize("tiny-draft", base / name, seed=seed))
        for name, seed in [("a", 7), ("b", 7), ("c", 8)]
    }


def tensors(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def model_folder(path, config=None, weights=None):
    """A hand-made model folder: config (a dict, or the raw text of config.json) and weights
    (name -> numpy array, written as model.safetensors)."""
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if weights is not None:
        save_file(weights, str(path / "model.safetensors"))
    return path


def quantized(method):
    return {"hidden_size": 64, "quantization_config": {"quant_method": method, "bits": 4}}


QWEIGHT = {"model.layers.0.self_attn.q_proj.qweight": np.zeros((2, 4), np.int32)}
FP16_WEIGHT = {"model.layers.0.self_attn.q_proj.weight": np.zeros((2, 4), np.float16)}


def test_a_synthesised_model_holds_every_tensor_of_its_shape_in_fp16(drafts):
    held = tensors(drafts["a"][0])
    assert {k: tuple(t.shape) for k, t in held.items()} == DRAFT_TENSORS
    assert {t.dtype for t in held.values()} == {torch.float16}


def test_the_same_seed_gives_the_same_weights_and_another_seed_other_weights(drafts):
    a, b, c = (tensors(drafts[n][0]) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    differ = {k for k in a if not torch.equal(a[k], c[k])}
    assert differ == {k for k in DRAFT_TENSORS if not k.endswith("norm.weight")}  # norms start at ones


def test_a_synthesised_model_records_what_it_is_and_its_config_carries_the_shape(drafts):
    folder, info = drafts["c"]
    assert info == {**SYNTHETIC, "shape": "tiny-draft", "weights": "random", "seed": 8}
    assert M.model_info(folder) == info and not M.is_dummy(folder)
    saved = M.read_model_config(folder)
    shape = M.shape_config("tiny-draft")
    keys = set(shape) - {"rope_theta", "torch_dtype"}  # transformers writes these two its own way
    assert {k: saved[k] for k in keys} == {k: shape[k] for k in keys}
    assert (saved["rope_parameters"]["rope_theta"], saved["dtype"]) == (10000.0, "float16")


def test_the_wordlevel_tokenizer_maps_each_word_to_exactly_one_token(tmp_path):
    M.build_tokenizer(12, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 12
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2, 0)
    assert tok("w3 w11 w12 hello")["input_ids"] == [3, 11, 0, 0]  # no special tokens added; unknowns are <unk>
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<unk>", "<s>", "</s>", "▁w3"]
    assert tok.decode([3, 11]) == "w3 w11"


def test_shape_config_is_the_published_shape_with_token_ids_dtype_and_activation():
    added = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float16", "hidden_act": "silu"}
    assert M.shape_config("tiny") == {**M.SHAPES["tiny"], **added}
    assert M.SHAPES["tiny"]["tie_word_embeddings"] is False and M.SHAPES["tiny"]["rms_norm_eps"] == 1e-5
    assert M.shape_config("mistral-7b")["sliding_window"] is None
    assert M.shape_config("qwen2.5-7b")["rms_norm_eps"] == 1e-6
    assert "torch_dtype" not in M.SHAPES["tiny"]  # the published shape itself is left as it is


def test_an_unknown_shape_is_one_line_naming_the_known_ones():
    with pytest.raises(M.ModelError) as err:
        M.shape_config("gpt-5")
    assert str(err.value) == (
        "unknown model shape 'gpt-5' (known: tiny, tiny-draft, small, small-draft, llama-3.1-8b, "
        "mistral-7b, qwen2.5-7b, llama-3.1-70b)"
    )


def test_changing_the_architectures_shape_config_returned_leaves_the_published_shape_alone(monkeypatch):
    monkeypatch.setitem(M.SHAPES, "tiny-draft", copy.deepcopy(M.SHAPES["tiny-draft"]))  # put back after
    M.shape_config("tiny-draft")["architectures"].append("Changed")
    assert M.SHAPES["tiny-draft"]["architectures"] == ["LlamaForCausalLM"]


def test_acquire_synthesises_dummy_weights_as_config_tokenizer_and_record_only(tmp_path):
    entry = {"source": "synthetic", "shape": "llama-3.1-8b", "weights": "dummy", "seed": 4}
    info = M.acquire(entry, tmp_path / "m")
    assert info == {**SYNTHETIC, "shape": "llama-3.1-8b", "weights": "dummy", "seed": 4}
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == ["config.json", "speedsplit-model.json", "tokenizer.json", "tokenizer_config.json"]
    assert M.read_model_config(tmp_path / "m") == M.shape_config("llama-3.1-8b")
    assert M.is_dummy(tmp_path / "m") and M.check_model(tmp_path / "m", "fp16") == M.shape_config("llama-3.1-8b")
    assert len(AutoTokenizer.from_pretrained(str(tmp_path / "m"))) == 128256


def test_synthesising_over_a_folder_replaces_it_whole_and_leaves_no_temporary_folder(tmp_path):
    old = model_folder(tmp_path / "m", config={"hidden_size": 1})
    (old / "stray.bin").write_bytes(b"old")
    M.synthesize("tiny-draft", old, weights="dummy", seed=2)
    assert not (old / "stray.bin").exists() and M.model_info(old)["seed"] == 2
    assert M.read_model_config(old)["hidden_size"] == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_acquire_of_a_hub_model_offline_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = {"source": "hub", "repo": "speedsplit-tests/no-such-model", "revision": "main"}
    with pytest.raises(M.ModelError) as err:
        M.acquire(entry, tmp_path / "m")
    assert str(err.value) == (
        "model speedsplit-tests/no-such-model@main is not in the local cache and the hub is unreachable "
        "(HF_HUB_OFFLINE or no network)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_a_folder_without_config_and_a_corrupt_config_are_one_line_errors(tmp_path):
    empty = model_folder(tmp_path / "empty")
    corrupt = model_folder(tmp_path / "corrupt", config='{"hidden_size": 12')
    cases = [
        (tmp_path / "nope", f"model folder {tmp_path / 'nope'} does not exist"),
        (empty, f"model folder {empty} has no config.json"),
        (corrupt, f"model folder {corrupt}: config.json is corrupt (Expecting ',' delimiter)"),
    ]
    for folder, says in cases:
        for check in (M.read_model_config, lambda f: M.check_model(f, "fp16"), lambda f: M.check_model(f, "gptq")):
            with pytest.raises(M.ModelError) as err:
                check(folder)
            assert str(err.value) == says


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b"[1, 2]"], ids=["not-utf8", "not-an-object"])
def test_a_config_json_that_is_no_json_object_is_a_one_line_model_error(tmp_path, raw):
    folder = model_folder(tmp_path / "m")
    (folder / "config.json").write_bytes(raw)
    with pytest.raises(M.ModelError) as err:
        M.check_model(folder, "fp16")
    assert str(err.value).startswith(f"model folder {folder}: config.json is corrupt (")


def test_a_folder_without_safetensors_weights_is_refused(tmp_path):
    folder = model_folder(tmp_path / "m", config={"hidden_size": 64})
    with pytest.raises(M.ModelError) as err:
        M.check_model(folder, "fp16")
    assert str(err.value) == f"model folder {folder} has no *.safetensors weights"


@pytest.mark.parametrize("variant, config_method", [("gptq", None), ("awq", None), ("gptq", "awq"), ("awq", "gptq")])
def test_a_4bit_variant_needs_its_own_quant_method_in_config(tmp_path, tiny_model, variant, config_method):
    folder = tiny_model if config_method is None else model_folder(tmp_path / "m", quantized(config_method), QWEIGHT)
    with pytest.raises(M.ModelError) as err:
        M.check_model(folder, variant)
    assert str(err.value) == (
        f"model folder {folder} is not {variant.upper()}-quantized (config.json has no {variant} quantization_config)"
    )


def test_a_quantized_config_over_unquantized_or_corrupt_weights_is_refused(tmp_path):
    plain = model_folder(tmp_path / "plain", quantized("gptq"), FP16_WEIGHT)
    with pytest.raises(M.ModelError) as err:
        M.check_model(plain, "gptq")
    assert str(err.value) == f"model folder {plain} is not quantized: model.safetensors holds no int4 .qweight tensors"
    damaged = model_folder(tmp_path / "damaged", quantized("awq"))
    (damaged / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(M.ModelError) as err:
        M.check_model(damaged, "awq")
    assert str(err.value) == (
        f"model folder {damaged}: model.safetensors is corrupt (Error while deserializing header: header too large)"
    )


@pytest.mark.parametrize("variant", ["gptq", "awq"])
def test_a_folder_holding_int4_qweights_passes_and_its_config_comes_back(tmp_path, variant):
    folder = model_folder(tmp_path / "m", quantized(variant), QWEIGHT)
    assert M.check_model(folder, variant) == quantized(variant)


def test_an_fp16_model_passes_and_a_dummy_one_needs_no_weights(tmp_path, tiny_model):
    assert M.check_model(tiny_model, "fp16") == M.read_model_config(tiny_model)
    assert M.read_model_config(tiny_model)["hidden_size"] == 128
    dummy = model_folder(tmp_path / "dummy", quantized("gptq"))
    (dummy / "speedsplit-model.json").write_text(json.dumps({"source": "synthetic", "weights": "dummy"}))
    assert M.check_model(dummy, "gptq") == quantized("gptq")


def test_a_gguf_folder_passes_with_gguf_magic_and_returns_no_config(tmp_path):
    folder = model_folder(tmp_path / "m")  # a missing file and a wrong magic: tests/serving/test_llamacpp.py
    (folder / "model.gguf").write_bytes(b"GGUF....")
    assert M.check_model(folder, "gguf") == {}


def test_model_info_of_a_folder_without_a_readable_record_is_empty(tmp_path):
    folder = model_folder(tmp_path / "m")
    assert M.model_info(folder) == {} and M.model_info(tmp_path / "nope") == {}
    (folder / "speedsplit-model.json").write_text('{"weights": "dum')
    assert M.model_info(folder) == {} and not M.is_dummy(folder)


def test_a_model_identity_is_its_absolute_path_its_record_and_a_digest_of_its_listing(tmp_path, monkeypatch):
    one = model_folder(tmp_path / "one", config={"hidden_size": 64})
    (one / "speedsplit-model.json").write_text(json.dumps({"source": "hub", "revision": "abc"}))
    two = tmp_path / "two"
    shutil.copytree(one, two)  # the same names, sizes and modification times
    monkeypatch.chdir(tmp_path)
    first = M.model_identity("one")
    assert first["path"] == str(one.resolve()) and first["info"] == {"source": "hub", "revision": "abc"}
    assert M.model_identity(two)["files"] == first["files"] and len(first["files"]) == 16
    st = (two / "config.json").stat()
    os.utime(two / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = M.model_identity(two)["files"]
    (two / "tokenizer.json").write_text("{}")
    added = M.model_identity(two)["files"]
    assert len({first["files"], touched, added}) == 3
    assert M.model_identity(tmp_path / "nope") == {
        "path": str(tmp_path / "nope"),
        "info": {},
        "files": "e3b0c44298fc1c14",
    }
