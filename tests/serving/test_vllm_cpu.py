"""AtenInt4, the vLLM kernel for GPTQ INT4 on CPUs whose vLLM build lacks its own: when it is
chosen, and that it computes what the GPTQ checkpoint means (the tiny model's random logits
are too flat for a served answer to show a wrong dequantisation; this does)."""

import subprocess
import sys
from pathlib import Path

import pytest

from speedsplit.serving.vllm_cpu import choose_aten


def test_it_serves_only_where_vllms_own_op_is_missing_unless_told():
    assert choose_aten(has_vllm_op=False, choice="auto") == (True, None)
    use, why = choose_aten(has_vllm_op=True, choice="auto")
    assert not use and "cpu_gemm_wna16" in why
    assert choose_aten(has_vllm_op=True, choice="aten") == (True, None)
    assert choose_aten(has_vllm_op=False, choice="vllm")[0] is False
    assert "not one of" in choose_aten(has_vllm_op=False, choice="fast")[1]


@pytest.mark.slow
@pytest.mark.parametrize("zero_points", [False, True])
def test_the_kernel_computes_the_gptq_weights_dequantised(monkeypatch, zero_points):
    """GPTQ layout (codes packed eight to an int32 along the input dimension, a scale per group
    of 128 inputs, zero points packed along the output): the kernel's output is x @ W with
    W = scale * (code - zero), zero 8 for symmetric GPTQ, within bfloat16's precision."""
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import pack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    from speedsplit.serving.vllm_cpu import _kernel_class

    monkeypatch.setenv("SPEEDSPLIT_CPU_INT4", "aten")  # this CPU may have vLLM's own op
    k, n, group = 256, 96, 128
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    scales = torch.rand(k // group, n, generator=gen) * 0.02 + 0.001
    points = torch.randint(0, 16, (k // group, n), generator=gen, dtype=torch.int32) if zero_points else None
    wtype = scalar_types.uint4 if zero_points else scalar_types.uint4b8

    layer = torch.nn.Module()

    def param(data, **dims):
        p = torch.nn.Parameter(data, requires_grad=False)
        for key, value in dims.items():
            setattr(p, key, value)
        return p

    layer.qweight = param(pack_quantized_values_into_int32(codes, wtype, 0), input_dim=0, packed_dim=0, output_dim=1)
    layer.scales = param(scales.to(torch.bfloat16), input_dim=0, output_dim=1)
    if zero_points:
        layer.qzeros = param(
            pack_quantized_values_into_int32(points, wtype, 1), input_dim=0, packed_dim=1, output_dim=1
        )
    config = MPLinearLayerConfig(
        full_weight_shape=(k, n),
        partition_weight_shape=(k, n),
        weight_type=wtype,
        act_type=torch.bfloat16,
        group_size=group,
        zero_points=zero_points,
    )
    kernel = _kernel_class()(config, "qweight", "scales", "qzeros" if zero_points else None)
    kernel.process_weights_after_loading(layer)

    zero = points.float() if zero_points else torch.full((k // group, n), 8.0)
    weight = (codes.float() - zero.repeat_interleave(group, 0)) * scales.to(torch.bfloat16).float().repeat_interleave(
        group, 0
    )
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    want = x.float() @ weight
    got = kernel.apply_weights(layer, x)
    assert got.shape == (5, n) and got.dtype == torch.bfloat16
    assert ((got.float() - want).abs().max() / want.abs().max()).item() < 2e-2
    assert layer.aten_int4_weight.dtype == torch.uint8 and layer.aten_int4_weight.numel() == k * n // 2  # 4 bits each


AMX = "amx_tile" in Path("/proc/cpuinfo").read_text()
XCOMP_PERM_PROBE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
def granted():  # arch_prctl(ARCH_GET_XCOMP_PERM): is XFEATURE_XTILEDATA (bit 18) ours?
    mask = ctypes.c_uint64(0)
    assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0
    return bool(mask.value >> 18 & 1)
before = granted()
from speedsplit.serving import vllm_cpu
vllm_cpu.register()
print(before, granted())
"""


@pytest.mark.slow
@pytest.mark.skipif(not AMX, reason="this CPU has no AMX")
def test_the_plugin_asks_for_amx_tiles_before_vllms_cpu_kernels_use_them():
    """Without them vLLM's CPU attention dies of SIGILL at its first request (exit code -4)."""
    out = subprocess.run([sys.executable, "-c", XCOMP_PERM_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["False", "True"]
