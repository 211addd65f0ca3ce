"""The probe of 2026-12-02: GPTQModel's AWQ on the 8B shape with its per-column packer replaced.

As it ran on the card, laid out to the project's lint (same statements; the import of
`quantize` moved up: the class attribute is patched before `quantize` is called either way).
The packer that came of it is `speedsplit.models.quantize._vectorised_awq_pack`.
"""

import time

import torch
from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear
from gptqmodel.quantization.awq.utils.packing_utils import pack_awq

from speedsplit.models.quantize import quantize


def pack(self, linear, scales, zeros, g_idx=None):
    scales = scales.t().contiguous()
    zeros = zeros.t().contiguous()
    scale_zeros = zeros * scales
    sd = scales.dtype if scales.dtype in (torch.float16, torch.bfloat16) else torch.float16
    self.register_buffer("scales", scales.clone().to(sd))
    self.bias = None
    g = torch.arange(self.in_features, device=scales.device) // self.group_size
    w = linear.weight.data
    iw = torch.round((w + scale_zeros[g].t()) / self.scales[g].t()).to(torch.int32).t().contiguous()
    qw, qz = pack_awq(iw, zeros.to(torch.int32), self.bits)
    self.register_buffer("qweight", qw)
    self.register_buffer("qzeros", qz)


AwqTorchLinear.pack = pack
t = time.time()
r = quantize(
    "resources/models/llama-3.1-8b/fp16",
    "/tmp/awq-exp",
    fmt="awq",
    calibration_samples=128,
    calibration_tokens=512,
    eval_samples=8,
)
print("done", time.time() - t, r)
