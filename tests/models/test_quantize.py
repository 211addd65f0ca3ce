"""GPTQModel as the quantize rule drives it: what speedsplit changes in how it runs (batched
calibration, the vectorised AWQ packer) changes no bit of what it writes."""

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("bias", [False, True])
def test_the_vectorised_awq_packer_writes_gptqmodels_bits(bias):
    """Same qweight, qzeros, scales and bias as GPTQModel's own AwqTorchLinear.pack, on a layer
    whose input size spans several groups; GPTQModel's method is restored afterwards."""
    import torch
    from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear

    from speedsplit.models.quantize import _vectorised_awq_pack

    k, n, group = 512, 96, 128
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(k, n, bias=bias).half()
    with torch.no_grad():
        linear.weight.copy_((torch.randn(n, k, generator=gen) * 0.05).half())
    scales = (torch.rand(n, k // group, generator=gen) * 0.01 + 0.001).half()
    zeros = torch.randint(0, 16, (n, k // group), generator=gen).half()

    def packed(pack_with_ours: bool) -> AwqTorchLinear:
        layer = AwqTorchLinear(bits=4, group_size=group, sym=False, desc_act=False, in_features=k, out_features=n)
        if pack_with_ours:
            with _vectorised_awq_pack():
                layer.pack(linear, scales, zeros)
        else:
            layer.pack(linear, scales, zeros)
        return layer

    original = AwqTorchLinear.pack
    theirs, ours = packed(False), packed(True)
    assert AwqTorchLinear.pack is original
    for name in ("qweight", "qzeros", "scales"):
        assert torch.equal(getattr(theirs, name), getattr(ours, name)), name
    assert (theirs.bias is None) == (ours.bias is None) == (not bias)
    if bias:
        assert torch.equal(theirs.bias, ours.bias)
