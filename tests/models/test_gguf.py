"""llama.cpp's side of a model (speedsplit/models/gguf.py): where its install is looked for (the
converter, the server), what is refused before anything is written, a GGUF folder's check, and,
where `make llama-cpp` has installed llama.cpp, the tiny model with GPT-2's vocabulary converted
to each GGUF type by llama.cpp's own converter and read back with the gguf package."""

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from speedsplit.models import gguf
from speedsplit.models.checkpoint import ModelError

HINT = "make llama-cpp builds it (envs/llama.cpp.sh)"


@pytest.fixture()
def bare(tmp_path, monkeypatch):
    """An install prefix with nothing of llama.cpp in it, and no llama-server anywhere."""
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", str(prefix))
    monkeypatch.delenv("SPEEDSPLIT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    return prefix


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _left_beside(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_llama_cpp_is_looked_for_in_the_named_prefix_else_in_this_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", str(tmp_path))
    assert gguf.prefix() == tmp_path
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_CPP", "")  # set but empty: as if unset
    assert gguf.prefix() == Path(sys.prefix)
    monkeypatch.delenv("SPEEDSPLIT_LLAMA_CPP")
    assert gguf.prefix() == Path(sys.prefix)


def test_without_its_converter_llama_cpps_share_is_one_line_saying_where_and_how(bare):
    share = bare / "share" / "llama.cpp"
    with pytest.raises(ModelError) as exc:
        gguf.share()
    assert str(exc.value) == f"llama.cpp's converter is not in {share}: {HINT}"
    (share / "models").mkdir(parents=True)  # vocabularies alone are no install
    (share / "models" / gguf.GPT2_VOCAB).write_bytes(b"GGUF")
    with pytest.raises(ModelError, match="converter is not in"):
        gguf.share()
    (share / "convert_hf_to_gguf.py").write_text("")
    assert gguf.share() == share


def test_the_server_is_the_named_one_else_the_prefixs_else_paths_else_none(bare, tmp_path, monkeypatch):
    assert gguf.server_binary() is None
    on_path = _executable(tmp_path / "path" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert gguf.server_binary() == str(on_path)
    own = _executable(bare / "bin" / "llama-server")
    assert gguf.server_binary() == str(own)
    monkeypatch.setenv("SPEEDSPLIT_LLAMA_SERVER", "/opt/llama/llama-server")
    assert gguf.server_binary() == "/opt/llama/llama-server"


def test_a_llama_server_on_path_that_cannot_run_is_not_taken(bare, tmp_path, monkeypatch):
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "llama-server").write_text("")  # not executable
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert gguf.server_binary() is None


def test_an_unknown_gguf_type_is_refused_before_anything_is_looked_for_or_written(bare, tmp_path):
    out = tmp_path / "models" / "gguf-q4_0"
    with pytest.raises(ModelError) as exc:
        gguf.convert(tmp_path / "fp16", out, "q4_0")
    assert str(exc.value) == "unknown GGUF type 'q4_0' (known: f16, bf16, q8_0)"
    assert not out.parent.exists()


def test_without_llama_cpp_a_conversion_is_one_line_and_writes_nothing(bare, tmp_path):
    out = tmp_path / "models" / "gguf-f16"
    with pytest.raises(ModelError) as exc:
        gguf.convert(tmp_path / "fp16", out, "f16")
    assert str(exc.value) == f"llama.cpp's converter is not in {bare / 'share' / 'llama.cpp'}: {HINT}"
    assert not out.parent.exists()


@pytest.mark.slow  # transformers is imported first: seconds of a 2-core machine
def test_without_llama_cpp_gpt2s_tokenizer_is_one_line_and_writes_nothing(bare, tmp_path):
    with pytest.raises(ModelError) as exc:
        gguf.gpt2_tokenizer(tmp_path)
    assert str(exc.value) == f"llama.cpp's converter is not in {bare / 'share' / 'llama.cpp'}: {HINT}"
    assert _left_beside(tmp_path) == ["prefix"]


def test_a_gguf_folder_needs_a_file_that_starts_with_ggufs_magic(tmp_path):
    folder = tmp_path / "gguf-f16"
    path = folder / gguf.GGUF_FILE
    folder.mkdir()
    with pytest.raises(ModelError) as exc:
        gguf.check_gguf(folder)
    assert str(exc.value) == f"model folder {folder} has no model.gguf"
    path.mkdir()  # a folder by that name is no file
    with pytest.raises(ModelError, match="has no model.gguf"):
        gguf.check_gguf(folder)
    path.rmdir()
    for wrong in (b"", b"GGU", b"gguf\x03\x00\x00\x00", b"PK\x03\x04 a zip", b"\x08\x00\x00\x00{safetensors"):
        path.write_bytes(wrong)
        with pytest.raises(ModelError) as exc:
            gguf.check_gguf(str(folder))
        assert str(exc.value) == f"{path} is not a GGUF file"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert gguf.check_gguf(folder) is None


# --- with llama.cpp installed (make llama-cpp): its converter and GPT-2's vocabulary -----------


@pytest.fixture(scope="module")
def llama_cpp():
    try:
        return gguf.share()
    except ModelError as exc:
        pytest.skip(f"needs llama.cpp's converter and vocabularies: {exc}")


@pytest.fixture(scope="module")
def gpt2_model(llama_cpp, tmp_path_factory):
    """The tiny model with GPT-2's vocabulary (what a llamacpp stack's model takes)."""
    from speedsplit.models.checkpoint import synthesize

    out = tmp_path_factory.mktemp("gguf") / "tiny" / "fp16"
    synthesize("tiny", out, tokenizer="gpt2")
    return out


@pytest.fixture(scope="module")
def converted(gpt2_model):
    """gguf_type -> (its folder, what convert returned)."""
    base = gpt2_model.parent
    return {t: (base / f"gguf-{t}", gguf.convert(gpt2_model, base / f"gguf-{t}", t)) for t in ("f16", "q8_0")}


@pytest.mark.slow
def test_gpt2s_tokenizer_is_read_from_llama_cpps_vocabulary_and_saved(llama_cpp, tmp_path):
    from transformers import AutoTokenizer

    assert gguf.gpt2_tokenizer(tmp_path) == 50257
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's own ids
    assert tok.convert_ids_to_tokens(50256) == "<|endoftext|>"


@pytest.mark.slow
@pytest.mark.parametrize("gguf_type, weights, file_type", [("f16", "F16", 1), ("q8_0", "Q8_0", 7)])
def test_the_checkpoint_is_converted_whole_to_the_gguf_type_asked(converted, gpt2_model, gguf_type, weights, file_type):
    from gguf import GGUFReader

    folder, report = converted[gguf_type]
    gguf.check_gguf(folder)
    assert sorted(os.listdir(folder)) == ["model.gguf", "speedsplit-model.json"]
    assert _left_beside(folder.parent) == ["fp16", "gguf-f16", "gguf-q8_0"]  # no temporary folder left
    size = (folder / "model.gguf").stat().st_size
    assert report == {
        "variant": "gguf", "gguf_type": gguf_type, "method": "llama.cpp convert_hf_to_gguf.py",
        "convert_s": report["convert_s"], "size_gib": round(size / 2**30, 4), "converted_from": str(gpt2_model),
    }  # fmt: skip
    assert report["convert_s"] > 0
    assert json.loads((folder / "speedsplit-model.json").read_text()) == report
    reader = GGUFReader(folder / "model.gguf")
    config = json.loads((gpt2_model / "config.json").read_text())
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["general.file_type"].contents() == file_type
    assert reader.fields["llama.block_count"].contents() == config["num_hidden_layers"]
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == config["vocab_size"]
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {types[n] for n in types if not n.endswith("norm.weight")} == {weights}
    assert {types[n] for n in types if n.endswith("norm.weight")} == {"F32"}
    if gguf_type == "f16":  # the checkpoint's own weights, bit for bit
        held = load_file(str(gpt2_model / "model.safetensors"))
        tensors = {t.name: t.data for t in reader.tensors}
        assert np.array_equal(tensors["token_embd.weight"], held["model.embed_tokens.weight"])
        assert np.array_equal(tensors["blk.1.ffn_down.weight"], held["model.layers.1.mlp.down_proj.weight"])


@pytest.mark.slow
def test_a_conversion_that_fails_says_the_converters_last_line_and_keeps_the_folder_there(converted, tmp_path):
    folder, report = converted["f16"]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(ModelError) as exc:
        gguf.convert(empty, folder, "f16")
    said = f"FileNotFoundError: [Errno 2] No such file or directory: '{empty / 'config.json'}'"
    assert str(exc.value) == f"llama.cpp could not convert {empty} to GGUF f16: {said}"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert _left_beside(folder.parent) == ["fp16", "gguf-f16", "gguf-q8_0"]
