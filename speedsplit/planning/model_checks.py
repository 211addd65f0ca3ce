"""The config's checks of what serving its models needs beyond the config itself: local and
pre-quantized checkpoints, weight formats the platform can make or run, llama.cpp's tools.
"""

from __future__ import annotations

from speedsplit.planning.grid import bench_models, bench_stacks, platform_of
from speedsplit.core.errors import ConfigError
from speedsplit.planning.model_config import ModelConfig
from speedsplit.planning.experiment import Experiment


# The shapes the model rule may train, and where: tiny ones anywhere, small ones on a card.
TRAINED_SHAPES = {"tiny": "cpu", "tiny-draft": "cpu", "small": "cuda", "small-draft": "cuda"}


def check_own_weights(config: Experiment, model: str, entry: ModelConfig) -> None:
    """A local folder and pre-quantized checkpoints: there, complete, and what the config says."""
    from speedsplit.models.checkpoint import ModelError
    from speedsplit.models.local import inspect_local, inspect_quantized

    if entry.source == "local" and not entry.path:
        raise ConfigError(f"config error at models.{model}.path: a local model needs the folder's path")
    if entry.path and entry.source != "local":
        raise ConfigError(f"config error at models.{model}.path: a path is for source local, not {entry.source}")
    if entry.weights == "trained" and (entry.source != "synthetic" or entry.shape not in TRAINED_SHAPES):
        raise ConfigError(
            f"config error at models.{model}.weights: trained is for a synthetic model of shape "
            f"{', '.join(TRAINED_SHAPES)} (it trains in the model rule), not {entry.source} {entry.shape}"
        )
    if entry.weights == "trained" and TRAINED_SHAPES[entry.shape] == "cuda" and platform_of(config) != "cuda":
        raise ConfigError(
            f"config error at models.{model}.shape: a trained {entry.shape} model trains on a CUDA card (a few hundred "
            "million parameters); on a CPU train shape tiny or tiny-draft"
        )
    if entry.weights == "trained" and entry.tokenizer != "wordlevel":
        raise ConfigError(
            f"config error at models.{model}.tokenizer: weights trained learn their own tokenizer (byte-level BPE); "
            f"tokenizer {entry.tokenizer} needs weights random"
        )
    try:
        if entry.path:
            inspect_local(entry.path)
    except ModelError as exc:
        raise ConfigError(f"config error at models.{model}.path: {exc}") from None
    q = config.quantization
    for method, path in entry.prequantized.model_dump().items():
        if not path:
            continue
        if q.method == "dummy":
            raise ConfigError(
                f"config error at models.{model}.prequantized.{method}: quantization.method dummy writes its "
                "own INT4 config; a checkpoint is used with method gptqmodel"
            )
        try:
            inspect_quantized(path, method, q.bits, q.group_size)
        except ModelError as exc:
            raise ConfigError(f"config error at models.{model}.prequantized.{method}: {exc}") from None


def check_formats(config: Experiment) -> None:
    """A weight format the platform cannot make or run: one line at config time."""
    platform = platform_of(config)
    _check_llama_cpp(config)
    for stack in bench_stacks(config):
        variant = config.stacks[stack].variant
        if variant == "fp8" and platform != "cuda":
            raise ConfigError(
                f"config error at stacks.{stack}.variant: fp8 (vLLM's dynamic W8A8) needs a CUDA card with FP8 "
                f"units (Ada, Hopper or newer); this config's platform is {platform}"
            )
        # (a checkpoint of one's own is refused with dummy too: check_own_weights)
        if variant == "awq" and config.quantization.method == "dummy":
            raise ConfigError(
                f"config error at quantization.method: dummy writes GPTQ configs only; stack {stack} serves AWQ "
                "(use gptqmodel)"
            )


def _check_llama_cpp(config: Experiment) -> None:
    """What a llama.cpp stack needs, said when the config is read: a model whose tokenizer
    llama.cpp can read, the server binary, and the converter (also what a gpt2 tokenizer is
    read from)."""
    from speedsplit.models import gguf
    from speedsplit.models.checkpoint import ModelError

    stacks = {s: config.stacks[s] for s in bench_stacks(config)}
    gguf_stacks = [s for s, st in stacks.items() if st.variant == "gguf"]
    models = {m: config.models[m] for m in bench_models(config)}
    synthetic = {m: entry for m, entry in models.items() if entry.source == "synthetic"}
    for stack in gguf_stacks:
        for model, entry in synthetic.items():
            if entry.tokenizer != "gpt2":
                raise ConfigError(
                    f"config error at models.{model}.tokenizer: stack {stack} serves it through llama.cpp, "
                    f"which cannot read the {entry.tokenizer} tokenizer: set tokenizer: gpt2"
                )
    for stack, st in stacks.items():
        if any("{llama_server}" in a for a in st.args) and not gguf.server_binary():
            raise ConfigError(
                f"config error at stacks.{stack}.args: llama-server not found ({gguf.BUILD_HINT}, "
                "or set SPEEDSPLIT_LLAMA_SERVER)"
            )
    needs = [f"stacks.{s}.variant: gguf" for s in gguf_stacks]
    needs += [f"models.{m}.tokenizer: gpt2" for m, entry in synthetic.items() if entry.tokenizer == "gpt2"]
    if needs:
        try:
            gguf.share()
        except ModelError as exc:
            raise ConfigError(f"config error at {needs[0]}: {exc}") from None
