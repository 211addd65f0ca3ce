import pytest

from speedsplit.measuring import hardware
from speedsplit.models.checkpoint import shape_config
from speedsplit.planning import roofline as R


def test_llama_8b_parameter_count_and_weight_bytes():
    cfg = shape_config("llama-3.1-8b")
    p = R.param_counts(cfg)
    assert p["linear"] + p["embedding"] + p["norms"] == pytest.approx(8.03e9, rel=0.005)
    fp16 = R.weight_bytes(cfg, "fp16") / 2**30
    assert fp16 == pytest.approx(14.96, rel=0.01)  # what vLLM reports loading for this shape
    int4 = (
        R.weight_bytes({**cfg, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}, "gptq")
        / 2**30
    )
    assert 5.0 < int4 < 5.6  # vLLM reported 5.3 GiB for the GPTQ INT4 model


def test_kv_bytes_per_token_llama_8b():
    assert R.kv_bytes_per_token(shape_config("llama-3.1-8b")) == 2 * 32 * 8 * 128 * 2


def test_mbu_counts_weights_once_and_kv_per_sequence():
    cfg = shape_config("llama-3.1-8b")
    w = R.weight_bytes(cfg, "fp16")
    kv = R.kv_bytes_per_token(cfg)
    step = 0.01
    got = R.mbu(cfg, "fp16", users=64, prompt_tokens=512, output_tokens=256, step_s=step, bandwidth_gb_s=4000)
    assert got == pytest.approx((w + 64 * 640 * kv) / step / 4e12)
    # tensor parallelism splits the bytes over cards; instances split the users
    tp2 = R.mbu(cfg, "fp16", 64, 512, 256, step, 4000, tensor_parallel=2)
    assert tp2 == pytest.approx(got / 2)
    assert R.mbu(cfg, "fp16", 64, 512, 256, None, 4000) is None


def test_cpu_copy_bandwidth_is_measured():
    out = hardware.copy_bandwidth("cpu", size_mib=64, repeats=3)
    assert out["gb_s_median"] > 0.1 and out["bytes_per_copy"] == 2 * 64 * 2**20
