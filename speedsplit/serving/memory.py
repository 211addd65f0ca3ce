"""How much memory a stack's server may take: a card's memory cap (the stack's card_memory_gib,
through the server's own flag or speedsplit.serving.memcap) and the host memory a CPU server
sizes its caches from (host_cache_cap)."""

from __future__ import annotations

import sys
from pathlib import Path

from speedsplit.core.specs import StackSpec
from speedsplit.models.checkpoint import ModelError, read_model_config


def render_args(args: list[str], values: dict) -> list[str]:
    """A stack's arguments with their {placeholders} filled in."""
    out = []
    for a in args:
        try:
            out.append(a.format(**values))
        except KeyError as exc:
            raise ValueError(f"stack argument {a!r} uses unknown placeholder {exc}") from None
    return out


def memory_cap(stack: StackSpec, argv: list[str], card_total_gib: float | None) -> tuple[list[str], dict | None]:
    """The server command under the stack's memory cap (card_memory_gib), and what was done.

    A stack caps itself through its own flag where it has one (memory_cap_args, with
    {memory_fraction} = cap / the card's memory, e.g. vLLM's --gpu-memory-utilization);
    otherwise its Python server runs under speedsplit.serving.memcap. Only a CUDA card is capped.
    A vLLM stack's kv_cache_gib sizes its cache explicitly (--kv-cache-memory-bytes), cap or not."""
    if stack.kv_cache_gib and stack.platform == "cuda":  # the cache sized by hand (vLLM)
        argv = argv + ["--kv-cache-memory-bytes", str(int(stack.kv_cache_gib * GIB))]
    gib = stack.card_memory_gib
    if not gib:
        return argv, None
    record = {"card_memory_gib": gib, "card_total_gib": card_total_gib, "fraction": None, "how": None}
    if stack.platform != "cuda" or card_total_gib is None:
        return argv, {**record, "applied": False, "reason": "not on a CUDA card: nothing to cap"}
    if gib >= card_total_gib:
        raise ValueError(f"stack {stack.stack}: card_memory_gib {gib} is not below the card's {card_total_gib:.1f} GiB")
    fraction = int(gib / card_total_gib * 10_000) / 10_000  # rounded down: never above the cap
    if stack.memory_cap_args:
        extra = render_args(stack.memory_cap_args, {"memory_fraction": f"{fraction:.4f}", "memory_gib": gib})
        argv, how = argv + extra, " ".join(extra)
    elif argv[0] == sys.executable:
        argv = [argv[0], "-m", "speedsplit.serving.memcap", "--gib", f"{gib:g}", "--", *argv[1:]]
        how = "speedsplit.serving.memcap: allocator capped, mem_get_info reports the small card"
    else:
        raise ValueError(
            f"stack {stack.stack}: card_memory_gib needs memory_cap_args (the server's own memory flag) "
            "or a command that starts with {python} (run under speedsplit.serving.memcap)"
        )
    return argv, {**record, "fraction": fraction, "how": how, "applied": True, "reason": None}


GIB = 2**30
HOST_CACHE_FLOOR_GIB = 0.25
# transformers' continuous batching sets aside the LM head's rows (16-bit hidden state, fp32
# logits) for up to 1024 requests of a batch before it sizes its cache
# (PagedAttentionMemoryHandler.fixed_overhead_bytes): 206 MB for a 50k vocabulary.
CB_LOGIT_ROWS = 1024


def host_cache_gib(stack: StackSpec, model_dir: str | Path, kv_tokens: int) -> float | None:
    """Host memory a CPU server with host_cache_cap may size its caches from: twice the KV
    cache of what its session keeps in flight (at least one full-length sequence), the logit
    rows transformers reserves, and 0.25 GiB for its other buffers; None where no such cap
    applies."""
    if not stack.host_cache_cap:
        return None
    try:
        cfg = read_model_config(model_dir)
    except ModelError:
        return None  # the session's own model check says what is wrong
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 2  # K and V, 16-bit
    tokens = max(kv_tokens, stack.max_model_len)
    logit_rows = CB_LOGIT_ROWS * (cfg["hidden_size"] * 2 + cfg["vocab_size"] * 4)
    return round((2 * per_token * tokens + logit_rows) / GIB + HOST_CACHE_FLOOR_GIB, 3)
