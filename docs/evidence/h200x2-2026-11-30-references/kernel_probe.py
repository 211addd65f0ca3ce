"""Which of vLLM's INT4 weight-only (mixed-precision) kernels can run a GPTQ 4-bit, group-128
checkpoint of the Llama-3.1-8B shape on this machine's GPU, in vLLM's own priority order, and
why not where one cannot: each kernel's own can_implement() and minimum capability, the checks
vLLM makes before it picks one. Prints one JSON object per kernel.

    PYTHONPATH=/tmp/site python3 kernel_probe.py
"""

import json

import torch
from vllm.model_executor.kernels.linear import _POSSIBLE_KERNELS
from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
from vllm.platforms import current_platform
from vllm.scalar_type import scalar_types

# (in, out) of each linear layer of the 8B shape at tensor parallel 1 (vLLM fuses q/k/v and gate/up).
LAYERS = {"qkv_proj": (4096, 6144), "o_proj": (4096, 4096), "gate_up_proj": (4096, 28672), "down_proj": (14336, 4096)}


def main() -> None:
    major, minor = current_platform.get_device_capability()
    capability = major * 10 + minor
    print(json.dumps({"device": torch.cuda.get_device_name(0), "capability": capability}))
    for kernel in _POSSIBLE_KERNELS[current_platform._enum]:
        reasons = []
        if kernel.get_min_capability() > capability:
            reasons.append(f"needs capability {kernel.get_min_capability()}")
        for name, shape in LAYERS.items():
            config = MPLinearLayerConfig(
                full_weight_shape=shape,
                partition_weight_shape=shape,
                weight_type=scalar_types.uint4b8,
                act_type=torch.float16,
                group_size=128,
                zero_points=False,
                has_g_idx=False,
            )
            try:
                ok, why = kernel.can_implement(config)
            except Exception as exc:  # a kernel whose check itself fails cannot be chosen either
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if not ok:
                reasons.append(f"{name}: {why}")
        print(json.dumps({"kernel": kernel.__name__, "can_run": not reasons, "why_not": sorted(set(reasons))}))


if __name__ == "__main__":
    main()
