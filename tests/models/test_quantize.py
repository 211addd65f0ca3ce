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


@pytest.mark.slow
def test_vllm_serves_the_awq_checkpoint_gptqmodel_makes_on_a_cpu(tiny_model, tmp_path):
    """The quantize rule's AWQ checkpoint on the vllm-awq stack as a bench job runs it: every
    request answered, the kernel vLLM reports recorded and matching the stack's expectation
    (CPUWNA16 where vLLM's CPU build has its INT4 op, AtenInt4 elsewhere), the weights AWQ."""
    from conftest import REPO, measure_alone

    from speedsplit.models.quantize import quantize
    from speedsplit.planning import config as C

    from speedsplit.planning import grid as G

    awq = tmp_path / "awq-w4g128"
    quantize(tiny_model, awq, fmt="awq", calibration_samples=4, calibration_tokens=64, eval_samples=1)
    cfg = C.load(REPO / "config/config.yaml")
    stack = G.stack_params(cfg, "tiny", "vllm-awq", "tp1")
    assert stack["expect_kernel"] == "CPUWNA16|AtenInt4"
    cell = G.cell_params(cfg, G.cell_by_name(cfg, "u2-wide-greedy"))
    cell.update(min_measured_s=0.0)
    res, _ = measure_alone(stack, cell, awq, tmp_path / "run", startup_timeout_s=300.0)
    assert res.status == "ok", res.error
    assert res.summary.completed == 2 * 8 and res.summary.wrong_output_length == 0
    assert res.engine.linear_kernel in ("CPUWNA16LinearKernel", "AtenInt4CPULinearKernel") and res.kernel_ok
    assert res.weights.variant == "awq"
