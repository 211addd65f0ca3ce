"""A user's own weights: a local model folder and pre-quantized checkpoints.

Both are checked when the config is read (a one-line error naming the path when something is
wrong), then used in place: the model rule links a local folder's files into
resources/models/{model}/fp16, the quantize rule links a pre-quantized checkpoint's files into
the variant's folder and records what the checkpoint holds instead of quantizing again.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from speedsplit.models.checkpoint import ModelError, read_model_config

TOKENIZERS = ("tokenizer.json", "tokenizer.model")
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)\.qweight$")


def safetensors_keys(path: Path) -> list[str]:
    """The tensor names of one safetensors file, read from its header (no tensor is loaded)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as exc:
        raise ModelError(f"{path} is not a readable safetensors file ({exc})") from None
    return [k for k in header if k != "__metadata__"]


def inspect_folder(path: str | Path) -> dict:
    """What a model folder holds: architecture, dtype, weight size and quantization_config,
    after checking it has a config.json, a tokenizer and readable *.safetensors weights."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelError(f"{p} does not exist or is not a folder")
    cfg = read_model_config(p)
    if not any((p / name).is_file() for name in TOKENIZERS):
        raise ModelError(f"{p} has no tokenizer ({' or '.join(TOKENIZERS)})")
    shards = sorted(p.glob("*.safetensors"))
    if not shards:
        raise ModelError(f"{p} has no *.safetensors weights")
    for shard in shards:
        if not os.access(shard, os.R_OK):
            raise ModelError(f"{shard} is not readable")
    arch = (cfg.get("architectures") or [None])[0]
    if not arch:
        raise ModelError(f"{p}/config.json names no architecture (its 'architectures' list is empty)")
    return {
        "path": str(p.resolve()),
        "architecture": arch,
        "dtype": cfg.get("torch_dtype") or cfg.get("dtype"),
        "size_gib": round(sum(s.stat().st_size for s in shards) / 2**30, 3),
        "quantization_config": cfg.get("quantization_config"),
        "shards": [s.name for s in shards],
    }


def inspect_local(path: str | Path) -> dict:
    """A local FP16/BF16 model folder; a quantized one belongs under prequantized."""
    info = inspect_folder(path)
    q = info.pop("quantization_config") or {}
    if q:
        method = q.get("quant_method", "quantized")
        raise ModelError(
            f"{info['path']} is {method}-quantized: give it as prequantized.{method}, and the FP16 model it "
            "came from as the path"
        )
    return info


def inspect_quantized(path: str | Path, method: str, bits: int, group_size: int) -> dict:
    """A pre-quantized checkpoint, checked against the config's bits and group size: what it
    holds (bits, group size, act order, symmetry, which modules of how many layers)."""
    info = inspect_folder(path)
    q = info.pop("quantization_config") or {}
    where = info["path"]
    if q.get("quant_method") != method:
        raise ModelError(f"{where} is not a {method.upper()} checkpoint (quant_method {q.get('quant_method')!r})")
    # AutoAWQ's checkpoints say w_bit and q_group_size
    held_bits, held_group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
    if held_bits != bits:
        raise ModelError(f"{where} holds {held_bits}-bit weights, not the {bits} bits of quantization.bits")
    if held_group != group_size:
        raise ModelError(f"{where} has group size {held_group}, not the {group_size} of quantization.group_size")
    modules, layers = set(), set()
    for shard in info["shards"]:
        for key in safetensors_keys(Path(where) / shard):
            m = _LAYER.match(key)
            if m:
                layers.add(int(m.group(1)))
                modules.add(m.group(2))
    if not modules:
        raise ModelError(f"{where} holds no 4-bit .qweight tensors: its weights are not quantized")
    return {
        **info,
        "method": method,
        "bits": held_bits,
        "group_size": group_size,
        "desc_act": q.get("desc_act"),
        "sym": q.get("sym", not q["zero_point"] if "zero_point" in q else None),  # AWQ says zero_point
        "checkpoint_format": q.get("checkpoint_format") or q.get("version"),
        "modules": sorted(modules),
        "quantized_layers": len(layers),
    }


def link_files(src: Path, dst: Path) -> None:
    """Every file of src's top level as a link in dst (the weights are used in place), but
    speedsplit's own records (speedsplit-*.json): dst gets its own, and nothing written in dst
    ever reaches the user's folder through a link."""
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith("speedsplit-"):
            (dst / f.name).symlink_to(f.resolve())


def adopt_local(entry: dict, out_dir: str | Path) -> dict:
    """The model rule for source local: out_dir links the folder's files, with what it holds."""
    from speedsplit.core.results import atomic_dir

    info = inspect_local(entry["path"])
    with atomic_dir(out_dir) as tmp:
        link_files(Path(info["path"]), tmp)
        record = {"source": "local", **{k: v for k, v in info.items() if k != "shards"}}
        (tmp / "speedsplit-model.json").write_text(json.dumps(record, indent=2))
    return record
