"""Model acquisition: hub download at a pinned revision, or a synthesised model of a named shape.

A synthetic model is a real checkpoint (config, tokenizer, seeded random FP16 weights) that every
stack loads like a downloaded one; throughput does not depend on weight values.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
from pathlib import Path

from speedsplit.core.errors import UserError
from speedsplit.core.results import atomic_dir

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
GPTQ_MODULES = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]


def _shape(
    *,
    arch: str,
    model_type: str,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    max_positions: int,
    rope_theta: float,
    rms_eps: float = 1e-5,
    **extra,
) -> dict:
    return dict(
        architectures=[arch],
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        rope_theta=rope_theta,
        rms_norm_eps=rms_eps,
        tie_word_embeddings=False,
        **extra,
    )


# Published architecture shapes (config.json of the public checkpoints), without weights.
SHAPES: dict[str, dict] = {
    # head_dim 32: vLLM's CPU attention needs head_dim in {32, 64, 80, ...}
    "tiny": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=128,
        intermediate=256,
        layers=2,
        heads=4,
        kv_heads=2,
        vocab=1024,
        max_positions=4096,
        rope_theta=10000.0,
    ),
    # a draft for the tiny shape's speculative decoding: the same vocabulary, a quarter the width
    "tiny-draft": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=64,
        intermediate=128,
        layers=1,
        heads=2,
        kv_heads=1,
        vocab=1024,
        max_positions=4096,
        rope_theta=10000.0,
    ),
    # A model that has learned something at a size where serving is not all overhead (about
    # 340 million parameters; trained on a card: models/train.py), and its draft (the same
    # vocabulary, about 18 million: a learnt tokenizer of the same size on the same text).
    "small": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=1024,
        intermediate=2816,
        layers=24,
        heads=16,
        kv_heads=4,
        vocab=32000,
        max_positions=4096,
        rope_theta=10000.0,
    ),
    "small-draft": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=256,
        intermediate=768,
        layers=2,
        heads=4,
        kv_heads=2,
        vocab=32000,
        max_positions=4096,
        rope_theta=10000.0,
    ),
    "llama-3.1-8b": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=4096,
        intermediate=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        vocab=128256,
        max_positions=131072,
        rope_theta=500000.0,
    ),
    "mistral-7b": _shape(
        arch="MistralForCausalLM",
        model_type="mistral",
        hidden=4096,
        intermediate=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        vocab=32768,
        max_positions=32768,
        rope_theta=1000000.0,
        sliding_window=None,
    ),
    "qwen2.5-7b": _shape(
        arch="Qwen2ForCausalLM",
        model_type="qwen2",
        hidden=3584,
        intermediate=18944,
        layers=28,
        heads=28,
        kv_heads=4,
        vocab=152064,
        max_positions=32768,
        rope_theta=1000000.0,
        rms_eps=1e-6,
    ),
    "llama-3.1-70b": _shape(
        arch="LlamaForCausalLM",
        model_type="llama",
        hidden=8192,
        intermediate=28672,
        layers=80,
        heads=64,
        kv_heads=8,
        vocab=128256,
        max_positions=131072,
        rope_theta=500000.0,
    ),
}


# the weight variants that hold 4-bit checkpoints (config.json's quant_method is the variant)
INT4_FORMATS = ("gptq", "awq")


class ModelError(UserError, RuntimeError):
    """A model cannot be had or is not what it should be; one-line message."""


def shape_config(shape: str) -> dict:
    if shape not in SHAPES:
        raise ModelError(f"unknown model shape {shape!r} (known: {', '.join(SHAPES)})")
    cfg = copy.deepcopy(SHAPES[shape])  # its lists too: a caller's edit never reaches the published shape
    cfg.update(bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float16", hidden_act="silu")
    return cfg


def build_tokenizer(vocab_size: int, out_dir: Path) -> None:
    """A word-level tokenizer over the whole vocabulary: one word is exactly one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"▁w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
        model_max_length=1 << 20,
    )
    fast.save_pretrained(out_dir)


def synthesize(
    shape: str,
    out_dir: str | Path,
    weights: str = "random",
    seed: int = 0,
    tokenizer: str = "wordlevel",
    training: dict | None = None,
) -> dict:
    """Write a synthetic model (config, tokenizer, and seeded FP16 weights unless dummy). The
    gpt2 tokenizer (llama.cpp's copy of GPT-2's vocabulary) sets the vocabulary size. Trained
    weights (models/train.py) come with a BPE tokenizer learnt from the same text."""
    cfg = shape_config(shape)
    with atomic_dir(out_dir) as tmp:
        if weights == "trained":
            from speedsplit.models.train import Training, write_trained

            report = write_trained(cfg, tmp, seed, Training(**(training or {})))
            info = {"source": "synthetic", "shape": shape, "weights": weights, "seed": seed, "tokenizer": "bpe"}
            (tmp / "speedsplit-model.json").write_text(json.dumps({**info, "training": report}, indent=2))
            return info
        if tokenizer == "gpt2":
            from speedsplit.models.gguf import gpt2_tokenizer

            cfg["vocab_size"] = gpt2_tokenizer(tmp)
            eot = cfg["vocab_size"] - 1  # <|endoftext|>: GPT-2's only special token
            cfg.update(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
        else:
            build_tokenizer(cfg["vocab_size"], tmp)
        if weights == "dummy":
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        else:
            _write_random_weights(cfg, tmp, seed)
        info = {"source": "synthetic", "shape": shape, "weights": weights, "seed": seed, "tokenizer": tokenizer}
        (tmp / "speedsplit-model.json").write_text(json.dumps(info, indent=2))
    return info


def _write_random_weights(cfg: dict, out: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    model.save_pretrained(out, safe_serialization=True)


def download(repo: str, revision: str, out_dir: str | Path) -> dict:
    """snapshot_download at a pinned revision; HF_TOKEN from the environment, never logged."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = os.environ.get("HF_TOKEN") or None
    with atomic_dir(out_dir) as tmp:
        try:
            snapshot_download(
                repo_id=repo,
                revision=revision,
                local_dir=tmp,
                token=token,
                allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"],
            )
        except GatedRepoError:
            raise ModelError(f"model {repo} is gated: accept its licence and set HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise ModelError(f"model {repo} not found on the hub (or private: set HF_TOKEN)") from None
        except RevisionNotFoundError:
            raise ModelError(f"model {repo} has no revision {revision!r}") from None
        except LocalEntryNotFoundError:
            raise ModelError(
                f"model {repo}@{revision} is not in the local cache and the hub is unreachable "
                "(HF_HUB_OFFLINE or no network)"
            ) from None
        shutil.rmtree(tmp / ".cache", ignore_errors=True)
        info = {"source": "hub", "repo": repo, "revision": revision}
        (tmp / "speedsplit-model.json").write_text(json.dumps(info, indent=2))
    return info


def acquire(entry: dict, out_dir: str | Path) -> dict:
    """Acquire one model entry of the config into out_dir."""
    if entry["source"] == "hub":
        return download(entry["repo"], entry["revision"], out_dir)
    if entry["source"] == "local":
        from speedsplit.models.local import adopt_local

        return adopt_local(entry, out_dir)
    return synthesize(
        entry["shape"],
        out_dir,
        entry["weights"],
        entry["seed"],
        entry.get("tokenizer", "wordlevel"),
        entry.get("training"),
    )


def read_model_config(model_dir: str | Path) -> dict:
    """config.json of a model folder, or a one-line ModelError saying what is wrong."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    if not path.is_file():
        raise ModelError(f"model folder {model_dir} has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"model folder {model_dir}: config.json is corrupt ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise ModelError(f"model folder {model_dir}: config.json is corrupt (not UTF-8: {exc.reason})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"model folder {model_dir}: config.json is corrupt (a {type(cfg).__name__}, not an object)")
    return cfg


def model_info(model_dir: str | Path) -> dict:
    """What speedsplit wrote about a model folder (source, shape, weights, variant)."""
    info = Path(model_dir) / "speedsplit-model.json"
    try:
        return json.loads(info.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def model_identity(model_dir: str | Path) -> dict:
    """What makes a model folder this model: its absolute path, what speedsplit wrote about it
    (source, seed, revision) and a digest of its files' names, sizes and modification times.
    A server session serves one identity; another one (a re-synthesised seed, a new revision,
    another checkout's folder) gets its own server."""
    import hashlib

    path = Path(model_dir).resolve()
    listing = []
    with contextlib.suppress(OSError):
        for f in sorted(path.iterdir()):
            with contextlib.suppress(OSError):
                st = f.stat()
                listing.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return {
        "path": str(path),
        "info": model_info(path),
        "files": hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16],
    }


def is_dummy(model_dir: str | Path) -> bool:
    return model_info(model_dir).get("weights") == "dummy"


def check_model(model_dir: str | Path, variant: str) -> dict:
    """Check a model folder is complete and, for gptq and awq, really holds 4-bit weights."""
    if variant == "gguf":
        from speedsplit.models.gguf import check_gguf

        check_gguf(model_dir)
        return {}
    cfg = read_model_config(model_dir)
    model_dir = Path(model_dir)
    qcfg = cfg.get("quantization_config") or {}
    if variant in INT4_FORMATS and qcfg.get("quant_method") != variant:
        raise ModelError(
            f"model folder {model_dir} is not {variant.upper()}-quantized "
            f"(config.json has no {variant} quantization_config)"
        )
    if is_dummy(model_dir):
        return cfg
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise ModelError(f"model folder {model_dir} has no *.safetensors weights")
    if variant in INT4_FORMATS:
        from safetensors import safe_open

        try:
            with safe_open(str(shards[0]), "pt") as f:
                qweights = [k for k in f.keys() if k.endswith(".qweight")]
        except Exception as exc:  # safetensors raises several types for damaged files
            raise ModelError(f"model folder {model_dir}: {shards[0].name} is corrupt ({exc})") from None
        if not qweights:
            raise ModelError(
                f"model folder {model_dir} is not quantized: {shards[0].name} holds no int4 .qweight tensors"
            )
    return cfg
