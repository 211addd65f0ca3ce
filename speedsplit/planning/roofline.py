"""Distance to the decode roofline: model-bandwidth utilisation (MBU).

A decode step reads every weight once and the KV cache of every running sequence. MBU =
(weight bytes + KV bytes read per step) / step time / measured memory bandwidth, per card.
"""

from __future__ import annotations

from speedsplit.models.checkpoint import INT4_FORMATS

GIB = 2**30


def param_counts(cfg: dict) -> dict[str, int]:
    """Parameters of a Llama-like decoder: linear layers (quantizable) and embeddings."""
    h, i_, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * i_
    emb = cfg["vocab_size"] * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return {"linear": layers * per_layer, "embedding": emb, "norms": layers * 2 * h + h}


def weight_bytes(cfg: dict, variant: str) -> float:
    """Bytes of weights read per decode step: FP16; GPTQ or AWQ (4-bit linear layers with an
    FP16 scale and a packed 4-bit zero per group; embeddings and norms stay FP16); FP8 (one
    byte per linear weight)."""
    p = param_counts(cfg)
    q = cfg.get("quantization_config") or {}
    if variant == "fp8":
        return p["linear"] + 2 * (p["embedding"] + p["norms"])
    if variant in INT4_FORMATS or q.get("quant_method") in INT4_FORMATS:
        bits = q.get("bits", 4)
        group = q.get("group_size", 128)
        group = group if group and group > 0 else cfg["hidden_size"]
        linear = p["linear"] * (bits / 8 + 2 / group + bits / 8 / group)
        return linear + 2 * (p["embedding"] + p["norms"])
    return 2 * (p["linear"] + p["embedding"] + p["norms"])


def kv_bytes_per_token(cfg: dict, dtype_bytes: int = 2) -> int:
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * hd * dtype_bytes


def decode_step_bytes(cfg: dict, variant: str, batch: float, mean_context: float) -> float:
    """Bytes one decode step reads: the weights once plus the KV of `batch` sequences."""
    return weight_bytes(cfg, variant) + batch * mean_context * kv_bytes_per_token(cfg)


def mbu(
    cfg: dict,
    variant: str,
    users: int,
    prompt_tokens: int,
    output_tokens: int,
    step_s: float | None,
    bandwidth_gb_s: float | None,
    tensor_parallel: int = 1,
    instances: int = 1,
    weight_gib: float | None = None,
) -> float | None:
    """Model-bandwidth utilisation of one card during decode (0..1), None if unknown.

    step_s is the median inter-token latency; each instance serves users / instances
    sequences, and tensor parallelism splits an instance's bytes over its cards. weight_gib
    is what the engine reported loading (per card), when it did."""
    if not step_s or not bandwidth_gb_s or step_s <= 0:
        return None
    if variant == "gguf" and not weight_gib:  # llama.cpp's block formats are not priced here
        return None
    batch = users / instances
    context = prompt_tokens + output_tokens / 2
    if weight_gib:
        per_card = weight_gib * GIB + batch * context * kv_bytes_per_token(cfg) / tensor_parallel
    else:
        per_card = decode_step_bytes(cfg, variant, batch, context) / tensor_parallel
    return per_card / step_s / (bandwidth_gb_s * 1e9)
