"""The experiment: the whole workflow config as one typed object. Each section's keys, defaults,
bounds and descriptions are declared once, in its own type (planning/*_config.py); the config's
JSON Schema is generated from this root (`json_schema`), and planning/config.validate checks a
merged config against it (one-line messages naming the key path, defaults filled), parses it
into an `Experiment` once and checks every cross-reference (planning/config._check_references).
Everything downstream reads attributes: `experiment.benchmark.runs`, `experiment.stacks[name]`.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from speedsplit.core.numbers import Positive
from speedsplit.planning.benchmark_config import BenchmarkConfig
from speedsplit.planning.grid_config import GridConfig, SamplingConfig, TopologyConfig
from speedsplit.planning.model_config import ModelConfig
from speedsplit.planning.output_config import AnalysisConfig, EstimateConfig, ReportConfig
from speedsplit.planning.quality_config import QualityConfig, QuantizationConfig
from speedsplit.planning.stack_config import StackConfig
from speedsplit.planning.studies_config import (
    CapacityConfig,
    CoordinationConfig,
    FactorialConfig,
    LinkControlConfig,
    MechanismConfig,
    SloConfig,
)
from speedsplit.planning.typed_config import Entry, nested, plain_schema
from speedsplit.planning.workload_config import WorkloadConfig

# Every map's keys (models, stacks, ...): names as result paths take them.
NAME = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9_.]*(-[A-Za-z0-9_.]+)*$",
    "description": "A name used in result paths (letters, digits, '.', '_' and single '-').",
}


def named(description: str, at_least_one: bool = False) -> Any:
    """A map of entries by name (models, stacks, ...): names as result paths take them, {} when
    absent."""
    extra = {"default": {}, **({"minProperties": 1} if at_least_one else {})}
    return Field(default_factory=dict, description=description, json_schema_extra=extra)


class Experiment(Entry):
    """Models, the stacks that serve them, the chains of stacks whose speedup is decomposed, the
    grid of benchmark cells and the GPU topologies. Every key has a default, so a config only
    names what it changes."""

    platform: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where stacks run. 'auto' picks cuda when a GPU is visible on the machine that builds the "
        "DAG, else cpu; it is refused for a cluster run, whose submitting host cannot speak for its nodes. Stacks "
        "take their on_cpu / on_gpu overlays from it; a job that finds the other platform where it runs is flagged "
        "platform_mismatch.",
    )
    gpus_available: int = Field(
        4,
        ge=0,
        description="How many GPUs the run may use at most; a topology needing more is refused when the config is "
        "loaded. On the CPU platform topologies need no GPU.",
    )
    card_memory_gib: Positive | None = Field(
        None,
        description="Run every stack as if its card had this much memory (e.g. 24 for an RTX A5000 on an H200), "
        "unless the stack sets its own: vLLM through --gpu-memory-utilization, a Python server without such a flag "
        "through speedsplit.serving.memcap. Bandwidth and compute stay the real card's: the cap reproduces where a "
        "smaller card runs out of memory, not its speed. Applied on CUDA cards only (a CPU run records it as not "
        "applied). null - no cap.",
    )
    models: dict[str, ModelConfig] = named("The models to serve, by name.", at_least_one=True)
    quantization: QuantizationConfig = nested(QuantizationConfig, QuantizationConfig.__doc__)
    stacks: dict[str, StackConfig] = named(
        "Serving stacks by name. A stack is a command line that starts an OpenAI-compatible server, a readiness "
        "path and the request dialect it speaks. Placeholders in args: {python} {model_dir} {served_name} {host} "
        "{port} {tp} {max_model_len} {dtype} {llama_server} (llama.cpp's server: $SPEEDSPLIT_LLAMA_SERVER, else "
        "the one `make llama-cpp` built into the environment, else llama-server on PATH).",
        at_least_one=True,
    )
    chains: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Ordered stacks whose end-to-end speedup is decomposed into factors between neighbours, e.g. "
        "[hf-fp16, vllm-fp16, vllm-marlin].",
        json_schema_extra={"default": {}},
    )
    workloads: dict[str, WorkloadConfig] = named("Request shapes by name.", at_least_one=True)
    sampling: dict[str, SamplingConfig] = named("Sampling modes by name.", at_least_one=True)
    grid: GridConfig = nested(GridConfig, GridConfig.__doc__)
    benchmark: BenchmarkConfig = nested(BenchmarkConfig, BenchmarkConfig.__doc__)
    analysis: AnalysisConfig = nested(AnalysisConfig, AnalysisConfig.__doc__)
    quality: QualityConfig = nested(QualityConfig, QualityConfig.__doc__)
    link_control: LinkControlConfig = nested(LinkControlConfig, LinkControlConfig.__doc__)
    coordination: CoordinationConfig = nested(CoordinationConfig, CoordinationConfig.__doc__)
    factorial: FactorialConfig = nested(FactorialConfig, FactorialConfig.__doc__)
    capacity: CapacityConfig = nested(CapacityConfig, CapacityConfig.__doc__)
    slo: SloConfig = nested(SloConfig, SloConfig.__doc__)
    report: ReportConfig = nested(ReportConfig, ReportConfig.__doc__)
    estimate: EstimateConfig = nested(EstimateConfig, EstimateConfig.__doc__)
    topologies: dict[str, TopologyConfig] = named("How GPUs are used by one measurement.")
    mechanism: MechanismConfig = nested(MechanismConfig, MechanismConfig.__doc__)

    # the dict it was typed from (planning/config.validate), its keys in the order given
    _filled: dict = PrivateAttr(default_factory=dict)

    def filled(self) -> dict:
        """The config as validated, its defaults filled, as plain builtins in the order the files
        and the schema gave its keys: what the report shows and what the model and quantize
        rules' params carry (Snakemake compares params as text: a finished model keeps its)."""
        return copy.deepcopy(self._filled)


def json_schema() -> dict:
    """The config's JSON Schema (what `speedsplit schema --config` prints, docs/config-schema.json)."""
    schema = plain_schema(Experiment)
    for key, field in Experiment.model_fields.items():
        if getattr(field.annotation, "__origin__", None) is dict:  # a map's keys are names
            schema["properties"][key]["propertyNames"] = {"$ref": "#/definitions/name"}
    schema["properties"]["chains"]["additionalProperties"].update(
        {"minItems": 2, "description": "Stack names, slowest reference first."}
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "speedsplit workflow configuration",
        **schema,
        "definitions": {"name": NAME},
        "additionalProperties": False,
    }
