"""A stack as a config gives it (`stacks.<name>`), typed: a stack key, its type, its default and
its description live here only (the config schema's stack entry is generated from it, through
planning/experiment.py); a validated experiment's stack is `experiment.stacks[name]`.

Keys that `extends` uses (extends, abstract, add_args, set_args: planning/extends.py) are
resolved before the schema fills defaults; they are here so that the schema accepts them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speedsplit.core.specs import StackSettings
from speedsplit.planning.typed_config import absent, Entry
from speedsplit.core.numbers import AtLeastOne, Number, Positive


class _Overlay(Entry):
    args: list[str] = Field([], description="Arguments appended.")
    add_args: list[str] | None = absent("With extends, appended to the base's args.")
    set_args: dict[str, str | Number] | None = absent("With extends, flags' values.")
    env: dict[str, str] = Field({}, description="Environment added.")
    expect_kernel: str = Field("", description="Overrides expect_kernel.")


class CpuOverlay(_Overlay):
    """What a stack changes on the cpu platform."""

    dtype: str = Field("bfloat16", description="Value of {dtype}.")
    host_cache_cap: bool = Field(
        False,
        description="The server (a {python} command) sizes its caches from the host's memory, as "
        "transformers' continuous batching does: run it under speedsplit.serving.memcap with room for what "
        "its session's cells keep in flight (twice their KV cache, at least one full-length sequence, plus "
        "0.25 GiB), not the whole host.",
    )


class GpuOverlay(_Overlay):
    """What a stack changes on the cuda platform."""

    dtype: str = Field("float16", description="Value of {dtype}.")


class StackConfig(Entry, StackSettings):
    """One stack."""

    variant: Literal["fp16", "gptq", "awq", "fp8", "gguf"] = Field(
        "fp16",
        description="Which weights the stack serves: fp16; gptq or awq, INT4 checkpoints made by the quantize "
        "rule (GPTQModel; its AWQ needs a CUDA card) or given as models.*.prequantized; fp8, the FP16 weights "
        "that vLLM quantizes itself as it loads them (--quantization fp8: dynamic W8A8, a CUDA card with FP8 "
        "units, Ada or Hopper); gguf, llama.cpp's own format converted from the FP16 weights by the gguf rule "
        "(llama.cpp's convert_hf_to_gguf.py) at gguf_type, served as {model_dir}/model.gguf.",
    )
    gguf_type: Literal["f16", "bf16", "q8_0"] = Field(
        "q8_0",
        description="variant gguf: the GGUF tensor type llama.cpp's converter writes (q8_0: 8-bit blocks of "
        "32 weights with one scale each, llama.cpp's own quantized format).",
    )
    extends: str | None = absent(
        "A stack this one starts from (speedsplit/planning/extends.py): it gives only what differs. Scalars "
        "replace the base's, env merges over it (null removes a key), args replaces the command line, add_args "
        "appends to it, set_args sets flags' values; on_cpu and on_gpu merge by the same rules. An override of "
        "the base in a later config file reaches the stacks that extend it."
    )
    abstract: bool | None = absent(
        "A base for other stacks only (e.g. the vLLM command line): dropped once the stacks extending it are "
        "resolved, so nothing benchmarks it."
    )
    args: list[str] = Field(description="The server's command line (placeholders allowed).")
    add_args: list[str] | None = absent("With extends, arguments appended to the base's.")
    set_args: dict[str, str | Number] | None = absent(
        'With extends, flags\' values, e.g. {"--max-batch": "64"}: the value after the flag in the base\'s args '
        "is replaced, or the flag and value appended."
    )
    env: dict[str, str] = Field({}, description="Environment for the server.")
    dialect: Literal["vllm", "llamacpp", "transformers"] = Field(
        "vllm",
        description="How a request forces its output length, and how the stream counts its tokens: 'vllm' "
        "sends ignore_eos and min_tokens and asks for the running usage in every chunk (continuous_usage_stats); "
        "'llamacpp' the same and llama.cpp's running count in every chunk (timings_per_token: it merges a partial "
        "character into the next chunk, so its chunks are fewer than its tokens); 'transformers' sends a "
        "per-request generation_config and counts one token a chunk.",
    )
    request_model: str = Field(
        "{served_name}",
        description="The model name requests carry (placeholders allowed); `transformers serve` pinned to a "
        'folder wants "{model_dir}".',
    )
    ready_path: str = Field("/health", description="Path that answers 200 once the server is ready.")
    api_key_env: str | None = Field(
        None,
        description="The environment variable the server reads an API key from (vLLM VLLM_API_KEY, llama.cpp "
        "LLAMA_API_KEY, speedsplit's own servers SPEEDSPLIT_API_KEY); null: its engine has none (`transformers "
        "serve`). Used with benchmark.api_key.",
    )
    startup_timeout_s: AtLeastOne = Field(600, description="Seconds to wait for readiness.")
    expect_kernel: str = Field(
        "",
        description="Regex the linear kernel reported in the engine log must match; a run whose kernel differs "
        "is flagged. Empty: no expectation.",
    )
    card_memory_gib: Positive | None = Field(
        None, description="This stack's memory cap (see the top-level key); null - the top-level value."
    )
    kv_cache_gib: Positive | None = Field(
        None,
        description="vLLM stacks: the KV cache's size, given explicitly (--kv-cache-memory-bytes; vLLM then "
        "ignores --gpu-memory-utilization for it). Under a memory cap, vLLM's CUDA graphs sit outside its memory "
        "fraction (a 24 GiB cap held 26.9 GiB). The card stays inside the cap with the cap less what NVML saw "
        "beside the cache in a capped run (gpu_memory_peak_gib - kv_cache_gib in tables/runs): vLLM's own "
        "kv_cache_fit_gib leaves out about 2 GiB NVML sees (CUDA context, workspaces). On one H200 capped to "
        "24 GiB: 4.6 GiB (8B FP16) and 14.5 GiB (INT4) peaked at 23.55 and 23.46 GiB. A capped run whose cache "
        "exceeded vLLM's fit, or whose card NVML saw more than 0.5 GiB above the cap, is flagged over_memory_cap. "
        "On CUDA only; null - sized by the engine.",
    )
    memory_cap_args: list[str] = Field(
        [],
        description="Arguments that put the server under the memory cap, with {memory_fraction} (the cap / the "
        'card\'s memory) and {memory_gib}, e.g. ["--gpu-memory-utilization", "{memory_fraction}"]. Empty: the '
        "server (a {python} command) runs under speedsplit.serving.memcap.",
    )
    on_cpu: CpuOverlay = Field(
        default_factory=CpuOverlay, description="Overlay used on the cpu platform.", json_schema_extra={"default": {}}
    )
    on_gpu: GpuOverlay = Field(
        default_factory=GpuOverlay, description="Overlay used on the cuda platform.", json_schema_extra={"default": {}}
    )
