"""Models, stacks and workloads as a config gives them, typed (speedsplit/planning/model_config.py,
stack_config.py, workload_config.py): the config schema's entries are generated from them, and
every one of every shipped config reads as its filled dict holds it."""

import json

import pytest
import yaml
from conftest import REPO
from jsonschema import Draft202012Validator

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
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
    SloConfig,
)
from speedsplit.planning.typed_config import plain_schema
from speedsplit.planning.workload_config import WorkloadConfig

# every section of the config and the type it is generated from (the experiment's attribute of
# the same name reads it typed)
SECTIONS = {
    "quantization": QuantizationConfig,
    "quality": QualityConfig,
    "capacity": CapacityConfig,
    "slo": SloConfig,
    "factorial": FactorialConfig,
    "coordination": CoordinationConfig,
    "link_control": LinkControlConfig,
    "analysis": AnalysisConfig,
    "report": ReportConfig,
    "estimate": EstimateConfig,
}


def test_the_config_schema_takes_its_stack_entry_from_the_model():
    schema = C.load_schema()
    Draft202012Validator.check_schema(schema)
    entries = {
        "models": ModelConfig,
        "stacks": StackConfig,
        "workloads": WorkloadConfig,
        "sampling": SamplingConfig,
        "topologies": TopologyConfig,
    }
    for key, entry in entries.items():  # one entry of a map by name
        assert schema["properties"][key]["additionalProperties"] == plain_schema(entry), key
    # a section: filled from its own defaults where the config has none
    for key, section in {"benchmark": BenchmarkConfig, "grid": GridConfig, **SECTIONS}.items():
        assert schema["properties"][key] == {**plain_schema(section), "default": {}}, key
    # plain JSON Schema, as jsonschema reads it: pydantic's own bounds and titles are gone
    types = [*entries.values(), BenchmarkConfig, GridConfig, *SECTIONS.values()]
    text = json.dumps([plain_schema(t) for t in types])
    assert not any(f'"{key}":' in text for key in ("gt", "ge", "title", "$ref", "$defs"))
    assert '"integer", "number"' not in text  # a number is a number, whether YAML gave 24 or 24.0
    assert json.loads((REPO / "docs/config-schema.json").read_text()) == schema, (
        "docs/config-schema.json is stale: speedsplit schema --config > docs/config-schema.json"
    )


# the default config and every config an evidence folder was measured with (memory caps, KV
# cache sizes, every engine and format)
CONFIGS = sorted(
    {("config/config.yaml",)}
    | {
        tuple(how["config"])
        for p in (REPO / "docs/evidence").glob("*/evidence.yaml")
        if "config" in (how := yaml.safe_load(p.read_text()))
    }
)


@pytest.mark.parametrize("configs", CONFIGS, ids=" + ".join)
def test_every_model_stack_and_workload_of_a_shipped_config_reads_as_its_filled_dict(configs):
    """What a typed model, stack or workload says is what the filled config says, to the type (24
    stays 24: the job files and results say what they always said)."""

    def same(dumped, filled, where):
        assert dumped == filled, where
        if isinstance(filled, dict):
            for k in filled:
                same(dumped[k], filled[k], f"{where}.{k}")
        elif isinstance(filled, list):
            for i, (a, b) in enumerate(zip(dumped, filled)):
                same(a, b, f"{where}[{i}]")
        else:
            assert type(dumped) is type(filled), where

    cfg = C.load(*[REPO / c for c in configs])
    filled = cfg.filled()
    for name in filled["models"]:
        same(cfg.models[name].model_dump(exclude_unset=True), filled["models"][name], name)
    for stack, typed in cfg.stacks.items():
        same(typed.model_dump(exclude_unset=True), filled["stacks"][stack], f"stacks.{stack}")
    for name in filled["workloads"]:
        typed = cfg.workloads[name]
        same(typed.model_dump(exclude_unset=True), filled["workloads"][name], f"workloads.{name}")
    same(cfg.benchmark.model_dump(), filled["benchmark"], "benchmark")
    same(cfg.grid.model_dump(), filled["grid"], "grid")
    for name in filled["sampling"]:
        same(cfg.sampling[name].model_dump(), filled["sampling"][name], f"sampling.{name}")
    for name in filled["topologies"]:
        same(cfg.topologies[name].model_dump(), filled["topologies"][name], f"topologies.{name}")
    for key in SECTIONS:
        same(getattr(cfg, key).model_dump(exclude_unset=True), filled[key], key)


def _refusal(tmp_path, top: dict) -> str:
    """The one line a config with `top` over the default is refused with."""
    path = tmp_path / "top.yaml"
    path.write_text(yaml.safe_dump(top))
    with pytest.raises(ConfigError) as err:
        C.load(path)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"card_memory_gib": 0}, "config error at stacks.hf-fp16.card_memory_gib: 0 is less than or equal to"),
        ({"startup_timeout_s": 0.5}, "config error at stacks.hf-fp16.startup_timeout_s: 0.5 is less than the minimum"),
        ({"kv_cache_gib": "4"}, "config error at stacks.hf-fp16.kv_cache_gib: '4' is not of type"),
        ({"on_cpu": {"dtyp": "x"}}, "config error at stacks.hf-fp16.on_cpu: unknown key 'dtyp' (expected one of:"),
        ({"dialect": "openai"}, "config error at stacks.hf-fp16.dialect: 'openai' is not one of"),
    ],
)
def test_a_wrong_stack_key_is_one_line_naming_it(tmp_path, change, expect):
    assert (refused := _refusal(tmp_path, {"stacks": {"hf-fp16": change}})).startswith(expect), refused


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"ramp_s": -1}, "config error at workloads.wide.ramp_s: -1 is less than the minimum of 0"),
        ({"warmup_requests": 0.5}, "config error at workloads.wide.warmup_requests: 0.5 is not of type 'integer'"),
        (
            {"arrival": {"rates": [1], "requests": 5, "duration_s": 3}},
            "config error at workloads.wide.arrival: {'duration_s': 3, 'rates': [1], 'requests': 5} is valid under each of",
        ),
        ({"arrival": {"rates": [0], "requests": 5}}, "config error at workloads.wide.arrival.rates[0]: 0 is less"),
        ({"lengths": {"kind": "normal"}}, "config error at workloads.wide.lengths.kind: 'normal' is not one of"),
        (
            {"arrival": {"rates": [1], "requests": 5}, "think_s": 1},
            "config error at workloads.wide.think_s: a closed loop's setting, and this workload is open loop",
        ),
        (
            {"trace": {"path": "t.jsonl", "requests": 5}},
            "config error at workloads.wide.trace: 'speedups' is a required",
        ),
    ],
)
def test_a_wrong_workload_key_is_one_line_naming_it(tmp_path, change, expect):
    assert (refused := _refusal(tmp_path, {"workloads": {"wide": change}})).startswith(expect), refused


def test_a_stack_needs_its_command_line():
    with pytest.raises(ValueError, match="args"):
        StackConfig()


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"shape": "gpt5"}, "config error at models.tiny.shape: 'gpt5' is not one of"),
        ({"max_model_len": 8}, "config error at models.tiny.max_model_len: 8 is less than the minimum of 16"),
        ({"training": {"lr": 0}}, "config error at models.tiny.training.lr: 0 is less than or equal to the minimum"),
        ({"prequantized": {"exl2": "x"}}, "config error at models.tiny.prequantized: unknown key 'exl2'"),
    ],
)
def test_a_wrong_model_key_is_one_line_naming_it(tmp_path, change, expect):
    assert (refused := _refusal(tmp_path, {"models": {"tiny": change}})).startswith(expect), refused


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"telemetry_s": 0}, "config error at benchmark.telemetry_s: 0 is less than or equal to the minimum of 0"),
        (
            {"outlier_factor": 1},
            "config error at benchmark.outlier_factor: 1 is less than or equal to the minimum of 1",
        ),
        ({"cpu_lanes": 1.5}, "config error at benchmark.cpu_lanes: 1.5 is not of type 'integer'"),
        ({"calibration_users": []}, "config error at benchmark.calibration_users: [] should be non-empty"),
        ({"server_reuse": "never"}, "config error at benchmark.server_reuse: 'never' is not one of"),
        ({"stacks": ["nope"]}, "config error at benchmark.stacks[0]: unknown stack 'nope'"),
        ({"warm": "x"}, "config error at benchmark: unknown key 'warm'"),
    ],
)
def test_a_wrong_benchmark_key_is_one_line_naming_it(tmp_path, change, expect):
    assert (refused := _refusal(tmp_path, {"benchmark": change})).startswith(expect), refused


@pytest.mark.parametrize(
    "section, expect",
    [
        ({"grid": {"cells": [{"workload": "wide"}]}}, "config error at grid.cells[0]: 'users' is a required property"),
        ({"grid": {"users": [0]}}, "config error at grid.users[0]: 0 is less than the minimum of 1"),
        ({"grid": {"runs": 0}}, "config error at grid.runs: 0 is less than the minimum of 1"),
        (
            {"sampling": {"greedy": {"top_p": 1.5}}},
            "config error at sampling.greedy.top_p: 1.5 is greater than the maximum",
        ),
        ({"sampling": {"greedy": {"temp": 1}}}, "config error at sampling.greedy: unknown key 'temp'"),
        ({"topologies": {"tp2": {"tensor_parallel": 0}}}, "config error at topologies.tp2.tensor_parallel: 0 is less"),
    ],
)
def test_a_wrong_grid_sampling_or_topology_key_is_one_line_naming_it(tmp_path, section, expect):
    assert (refused := _refusal(tmp_path, section)).startswith(expect), refused


@pytest.mark.parametrize(
    "section, expect",
    [
        ({"quality": {"gate": 1.5}}, "config error at quality.gate: 1.5 is greater than the maximum of 1"),
        ({"quality": {"lm_eval": {"limit": 0}}}, "config error at quality.lm_eval.limit: 0 is less than the minimum"),
        ({"quantization": {"group_size": 96}}, "config error at quantization.group_size: 96 is not one of"),
        ({"capacity": {"users": []}}, "config error at capacity.users: [] should be non-empty"),
        ({"factorial": {"sampling": ["greedy"]}}, "config error at factorial.sampling: ['greedy'] is too short"),
        ({"estimate": {"startup_s": {"gpu": 1}}}, "config error at estimate.startup_s: unknown key 'gpu'"),
        ({"report": {"headline": [{"users": 1}]}}, "config error at report.headline[0]: 'workload' is a required"),
        ({"analysis": {"tolerate_flags": ["x"]}}, "config error at analysis.tolerate_flags[0]: 'x' is not one of"),
    ],
)
def test_a_wrong_key_of_any_section_is_one_line_naming_it(tmp_path, section, expect):
    assert (refused := _refusal(tmp_path, section)).startswith(expect), refused
