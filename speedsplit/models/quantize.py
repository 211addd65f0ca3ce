"""GPTQ INT4 quantization through GPTQModel (the maintained successor of auto-gptq, which no
longer imports with transformers 5), and the INT4-vs-FP16 quality check.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from speedsplit.core.results import atomic_dir
from speedsplit.models.checkpoint import GPTQ_MODULES, ModelError, is_dummy, model_info, read_model_config

# Calibration sequences per forward pass. What GPTQ and AWQ gather are sums over tokens, so
# batching changes how many small launches the model makes, not the answer: on the tiny
# model (128 x 512 tokens, a CPU), 16 at a time wrote the same AWQ checkpoint bit for bit in
# 14.6 s against 28.8, and a GPTQ checkpoint differing in 8 of 294,912 codes (the Hessian
# summed in another order; same perplexity to 0.005%) in 3.8 s against 9.8. On an H200 the
# Llama-3.1-8B shape's AWQ gained little (34 -> 32 s a layer with the vectorised packer below,
# docs/evidence/h200-2026-12-02-fp8/): its time there goes elsewhere.
CALIBRATION_BATCH = 16


def token_samples(tokenizer, n: int, length: int, seed: int, text_path: str = "") -> list[list[int]]:
    """n sequences of `length` token ids: windows of a local text file, else random tokens
    of the vocabulary (seeded)."""
    rng = random.Random(seed)
    if text_path:
        path = Path(text_path)
        if not path.is_file():
            raise ModelError(f"calibration text {text_path} does not exist")
        ids = tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False)
        if len(ids) < length:
            raise ModelError(f"calibration text {text_path} has {len(ids)} tokens, fewer than {length}")
        starts = [rng.randrange(0, len(ids) - length + 1) for _ in range(n)]
        return [ids[s : s + length] for s in starts]
    specials = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in specials]
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(n)]


def own_texts(fp16_dir: Path, calibration_text: str) -> tuple[str, str]:
    """The texts to calibrate on and to check quality on: the config's file for both, else a
    trained model's own (a sample of its training text; its held-out text), else none
    (random tokens)."""
    from speedsplit.models.train import HELD_OUT_TEXT, TRAIN_SAMPLE_TEXT

    if calibration_text:
        return calibration_text, calibration_text
    train, held = Path(fp16_dir) / TRAIN_SAMPLE_TEXT, Path(fp16_dir) / HELD_OUT_TEXT
    return (str(train) if train.is_file() else ""), (str(held) if held.is_file() else "")


def gptq_config_block(bits: int, group_size: int, desc_act: bool) -> dict:
    return {
        "bits": bits,
        "group_size": group_size,
        "desc_act": desc_act,
        "sym": True,
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
    }


def quantize(
    fp16_dir: str | Path,
    out_dir: str | Path,
    *,
    method: str = "gptqmodel",
    bits: int = 4,
    group_size: int = 128,
    desc_act: bool = False,
    calibration_samples: int = 32,
    calibration_tokens: int = 256,
    eval_samples: int = 8,
    seed: int = 0,
    calibration_text: str = "",
    prequantized: str = "",
    fmt: str = "gptq",
) -> dict:
    """Quantize fp16_dir into out_dir in fmt (gptq or awq, both with GPTQModel, on a CPU or a
    CUDA card); returns the report (time, settings, quality). With prequantized (a checkpoint
    folder of that format), that checkpoint is checked against bits and group_size, linked into
    out_dir and measured against fp16_dir instead."""
    fp16_dir, out_dir = Path(fp16_dir).resolve(), Path(out_dir).resolve()
    read_model_config(fp16_dir)
    if prequantized:
        return _adopt(fp16_dir, out_dir, prequantized, fmt, bits, group_size, eval_samples, calibration_tokens, seed)
    settings = {
        "bits": bits,
        "group_size": group_size,
        "desc_act": desc_act if fmt == "gptq" else False,
        "sym": fmt == "gptq",  # AWQ: asymmetric, with zero points
        "calibration_samples": calibration_samples,
        "calibration_tokens": calibration_tokens,
        "seed": seed,
        "calibration_source": calibration_text or "random tokens of the vocabulary",
        "calibration_batch": CALIBRATION_BATCH,
    }
    if method == "dummy" or is_dummy(fp16_dir):
        if fmt != "gptq":
            raise ModelError(
                f"quantization method dummy writes a GPTQ config only; {fmt} needs method gptqmodel "
                f"or a prequantized.{fmt} checkpoint"
            )
        if model_info(fp16_dir).get("source") != "synthetic":
            raise ModelError(f"quantization method dummy needs a synthetic model; {fp16_dir} is not one")
        return _dummy_gptq(fp16_dir, out_dir, settings)

    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(min(os.cpu_count() or 1, 4)))
    # On a CUDA card GPTQModel builds a fused block update with nvcc on first use; its torch
    # path needs nothing built on the host (GPTQMODEL_DISABLE_GPTQ_CUDA=0 builds it).
    os.environ.setdefault("GPTQMODEL_DISABLE_GPTQ_CUDA", "1")
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    cuda = torch.cuda.is_available()

    tok = AutoTokenizer.from_pretrained(str(fp16_dir))
    calib_text, eval_text = own_texts(fp16_dir, calibration_text)
    settings["calibration_source"] = calib_text or settings["calibration_source"]
    calib = token_samples(tok, calibration_samples, calibration_tokens, seed, calib_text)
    held_out = token_samples(tok, eval_samples, calibration_tokens, seed + 1, eval_text)
    scratch = Path(tempfile.mkdtemp(prefix="speedsplit-gptq-"))
    try:
        with atomic_dir(out_dir) as tmp, contextlib.chdir(scratch):  # GPTQModel writes logs/ into cwd
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            qcfg, backend = (
                (QuantizeConfig(bits=bits, group_size=group_size, desc_act=desc_act, sym=True), None)
                if fmt == "gptq"
                else _awq_config(bits, group_size)
            )
            model = GPTQModel.load(str(fp16_dir), qcfg)
            with _vectorised_awq_pack():
                model.quantize(
                    [{"input_ids": ids, "attention_mask": [1] * len(ids)} for ids in calib],
                    batch_size=CALIBRATION_BATCH,
                    tokenizer=tok,
                    **({"backend": backend} if backend else {}),
                )
            model.save(str(tmp))
            seconds = time.perf_counter() - t0
            peak = torch.cuda.max_memory_reserved() / 2**30 if cuda else None
            del model
            quality = quality_check(fp16_dir, tmp, held_out)
            report = {"method": "gptqmodel", "format": fmt, "settings": settings, "quantize_s": seconds}
            report["device"] = torch.cuda.get_device_name() if cuda else "cpu"
            report["peak_gpu_gib"] = peak  # what torch reserved on the card while quantizing and saving
            report["quality"] = quality
            (tmp / "speedsplit-quantization.json").write_text(json.dumps(report, indent=2))
            info = (
                json.loads((fp16_dir / "speedsplit-model.json").read_text())
                if (fp16_dir / "speedsplit-model.json").exists()
                else {}
            )
            (tmp / "speedsplit-model.json").write_text(json.dumps({**info, "variant": fmt}, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _awq_config(bits: int, group_size: int):
    """GPTQModel's AWQ in the GEMM format (what vLLM serves), packed by its torch kernel: its
    default packer on a card (AwqGEMMLinear) needs an AWQ extension built with nvcc, and none
    runs on a CPU; both write the same GEMM layout. Returns (config, backend)."""
    from gptqmodel.quantization.config import FORMAT, AWQConfig
    from gptqmodel.utils.backend import BACKEND

    # Asymmetric, with zero points, as AutoAWQ's checkpoints are (zero_point: true).
    return AWQConfig(bits=bits, group_size=group_size, sym=False, format=FORMAT.GEMM), BACKEND.AWQ_TORCH


@contextlib.contextmanager
def _vectorised_awq_pack():
    """GPTQModel's AWQ packer (AwqTorchLinear.pack) with its per-input-column Python loop done
    as one tensor expression: the same operations on the same values, so the same bits
    (tests/models/test_quantize.py compares them), 1.5x faster for one 8B-shaped layer on a
    CPU; on the H200, AWQ's time per layer went from about 50 s to 34 s with it. GPTQModel's
    own method is back when the block ends."""
    import torch
    from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear
    from gptqmodel.quantization.awq.utils.packing_utils import pack_awq

    def pack(self, linear, scales, zeros, g_idx=None):
        scales, zeros = scales.t().contiguous(), zeros.t().contiguous()  # [groups, out]
        scale_zeros = zeros * scales
        dtype = scales.dtype if scales.dtype in (torch.float16, torch.bfloat16) else torch.float16
        self.register_buffer("scales", scales.clone().to(dtype))
        if linear.bias is not None:
            bias_dtype = linear.bias.dtype if linear.bias.dtype in (torch.float16, torch.bfloat16) else dtype
            self.register_buffer("bias", linear.bias.clone().to(bias_dtype))
        else:
            self.bias = None
        group = torch.arange(self.in_features, device=scales.device) // self.group_size  # of each input column
        codes = torch.round((linear.weight.data + scale_zeros[group].t()) / self.scales[group].t())
        qweight, qzeros = pack_awq(codes.to(torch.int32).t().contiguous(), zeros.to(torch.int32), self.bits)
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", qzeros)

    original = AwqTorchLinear.pack
    AwqTorchLinear.pack = pack
    try:
        yield
    finally:
        AwqTorchLinear.pack = original


def _adopt(fp16_dir: Path, out_dir: Path, path: str, fmt, bits, group_size, eval_samples, tokens, seed) -> dict:
    """A pre-quantized checkpoint (fmt: gptq or awq) used as it is: what it holds, and its
    quality against the FP16 model (when that has real weights)."""
    from transformers import AutoTokenizer

    from speedsplit.models.local import inspect_quantized, link_files

    info = inspect_quantized(path, fmt, bits, group_size)
    settings = {k: info[k] for k in ("bits", "group_size", "desc_act", "sym", "checkpoint_format", "modules")}
    settings["quantized_layers"] = info["quantized_layers"]
    with atomic_dir(out_dir) as tmp:
        link_files(Path(info["path"]), tmp)
        if is_dummy(fp16_dir):
            quality = {"status": "not measured: the FP16 model has no weights of its own (dummy)"}
        else:
            tok = AutoTokenizer.from_pretrained(str(fp16_dir))
            quality = quality_check(fp16_dir, tmp, token_samples(tok, eval_samples, tokens, seed + 1))
        report = {"method": "prequantized", "format": fmt, "path": info["path"], "settings": settings}
        report["quantize_s"] = None
        report["quality"] = quality
        (tmp / "speedsplit-model.json").write_text(json.dumps({**model_info(fp16_dir), "variant": fmt}, indent=2))
    return report


def _dummy_gptq(fp16_dir: Path, out_dir: Path, settings: dict) -> dict:
    """A GPTQ config over dummy weights: vLLM initialises real INT4 tensors itself. The
    explicit module list keeps vLLM from silently running every layer unquantized."""
    cfg = read_model_config(fp16_dir)
    cfg["quantization_config"] = {
        **gptq_config_block(settings["bits"], settings["group_size"], settings["desc_act"]),
        "modules_in_block_to_quantize": GPTQ_MODULES,
    }
    with atomic_dir(out_dir) as tmp:
        for f in fp16_dir.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "speedsplit-model.json"):
                shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        info = {**model_info(fp16_dir), "weights": "dummy", "variant": "gptq"}
        (tmp / "speedsplit-model.json").write_text(json.dumps(info, indent=2))
        report = {
            "method": "dummy",
            "settings": settings,
            "quantize_s": 0.0,
            "quality": {"status": "not applicable: dummy weights are initialised by the engine"},
        }
        (tmp / "speedsplit-quantization.json").write_text(json.dumps(report, indent=2))
    return report


def quality_check(fp16_dir: Path, q_dir: Path, held_out: list[list[int]]) -> dict:
    """Greedy next-token agreement and perplexity of INT4 against FP16 on held-out tokens.
    On a CUDA card both models sit on it (the reference in FP16) and a GPTQ or AWQ checkpoint
    runs on GPTQModel's torch kernel for it, which needs nothing compiled on the host."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    ref = AutoModelForCausalLM.from_pretrained(
        str(fp16_dir), dtype=torch.float16 if cuda else torch.float32, device_map="cuda" if cuda else None
    )
    method = read_model_config(q_dir).get("quantization_config", {}).get("quant_method")
    torch_kernel = {"gptq": BACKEND.GPTQ_TORCH, "awq": BACKEND.AWQ_TORCH}.get(method)
    q = GPTQModel.load(str(q_dir), **({"backend": torch_kernel} if cuda and torch_kernel else {}))
    agree = total = 0
    nll_ref = nll_q = 0.0
    with torch.no_grad():
        for ids in held_out:
            x = torch.tensor([ids])
            lr = ref(x.to(ref.device)).logits[0, :-1].float().cpu()
            lq = q.model(x.to(q.model.device)).logits[0, :-1].float().cpu()
            target = x[0, 1:]
            agree += int((lr.argmax(-1) == lq.argmax(-1)).sum())
            total += len(target)
            nll_ref += float(torch.nn.functional.cross_entropy(lr, target, reduction="sum"))
            nll_q += float(torch.nn.functional.cross_entropy(lq, target, reduction="sum"))
    return {
        "status": "measured",
        "tokens": total,
        "token_agreement": agree / total,
        "perplexity_fp16": math.exp(nll_ref / total),
        "perplexity_int4": math.exp(nll_q / total),
    }
