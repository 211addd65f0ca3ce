"""How results become tables, a report and estimates, as a config says it
(speedsplit/planning/output_config.py): the `analysis`, `report` and `estimate` sections, their
defaults, their bounds as a user meets them (one line naming the key) and as the typed sections
keep them, the names the report must share with the rest of the config, the schema entries
generated from them, and every shipped config's sections reading as them."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.output_config import (
    AnalysisConfig,
    CardPrices,
    CostConfig,
    EstimateConfig,
    Headline,
    ReportConfig,
)
from speedsplit.planning.typed_config import plain_schema

FILLED = {
    "analysis": {"cost": {"card_hour_usd": {"cpu": None, "cuda": None}, "stacks": {}}, "tolerate_flags": []},
    "report": {"headline": [], "kernel_reference": None},
    "estimate": {
        "output_tok_s": {"cpu": 20, "cuda": 1000},
        "startup_s": {"cpu": 90, "cuda": 200},
        "startup_warm_s": {"cpu": 90, "cuda": 70},
        "job_overhead_s": 5,
        "roofline_efficiency": 0.5,
        "bandwidth_gb_s": None,
        "margin": 2.0,
        "min_runtime_min": 1,
    },
}
MODELS = {"analysis": AnalysisConfig, "report": ReportConfig, "estimate": EstimateConfig}
FLAGS = [
    "request_failures",
    "output_length_mismatch",
    "prompt_length_mismatch",
    "short_measurement",
    "kernel_mismatch",
    "usage_mismatch",
    "latency_outlier",
]
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schemas() -> dict[str, dict]:
    """The config schema's `analysis`, `report` and `estimate` entries."""
    top = C.load_schema()["properties"]
    return {key: top[key] for key in MODELS}


def small(**sections) -> dict:
    """A small config: one model, a chain of two stacks, two workloads, two sampling modes, on a CPU."""
    return {
        "platform": "cpu",
        "models": {"m": {}},
        "stacks": {"a": {"args": ["a"]}, "b": {"args": ["b"]}},
        "chains": {"ab": ["a", "b"]},
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}, "v": {"prompt_tokens": 4, "output_tokens": 4}},
        "sampling": {"greedy": {}, "hot": {"temperature": 1}},
        **sections,
    }


def refusal(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(**sections))
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("key", list(FILLED))
def test_a_config_without_the_section_gets_every_default_and_reads_it_typed(key):
    cfg = C.validate(small())
    assert cfg.filled()[key] == FILLED[key]
    assert MODELS[key]().model_dump() == FILLED[key]
    assert getattr(cfg, key) == MODELS[key]()


def test_a_config_without_a_price_costs_nothing_and_one_price_is_enough():
    assert not CostConfig().priced() and not C.validate(small()).analysis.cost.priced()
    for cost in ({"card_hour_usd": {"cuda": 2.5}}, {"card_hour_usd": {"cpu": 1}}, {"stacks": {"a": 4}}):
        typed = C.validate(small(analysis={"cost": cost})).analysis.cost
        assert typed.priced(), cost
    # what the cost analysis is handed: the prices as given, null where none
    typed = C.validate(small(analysis={"cost": {"card_hour_usd": {"cuda": 2.5}, "stacks": {"a": 4}}})).analysis
    assert typed.cost.model_dump(mode="json") == {"card_hour_usd": {"cpu": None, "cuda": 2.5}, "stacks": {"a": 4}}
    assert type(typed.cost.stacks["a"]) is int and type(typed.cost.card_hour_usd.cuda) is float


def test_tolerated_flags_are_kept_in_the_order_given():
    cfg = C.validate(small(analysis={"tolerate_flags": ["latency_outlier", "short_measurement"]}))
    assert cfg.analysis.tolerate_flags == ["latency_outlier", "short_measurement"]
    assert AnalysisConfig(tolerate_flags=FLAGS).tolerate_flags == FLAGS  # every flag may be tolerated


@pytest.mark.parametrize(
    "sections, expect",
    [
        (
            {"analysis": {"cost": {"card_hour_usd": {"cpu": 0}}}},
            "analysis.cost.card_hour_usd.cpu: 0 is less than or equal to the minimum of 0",
        ),
        (
            {"analysis": {"cost": {"card_hour_usd": {"cuda": "2"}}}},
            "analysis.cost.card_hour_usd.cuda: '2' is not of type 'number', 'null'",
        ),
        (
            {"analysis": {"cost": {"card_hour_usd": {"gpu": 2}}}},
            "analysis.cost.card_hour_usd: unknown key 'gpu' (expected one of: cpu, cuda)",
        ),
        (
            {"analysis": {"cost": {"stacks": {"a": -1}}}},
            "analysis.cost.stacks.a: -1 is less than or equal to the minimum of 0",
        ),
        ({"analysis": {"cost": {"stacks": {"a": None}}}}, "analysis.cost.stacks.a: None is not of type 'number'"),
        (
            {"analysis": {"cost": {"hourly": 1}}},
            "analysis.cost: unknown key 'hourly' (expected one of: card_hour_usd, stacks)",
        ),
        (
            {"analysis": {"tolerate_flags": ["client_lag"]}},
            f"analysis.tolerate_flags[0]: 'client_lag' is not one of {FLAGS}",
        ),
        ({"analysis": {"flags": []}}, "analysis: unknown key 'flags' (expected one of: cost, tolerate_flags)"),
        (
            {"report": {"headline": [{"users": 0, "workload": "w"}]}},
            "report.headline[0].users: 0 is less than the minimum of 1",
        ),
        ({"report": {"headline": [{"users": 1}]}}, "report.headline[0]: 'workload' is a required property"),
        ({"report": {"headline": [{"workload": "w"}]}}, "report.headline[0]: 'users' is a required property"),
        (  # absent, not null, means each of the grid's sampling modes
            {"report": {"headline": [{"users": 1, "workload": "w", "sampling": None}]}},
            "report.headline[0].sampling: None is not of type 'string'",
        ),
        (
            {"report": {"headline": [{"users": 1, "workload": "w", "stack": "a"}]}},
            "report.headline[0]: unknown key 'stack' (expected one of: sampling, users, workload)",
        ),
        ({"report": {"kernel_reference": 3}}, "report.kernel_reference: 3 is not of type 'string', 'null'"),
        (
            {"estimate": {"output_tok_s": {"cpu": 0}}},
            "estimate.output_tok_s.cpu: 0 is less than or equal to the minimum of 0",
        ),
        ({"estimate": {"output_tok_s": {"cuda": None}}}, "estimate.output_tok_s.cuda: None is not of type 'number'"),
        ({"estimate": {"startup_s": {"cuda": -1}}}, "estimate.startup_s.cuda: -1 is less than the minimum of 0"),
        ({"estimate": {"startup_s": {"gpu": 1}}}, "estimate.startup_s: unknown key 'gpu' (expected one of: cpu, cuda)"),
        (
            {"estimate": {"startup_warm_s": {"cpu": -5}}},
            "estimate.startup_warm_s.cpu: -5 is less than the minimum of 0",
        ),
        ({"estimate": {"job_overhead_s": -1}}, "estimate.job_overhead_s: -1 is less than the minimum of 0"),
        (
            {"estimate": {"roofline_efficiency": 0}},
            "estimate.roofline_efficiency: 0 is less than or equal to the minimum of 0",
        ),
        (
            {"estimate": {"roofline_efficiency": 1.5}},
            "estimate.roofline_efficiency: 1.5 is greater than the maximum of 1",
        ),
        ({"estimate": {"margin": 0.5}}, "estimate.margin: 0.5 is less than the minimum of 1"),
        ({"estimate": {"min_runtime_min": 0}}, "estimate.min_runtime_min: 0 is less than the minimum of 1"),
        ({"estimate": {"min_runtime_min": 1.5}}, "estimate.min_runtime_min: 1.5 is not of type 'integer'"),
        ({"estimate": {"bandwidth_gb_s": "fast"}}, "estimate.bandwidth_gb_s: 'fast' is not of type 'number', 'null'"),
    ],
)
def test_a_wrong_key_is_refused_in_one_line_naming_its_path(sections, expect):
    assert refusal(**sections) == f"config error at {expect}"


@pytest.mark.parametrize("bandwidth", [0, -3350, -0.5])
def test_a_card_bandwidth_that_is_not_above_zero_is_refused(bandwidth):
    """A bandwidth of 0 was taken as 'none given' (estimate.py asks `if bandwidth_gb_s`) and a
    negative one priced each decode step below zero: both are refused where the config is read,
    as every other rate of the section is."""
    assert refusal(estimate={"bandwidth_gb_s": bandwidth}) == (
        f"config error at estimate.bandwidth_gb_s: {bandwidth} is less than or equal to the minimum of 0"
    )
    with pytest.raises(ValidationError, match="bandwidth_gb_s"):
        EstimateConfig(bandwidth_gb_s=bandwidth)
    assert C.validate(small(estimate={"bandwidth_gb_s": 4800})).estimate.bandwidth_gb_s == 4800


@pytest.mark.parametrize(
    "model, fields",
    [
        (CardPrices, {"cpu": 0}),
        (CostConfig, {"stacks": {"a": 0}}),
        (AnalysisConfig, {"tolerate_flags": ["client_lag"]}),
        (Headline, {"users": 0, "workload": "w"}),
        (Headline, {"users": 1}),
        (ReportConfig, {"headline": [{"users": 1, "workload": "w", "cells": 2}]}),
        (EstimateConfig, {"output_tok_s": {"cuda": 0}}),
        (EstimateConfig, {"startup_s": {"cpu": -1}}),
        (EstimateConfig, {"roofline_efficiency": 1.01}),
        (EstimateConfig, {"margin": 0.99}),
        (EstimateConfig, {"min_runtime_min": 0}),
        (EstimateConfig, {"job_overhead_s": -0.1}),
    ],
)
def test_the_typed_sections_refuse_what_the_schema_refuses(model, fields):
    with pytest.raises(ValidationError):
        model(**fields)


def test_a_value_at_its_bound_is_taken_and_kept_as_yaml_gave_it():
    at = {
        "output_tok_s": {"cpu": 0.5, "cuda": 1},
        "startup_s": {"cpu": 0, "cuda": 0.0},
        "job_overhead_s": 0,
        "roofline_efficiency": 1,
        "margin": 1,
        "min_runtime_min": 1,
        "bandwidth_gb_s": 0.001,
    }
    cfg = C.validate(small(estimate=at))
    filled = cfg.filled()["estimate"]
    typed = cfg.estimate
    assert typed.model_dump(include=set(at)) == at
    assert [type(typed.startup_s.cpu), type(typed.startup_s.cuda), type(typed.margin)] == [int, float, int]
    assert filled["startup_warm_s"] == FILLED["estimate"]["startup_warm_s"]  # an object given in part is filled


def test_the_report_names_workloads_sampling_and_a_stack_of_the_config():
    assert refusal(report={"headline": [{"users": 2, "workload": "w"}, {"users": 2, "workload": "x"}]}) == (
        "config error at report.headline[1].workload: unknown workload 'x'"
    )
    assert refusal(report={"headline": [{"users": 2, "workload": "w", "sampling": "x"}]}) == (
        "config error at report.headline[0].sampling: unknown sampling 'x'"
    )
    assert refusal(report={"kernel_reference": "x"}) == "config error at report.kernel_reference: unknown stack 'x'"
    cfg = C.validate(small(report={"kernel_reference": "b"}))
    assert cfg.report.kernel_reference == "b" == G.kernel_reference(cfg)


def test_a_headline_without_sampling_stands_for_each_of_the_grids():
    headline = [{"users": 2, "workload": "w"}, {"users": 4, "workload": "v", "sampling": "hot"}]
    cfg = C.validate(small(report={"headline": headline}))
    assert cfg.filled()["report"]["headline"] == headline  # nothing filled: sampling stays absent
    typed = cfg.report.headline
    assert typed == [Headline(users=2, workload="w"), Headline(users=4, workload="v", sampling="hot")]
    assert typed[0].sampling is None
    assert G.headline(cfg) == headline  # what the report is handed: absent, not null


def test_the_schema_entries_are_the_sections_filled_from_empty_defaults():
    schemas = json_schemas()
    assert list(schemas) == ["analysis", "report", "estimate"]
    for key, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert (schema["type"], schema["additionalProperties"], schema["default"]) == ("object", False, {}), key
        assert list(schema["properties"]) == list(MODELS[key].model_fields) and "required" not in schema
        assert schema == {**plain_schema(MODELS[key]), "default": {}}, key  # generated from the section's type
    analysis, report, estimate = (schemas[k]["properties"] for k in schemas)
    # each object inside a section is filled from {} where it is absent
    for nested in (analysis["cost"], analysis["cost"]["properties"]["card_hour_usd"]):
        assert (nested["default"], nested["additionalProperties"]) == ({}, False)
    for key in ("output_tok_s", "startup_s", "startup_warm_s"):
        assert estimate[key]["default"] == {} and list(estimate[key]["properties"]) == ["cpu", "cuda"]
        assert {k: p["default"] for k, p in estimate[key]["properties"].items()} == FILLED["estimate"][key]
    prices = analysis["cost"]["properties"]["card_hour_usd"]["properties"]
    assert prices["cpu"] == {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "default": None,
        "description": "A CPU run's host, dollars an hour (null: not priced).",
    }
    assert analysis["cost"]["properties"]["stacks"]["additionalProperties"] == {"type": "number", "exclusiveMinimum": 0}
    assert analysis["tolerate_flags"]["items"] == {"type": "string", "enum": FLAGS}
    headline = report["headline"]["items"]
    assert (headline["required"], headline["additionalProperties"]) == (["users", "workload"], False)
    assert headline["properties"]["sampling"] == {
        "type": "string",  # absent unless given: no default, no null
        "description": "Its sampling (absent: each of the grid's).",
    }
    assert report["kernel_reference"]["type"] == ["string", "null"]
    assert {k: v for k, v in estimate["bandwidth_gb_s"].items() if k != "description"} == {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "default": None,
    }
    assert {k: v for k, v in estimate["roofline_efficiency"].items() if k != "description"} == {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "default": 0.5,
    }


def test_a_description_is_one_line_and_says_null_only_where_null_is_taken():
    def walk(schema, where):
        for key, p in schema.get("properties", {}).items():
            yield f"{where}.{key}", p
            yield from walk(p, f"{where}.{key}")
            yield from walk(p.get("items", {}), f"{where}.{key}[]")

    for section, schema in json_schemas().items():
        assert schema["description"].strip() and "\n" not in schema["description"], section
        for where, p in walk(schema, section):
            text = p.get("description", "")
            assert "\n" not in text and "  " not in text, where
            types = p["type"] if isinstance(p.get("type"), list) else [p.get("type")]
            if "null" not in types and "object" not in types:  # an object's note on null speaks of its keys
                assert "null" not in text, f"{where}: {text}"


def test_the_default_config_reports_and_estimates_by_the_defaults():
    cfg = C.load()
    for key in FILLED:
        assert cfg.filled()[key] == FILLED[key] and getattr(cfg, key) == MODELS[key](), key


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_output_sections_of_every_shipped_config_pass_their_schema_entries_and_types(name):
    """Each file over the default (the names it gives are checked where the file is loaded)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    for key, schema in json_schemas().items():
        section = merged.get(key, {})
        assert [e.message for e in Draft202012Validator(schema).iter_errors(section)] == [], f"{name}: {key}"
        assert MODELS[key].model_validate(section).model_dump(include=set(section), exclude_unset=True) == section
