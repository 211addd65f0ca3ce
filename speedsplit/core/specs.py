"""What a job runs, typed: the stack it starts (`StackSpec`). The config resolves a stack for one
model, topology and platform (planning/grid.stack_params, a dict of builtins, which Snakemake
compares to rerun what changed and the job file holds); whoever runs it reads that dict once
into a StackSpec (`StackSpec.model_validate`) and uses its attributes from there on: bench, the
coordination profile, the session daemon and the launcher. The cell's twin is
core/record.CellParams (the result keeps it whole).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StackSpec(BaseModel):
    """One stack resolved for one model, topology and platform, and how its server starts."""

    # a key the writer does not produce is refused: a job file of another version fails naming it
    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    model: str
    topology: str
    platform: Literal["cuda", "cpu"]
    variant: str = Field(description="weights served: fp16, gptq, awq, fp8, gguf ...")
    args: list[str] = Field(description="the server's command line, placeholders unrendered")
    env: dict[str, str] = Field(default_factory=dict, description="the server's environment, placeholders unrendered")
    dtype: str
    dialect: Literal["vllm", "llamacpp", "transformers"] = "vllm"
    ready_path: str = "/health"
    request_model: str = Field("{served_name}", description="the model name requests carry")
    expect_kernel: str = Field("", description="regex the engine's linear kernel must match ('' = none)")
    tensor_parallel: int = Field(1, ge=1)
    instances: int = Field(1, ge=1)
    max_model_len: int = Field(ge=1)
    cpu_isolation: bool = Field(False, description="each instance's server and client on its cards' cores")
    card_memory_gib: int | float | None = Field(None, description="the memory cap on each card (null: none)")
    memory_cap_args: list[str] = Field(default_factory=list, description="the server's own memory flag")
    kv_cache_gib: int | float | None = Field(None, description="the KV cache sized by hand (vLLM on a card)")
    host_cache_cap: bool = Field(False, description="a CPU server sizes its caches from its share of host memory")
    keep_alive: bool = Field(True, description="the client reuses a connection for the next request")
    # set by the session plan (planning/plan.SessionPlan.with_startup), not by the config's cell
    startup_timeout_s: float | None = Field(None, description="seconds the server may take to be ready")
    api_key: bool = Field(False, description="the server demands a key (benchmark.api_key)")
    api_key_env: str | None = Field(None, description="the variable its engine reads the key from")
