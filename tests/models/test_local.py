"""Your own weights: a local model folder and a pre-quantized GPTQ checkpoint, checked when the
config is read (one line naming the key and the path) and used in place."""

import json
import shutil
import struct

import pytest
import yaml
from conftest import REPO

from speedsplit.models.checkpoint import GPTQ_MODULES, acquire, check_model
from speedsplit.models.local import inspect_quantized, safetensors_keys
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning.experiment import Experiment


def config_with(model: dict, **top) -> Experiment:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["models"] = {"mine": {"max_model_len": 512, **model}}
    cfg["benchmark"]["models"] = ["mine"]
    return C.validate({**cfg, **top})


def copy_without(src, dst, *names):
    shutil.copytree(src, dst)
    for name in names:
        for f in dst.glob(name):
            f.unlink()
    return dst


def test_a_local_folder_is_checked_and_linked_in_place(tiny_model, tmp_path):
    cfg = config_with({"source": "local", "path": str(tiny_model)})
    out = tmp_path / "resources/models/mine/fp16"
    info = acquire(cfg.filled()["models"]["mine"], out)  # as the model rule gives it
    assert info["source"] == "local" and info["architecture"] == "LlamaForCausalLM"
    assert info["dtype"] in ("float16", "bfloat16") and info["size_gib"] > 0
    weights = next(out.glob("*.safetensors"))
    assert weights.is_symlink() and weights.resolve().parent == tiny_model.resolve()  # never copied
    check_model(out, "fp16")
    assert json.loads((out / "speedsplit-model.json").read_text())["path"] == str(tiny_model.resolve())
    # what a bench result records of the folder it served (it refused "local" until 2026-12-02)
    from speedsplit.core.record import ModelSource
    from speedsplit.models.checkpoint import model_info

    assert ModelSource(**model_info(out)).path == str(tiny_model.resolve())


@pytest.mark.parametrize(
    "remove, says",
    [
        ("config.json", "has no config.json"),
        ("tokenizer.*", "has no tokenizer (tokenizer.json or tokenizer.model)"),
        ("*.safetensors", "has no *.safetensors weights"),
    ],
)
def test_an_incomplete_local_folder_is_one_line_naming_key_and_path(tiny_model, tmp_path, remove, says):
    folder = copy_without(tiny_model, tmp_path / "m", remove)
    with pytest.raises(ConfigError) as err:
        config_with({"source": "local", "path": str(folder)})
    msg = str(err.value)
    assert msg.startswith("config error at models.mine.path: ") and str(folder) in msg and says in msg
    assert "\n" not in msg


def test_a_local_model_needs_a_folder_that_exists_and_a_path_is_only_for_local(tmp_path):
    with pytest.raises(ConfigError, match="models.mine.path: .*/nowhere does not exist"):
        config_with({"source": "local", "path": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match="models.mine.path: a local model needs the folder's path"):
        config_with({"source": "local"})
    with pytest.raises(ConfigError, match="models.mine.path: a path is for source local, not synthetic"):
        config_with({"source": "synthetic", "path": str(tmp_path)})


def gptq_folder(tiny_model, tmp_path, group_size=128, bits=4, qweights=True):
    """A GPTQ-shaped checkpoint folder: the tiny model's files, a gptq quantization_config and
    (qweights) a safetensors file holding .qweight tensors of two layers."""
    folder = copy_without(tiny_model, tmp_path / f"gptq-{bits}-{group_size}-{qweights}", "*.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": False}
    (folder / "config.json").write_text(json.dumps(cfg))
    names = ["model.layers.0.self_attn.q_proj.qweight", "model.layers.1.mlp.down_proj.qweight"]
    names = names if qweights else ["model.layers.0.self_attn.q_proj.weight"]
    header = {n: {"dtype": "I32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    blob = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4 * len(names)))
    return folder


def test_a_prequantized_checkpoint_is_checked_against_bits_and_group_size(tiny_model, tmp_path):
    good = gptq_folder(tiny_model, tmp_path)
    assert safetensors_keys(good / "model.safetensors")[0].endswith(".qweight")
    held = inspect_quantized(good, "gptq", 4, 128)
    assert held["modules"] == ["mlp.down_proj", "self_attn.q_proj"] and held["quantized_layers"] == 2
    cfg = config_with({"prequantized": {"gptq": str(good)}})
    assert cfg.models["mine"].prequantized.gptq == str(good)
    cases = [
        (gptq_folder(tiny_model, tmp_path, group_size=32), "has group size 32, not the 128 of quantization.group_size"),
        (gptq_folder(tiny_model, tmp_path, bits=8), "holds 8-bit weights, not the 4 bits of quantization.bits"),
        (gptq_folder(tiny_model, tmp_path, qweights=False), "holds no 4-bit .qweight tensors"),
        (tiny_model, "is not a GPTQ checkpoint (quant_method None)"),
    ]
    for folder, says in cases:
        with pytest.raises(ConfigError) as err:
            config_with({"prequantized": {"gptq": str(folder)}})
        msg = str(err.value)
        assert msg.startswith("config error at models.mine.prequantized.gptq: ") and says in msg, msg
        assert str(folder.resolve()) in msg
    with pytest.raises(ConfigError, match="models.mine.path: .* is gptq-quantized: give it as prequantized.gptq"):
        config_with({"source": "local", "path": str(good)})
    with pytest.raises(ConfigError, match="prequantized.gptq: quantization.method dummy"):
        config_with({"prequantized": {"gptq": str(good)}}, quantization={"method": "dummy"})


@pytest.mark.slow
def test_a_real_gptq_checkpoint_is_used_as_it_is_and_measured_against_its_fp16_model(tiny_model, tmp_path):
    """GPTQModel quantizes the tiny model once; given as prequantized, the quantize step links
    it (no second quantization), records what it holds and its quality against the FP16 model."""
    from speedsplit.models.quantize import quantize

    made = tmp_path / "made-elsewhere"
    made_report = quantize(tiny_model, made, calibration_samples=8, calibration_tokens=64, eval_samples=2)
    assert made_report["device"] == "cpu" and made_report["peak_gpu_gib"] is None  # card memory on CUDA only
    assert made_report["quantize_s"] > 0
    out = tmp_path / "resources/models/tiny/gptq-w4g128"
    report = quantize(tiny_model, out, eval_samples=2, calibration_tokens=64, prequantized=str(made))
    assert report["method"] == "prequantized" and report["quantize_s"] is None
    s = report["settings"]
    assert (s["bits"], s["group_size"], s["desc_act"]) == (4, 128, False)
    assert "self_attn.q_proj" in s["modules"] and "mlp.down_proj" in s["modules"]
    assert report["quality"]["status"] == "measured" and report["quality"]["token_agreement"] > 0
    weights = next(out.glob("*.safetensors"))
    assert weights.is_symlink() and weights.resolve().parent == made.resolve()
    check_model(out, "gptq")


def test_fp8_and_awq_stacks_say_in_one_line_what_the_platform_cannot_do(tiny_model, tmp_path):
    """FP8 needs a CUDA card's FP8 units; AWQ is made by GPTQModel on a CPU or a card, or given
    as a checkpoint; method dummy writes GPTQ only."""
    chains = {"fmt": ["vllm-fp16", "vllm-fp8"]}
    with pytest.raises(ConfigError) as err:
        config_with({}, chains=chains, platform="cpu", benchmark={"models": ["mine"], "stacks": []})
    assert str(err.value) == (
        "config error at stacks.vllm-fp8.variant: fp8 (vLLM's dynamic W8A8) needs a CUDA card with FP8 units "
        "(Ada, Hopper or newer); this config's platform is cpu"
    )
    cuda = config_with({}, chains=chains, platform="cuda", benchmark={"models": ["mine"], "stacks": []})
    from speedsplit.planning import grid, plan

    assert grid.chain_steps(cuda)["fmt"] == ["FP8 weights + activations"]
    assert plan.variant_dir(cuda, "vllm-fp8") == "fp16"  # vLLM quantizes the FP16 weights as it loads them
    awq = {"awq": ["vllm-fp16", "vllm-awq"]}
    made_here = config_with({}, chains=awq, platform="cpu", benchmark={"models": ["mine"], "stacks": []})
    assert made_here.quantization.method == "gptqmodel"  # the quantize rule makes it
    with pytest.raises(ConfigError, match="quantization.method: dummy writes GPTQ configs only"):
        config_with({}, chains=awq, platform="cuda", quantization={"method": "dummy"}, benchmark={"models": ["mine"]})
    folder = gptq_folder(tiny_model, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    awq_given = {"prequantized": {"awq": str(folder)}}
    ok = config_with(awq_given, chains=awq, platform="cpu", benchmark={"models": ["mine"]})
    assert plan.variant_dir(ok, "vllm-awq") == "awq-w4g128"
    assert grid.chain_steps(ok)["awq"] == ["INT4 weights + kernel"]
    chains = {**awq, "x": ["vllm-marlin", "vllm-awq"]}
    both = config_with(awq_given, chains=chains, platform="cpu", benchmark={"models": ["mine"]})
    assert grid.chain_steps(both)["x"] == ["INT4 format"]


@pytest.mark.slow
def test_awq_is_quantized_by_gptqmodel_on_a_cpu_and_dummy_writes_gptq_only(tiny_model, tmp_path):
    """AWQ as vLLM serves it: GEMM layout, 4 bit, group 128, zero points, every linear layer of
    every block; dummy quantization cannot make it."""
    from speedsplit.models.checkpoint import ModelError
    from speedsplit.models.quantize import quantize

    with pytest.raises(ModelError, match="dummy writes a GPTQ config only; awq needs"):
        quantize(tiny_model, tmp_path / "dummy", fmt="awq", method="dummy")
    assert not (tmp_path / "dummy").exists()
    report = quantize(
        tiny_model, tmp_path / "awq", fmt="awq", calibration_samples=4, calibration_tokens=64, eval_samples=2
    )
    assert report["method"] == "gptqmodel" and report["format"] == "awq" and report["settings"]["sym"] is False
    assert report["quality"]["status"] == "measured" and report["quality"]["token_agreement"] > 0
    check_model(tmp_path / "awq", "awq")
    held = inspect_quantized(tmp_path / "awq", "awq", 4, 128)
    assert (held["checkpoint_format"], held["sym"]) == ("gemm", False)
    assert held["modules"] == sorted(GPTQ_MODULES) and held["quantized_layers"] == 2


def test_nothing_is_written_into_the_users_folders(tiny_model, tmp_path):
    """The linked folders get their own records; the user's files stay byte for byte."""
    user = copy_without(tiny_model, tmp_path / "user", "nothing")
    before = {f.name: f.read_bytes() for f in user.iterdir()}
    acquire({"source": "local", "path": str(user)}, tmp_path / "fp16")
    assert {f.name: f.read_bytes() for f in user.iterdir()} == before
    assert not (tmp_path / "fp16" / "speedsplit-model.json").is_symlink()
