"""A model as a config gives it (`models.<name>`), typed: where it comes from and how it is made.
A validated experiment's is `experiment.models[name]` (planning/experiment.py, whose schema is
generated from these types).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speedsplit.models.train import Training
from speedsplit.planning.typed_config import Entry


class Prequantized(Entry):
    gptq: str = Field("", description="A GPTQ checkpoint folder, for the gptq stacks.")
    awq: str = Field("", description="An AWQ checkpoint folder, for the awq stacks.")


class ModelConfig(Entry):
    """One model and how it is acquired."""

    source: Literal["synthetic", "hub", "local"] = Field(
        "synthetic",
        description="'synthetic' writes a model of a named shape locally; 'hub' downloads a repo; 'local' uses a "
        "folder of your own (path) in place.",
    )
    path: str = Field(
        "",
        description="source local: a model folder with config.json, a tokenizer (tokenizer.json or "
        "tokenizer.model) and FP16/BF16 *.safetensors weights; checked when the config is read, its files linked "
        "(never copied) into resources/models/{model}/fp16.",
    )
    prequantized: Prequantized = Field(
        default_factory=Prequantized,
        description="Checkpoints of this model already quantized, used as they are: the quantize step checks one "
        "(format, bits and group size against quantization, which modules hold quantized weights), records what "
        "it holds and links it instead of quantizing.",
        json_schema_extra={"default": {}},
    )
    shape: Literal[
        "tiny", "tiny-draft", "small", "small-draft", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "llama-3.1-70b"
    ] = Field("tiny", description="Architecture shape of a synthetic model.")
    tokenizer: Literal["wordlevel", "gpt2"] = Field(
        "wordlevel",
        description="Synthetic models only. 'wordlevel': one word of a synthetic vocabulary per token "
        "(transformers and vLLM read it; llama.cpp cannot). 'gpt2': GPT-2's byte-level BPE (50,257 tokens), "
        "taken from the vocabulary llama.cpp's source ships (models/ggml-vocab-gpt-2.gguf, `make llama-cpp`), "
        "so that llama.cpp and the HF side tokenize a prompt alike: what a llamacpp-* stack needs.",
    )
    weights: Literal["random", "dummy", "trained"] = Field(
        "random",
        description="Synthetic models only. 'random' writes seeded random FP16 weights (every stack can load "
        "them); 'dummy' writes no weight files and vLLM stacks initialise weights themselves (load_format "
        "dummy). Throughput does not depend on weight values, but quality does: on random or dummy weights the "
        "quality factors say nothing. 'trained' (the tiny shapes on any platform, the small ones on a CUDA card) "
        "trains the model briefly on the Python standard library's sources with a byte-level BPE tokenizer learnt "
        "from them (the tiny shape: about a minute on 2 cores, seeded; speedsplit/models/train.py), so that its "
        "outputs mean something.",
    )
    training: Training = Field(
        default_factory=Training,
        description="weights 'trained' only - how the model is trained.",
        json_schema_extra={"default": {}},
    )
    seed: int = Field(0, description="Seed of the synthetic weights.")
    repo: str = Field("", description="Hub repo id (source hub), e.g. meta-llama/Llama-3.1-8B-Instruct.")
    revision: str = Field("main", description="Hub revision to pin (a commit hash is best).")
    max_model_len: int = Field(4096, ge=16, description="Context length the servers are started with.")
