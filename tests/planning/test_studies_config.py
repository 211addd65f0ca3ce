"""The studies beside the grid a config may ask for (speedsplit/planning/studies_config.py): the
capacity sweep, the latency objectives, the factorial, the coordination profile, the
interconnect control and the kernel-level mechanism: their defaults (every study off), their
bounds as a user meets them (one line naming the key) and as the typed sections keep them, the
names each must share with the rest of the config once it is on, the schema entries generated
from them, and every shipped config's sections reading as them."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning import plan as P
from speedsplit.planning.studies_config import (
    SECTIONS,
    CapacityConfig,
    CoordinationConfig,
    FactorialConfig,
    LinkControlConfig,
    MechanismConfig,
    ProfileConfig,
    SloConfig,
)
from speedsplit.planning.typed_config import plain_schema

FILLED = {
    "capacity": {
        "enabled": False,
        "users": [16, 32, 64, 96, 128, 192, 256, 384, 512],
        "workload": None,
        "sampling": "greedy",
        "stacks": [],
        "runs": 1,
        "stop_after": 2,
        "reference": None,
    },
    "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1},
    "factorial": {
        "enabled": False,
        "users": 64,
        "workload": None,
        "fast": "vllm-fp16",
        "low": "hf-generate",
        "high": "hf-generate-b64",
        "sampling": ["greedy", "ancestral"],
    },
    "coordination": {
        "enabled": False,
        "stack": "vllm-fp16",
        "topologies": ["tp1"],
        "cell": None,
        "delay_iterations": 16,
        "iterations": 32,
    },
    "link_control": {"enabled": False, "gpus": 2, "max_mib": 256},
    "mechanism": {"profile": {"cells": [], "delay_iterations": 16, "iterations": 32}},
}
# keys absent unless given: the schema fills neither a default nor null
ABSENT = {"capacity": {"rates"}, "mechanism.profile": {"stacks"}}
VLLM = ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model_dir}"]
HF = {"args": ["{python}", "-m", "transformers.cli.transformers", "serve"], "dialect": "transformers"}
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schemas() -> dict[str, dict]:
    """The config schema's entries of these sections."""
    top = C.load_schema()["properties"]
    return {key: top[key] for key in SECTIONS}


def small(**sections) -> dict:
    """A small config on a CPU: an HF-like stack and two vLLM ones in a chain, a closed-loop and
    an open-loop workload, two sampling modes, a grid of 1 and 4 users at the closed loop."""
    return {
        "platform": "cpu",
        "models": {"m": {}},
        "stacks": {"hf": HF, "v": {"args": VLLM}, "v2": {"args": VLLM + ["--x"]}},
        "chains": {"c": ["hf", "v", "v2"]},
        "workloads": {
            "w": {"prompt_tokens": 8, "output_tokens": 8},
            "o": {"prompt_tokens": 8, "output_tokens": 8, "arrival": {"rates": [1, 2], "requests": 5}},
        },
        "sampling": {"greedy": {}, "hot": {"temperature": 1}},
        "grid": {"users": [1, 4], "workloads": ["w"], "runs": 2},
        **sections,
    }


def refusal(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(**sections))
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("key", list(SECTIONS))
def test_a_config_without_the_section_gets_every_default_and_reads_it_typed(key):
    cfg = C.validate(small())
    assert cfg.filled()[key] == FILLED[key]
    assert SECTIONS[key]().model_dump(exclude_none=True) == {k: v for k, v in FILLED[key].items() if v is not None}
    assert getattr(cfg, key) == SECTIONS[key]()


def test_every_study_is_off_unless_asked_for():
    cfg = C.validate(small())
    assert not any(getattr(cfg, k).enabled for k in ("capacity", "factorial", "coordination", "link_control"))
    assert cfg.mechanism.profile.cells == [] and P.profiled_stacks(cfg) == ["v", "v2"]
    assert (G.capacity_spec(cfg), G.factorial_spec(cfg)) == (None, None)
    assert all(P.profile_window(cfg, job) is None for job in P.bench_jobs(cfg))
    # a study that is off checks none of its names
    off = {"workload": "nope", "stacks": ["nope"], "sampling": "nope", "reference": "nope"}
    assert C.validate(small(capacity=off)).filled()["capacity"]["workload"] == "nope"
    cfg = C.validate(small(factorial={"fast": "nope"}, coordination={"stack": "nope", "cell": "nope"}))
    assert (cfg.factorial.fast, cfg.coordination.cell) == ("nope", "nope")


def test_the_mechanism_profile_is_filled_where_the_config_names_no_profile():
    """The filled config (the report's 'Config (validated, defaults filled)') holds the profile's
    defaults as it holds every other object's inside a section."""
    assert C.validate(small(mechanism={})).filled()["mechanism"] == FILLED["mechanism"]
    assert json_schemas()["mechanism"]["properties"]["profile"]["default"] == {}
    given = C.validate(small(mechanism={"profile": {"cells": ["u4-w-greedy"], "stacks": ["v"]}})).filled()["mechanism"]
    assert given == {"profile": {**FILLED["mechanism"]["profile"], "cells": ["u4-w-greedy"], "stacks": ["v"]}}


@pytest.mark.parametrize(
    "sections, expect",
    [
        ({"capacity": {"enabled": 1}}, "capacity.enabled: 1 is not of type 'boolean'"),
        ({"capacity": {"users": []}}, "capacity.users: [] should be non-empty"),
        ({"capacity": {"users": [8, 0]}}, "capacity.users[1]: 0 is less than the minimum of 1"),
        ({"capacity": {"rates": []}}, "capacity.rates: [] should be non-empty"),
        ({"capacity": {"rates": [1, 0]}}, "capacity.rates[1]: 0 is less than or equal to the minimum of 0"),
        ({"capacity": {"rates": None}}, "capacity.rates: None is not of type 'array'"),
        ({"capacity": {"workload": 3}}, "capacity.workload: 3 is not of type 'string', 'null'"),
        ({"capacity": {"sampling": None}}, "capacity.sampling: None is not of type 'string'"),
        ({"capacity": {"runs": 0}}, "capacity.runs: 0 is less than the minimum of 1"),
        ({"capacity": {"stop_after": 0}}, "capacity.stop_after: 0 is less than the minimum of 1"),
        (
            {"capacity": {"levels": [1]}},
            "capacity: unknown key 'levels' (expected one of: enabled, rates, reference, runs, sampling, stacks, "
            "stop_after, users, workload)",
        ),
        ({"slo": {"ttft_p99_s": 0}}, "slo.ttft_p99_s: 0 is less than or equal to the minimum of 0"),
        ({"slo": {"tpot_p99_s": "0.1"}}, "slo.tpot_p99_s: '0.1' is not of type 'number'"),
        ({"slo": {"e2e_p99_s": 1}}, "slo: unknown key 'e2e_p99_s' (expected one of: tpot_p99_s, ttft_p99_s)"),
        ({"factorial": {"users": 0}}, "factorial.users: 0 is less than the minimum of 1"),
        ({"factorial": {"sampling": ["greedy"]}}, "factorial.sampling: ['greedy'] is too short"),
        ({"factorial": {"sampling": ["greedy", "hot", "x"]}}, "factorial.sampling: ['greedy', 'hot', 'x'] is too long"),
        ({"factorial": {"fast": None}}, "factorial.fast: None is not of type 'string'"),
        ({"coordination": {"topologies": "tp1"}}, "coordination.topologies: 'tp1' is not of type 'array'"),
        ({"coordination": {"delay_iterations": -1}}, "coordination.delay_iterations: -1 is less than the minimum of 0"),
        ({"coordination": {"iterations": 0}}, "coordination.iterations: 0 is less than the minimum of 1"),
        ({"link_control": {"gpus": 1}}, "link_control.gpus: 1 is less than the minimum of 2"),
        ({"link_control": {"max_mib": 0}}, "link_control.max_mib: 0 is less than the minimum of 1"),
        ({"link_control": {"max_mib": 2.5}}, "link_control.max_mib: 2.5 is not of type 'integer'"),
        (
            {"mechanism": {"profile": {"iterations": 0}}},
            "mechanism.profile.iterations: 0 is less than the minimum of 1",
        ),
        (
            {"mechanism": {"profile": {"delay_iterations": -1}}},
            "mechanism.profile.delay_iterations: -1 is less than the minimum of 0",
        ),
        (  # absent, not null, means every vLLM stack benchmarked
            {"mechanism": {"profile": {"stacks": None}}},
            "mechanism.profile.stacks: None is not of type 'array'",
        ),
        ({"mechanism": {"engine": {}}}, "mechanism: unknown key 'engine' (expected one of: profile)"),
    ],
)
def test_a_wrong_key_is_refused_in_one_line_naming_its_path(sections, expect):
    assert refusal(**sections) == f"config error at {expect}"


@pytest.mark.parametrize(
    "model, fields",
    [
        (CapacityConfig, {"users": []}),
        (CapacityConfig, {"rates": [0]}),
        (CapacityConfig, {"rates": []}),
        (CapacityConfig, {"stop_after": 0}),
        (SloConfig, {"tpot_p99_s": 0}),
        (FactorialConfig, {"sampling": ["greedy"]}),
        (FactorialConfig, {"users": 0}),
        (CoordinationConfig, {"iterations": 0}),
        (LinkControlConfig, {"gpus": 1}),
        (ProfileConfig, {"delay_iterations": -1}),
        (MechanismConfig, {"profile": {"cells": "u1"}}),
    ],
)
def test_the_typed_sections_refuse_what_the_schema_refuses(model, fields):
    with pytest.raises(ValidationError):
        model(**fields)


def test_a_value_at_its_bound_is_taken_and_kept_as_yaml_gave_it():
    cfg = C.validate(small(slo={"ttft_p99_s": 1, "tpot_p99_s": 0.001}, link_control={"gpus": 2, "max_mib": 1}))
    assert (cfg.slo.ttft_p99_s, cfg.slo.tpot_p99_s) == (1, 0.001)
    assert type(cfg.slo.ttft_p99_s) is int
    assert cfg.link_control == LinkControlConfig(max_mib=1)
    cell = G.cell_params(cfg, G.cells(cfg)[0])  # what each job is judged by
    assert (cell["slo_ttft_p99_s"], cell["slo_tpot_p99_s"]) == (1.0, 0.001)


def test_the_capacity_ladder_is_its_levels_ascending_at_most_the_grids_runs():
    cfg = C.validate(small(capacity={"enabled": True, "users": [8, 2, 8, 4], "runs": 5, "stop_after": 1}))
    levels = [c for c in G.cells(cfg) if c.runs is not None]
    # 4 users is a grid cell already: measured as the grid says, and still below 8
    assert [(c.name, c.runs, c.below) for c in levels] == [
        ("u2-w-greedy", 2, ()),
        ("u8-w-greedy", 2, ("u2-w-greedy", "u4-w-greedy")),
    ]
    assert G.cell_params(cfg, levels[-1])["capacity_stop_after"] == 1
    spec = G.capacity_spec(cfg)
    assert (spec["workload"], spec["reference"]) == ("w", None)  # the grid's first cell's; no gptq step
    rates = C.validate(small(capacity={"enabled": True, "workload": "o", "rates": [3, 1], "reference": "v"}))
    assert [(c.name, c.below) for c in G.cells(rates) if c.runs] == [
        ("r1-o-greedy", ()),
        ("r3-o-greedy", ("r1-o-greedy",)),
    ]
    assert G.capacity_spec(rates)["reference"] == "v"


@pytest.mark.parametrize(
    "capacity, expect",
    [
        ({"stacks": ["v", "x"]}, "capacity.stacks[1]: unknown stack 'x'"),
        ({"reference": "x"}, "capacity.reference: unknown stack 'x'"),
        ({"sampling": "x"}, "capacity.sampling: unknown sampling 'x'"),
        ({"workload": "o"}, "capacity.rates: an open-loop capacity workload needs its ladder of rates"),
    ],
)
def test_a_capacity_sweep_names_what_the_config_has(capacity, expect):
    assert refusal(capacity={"enabled": True, **capacity}) == f"config error at {expect}"


def test_a_capacity_sweep_is_of_users_or_of_arrival_rates_not_of_a_load_that_sets_itself():
    sessions = {
        "prompt_tokens": 8,
        "output_tokens": 8,
        "sessions": {"rates": [1], "count": 2, "turns": 2, "turn_tokens": 4},
    }
    workloads = {**small()["workloads"], "s": sessions}
    assert refusal(workloads=workloads, capacity={"enabled": True, "workload": "s"}) == (
        "config error at capacity.workload: a sessions workload sets its own load; sweep users or an arrival workload"
    )


@pytest.mark.parametrize(
    "factorial, expect",
    [
        ({"fast": "x"}, "factorial.fast: unknown stack 'x'"),
        ({"fast": "v", "low": "x"}, "factorial.low: unknown stack 'x'"),
        ({"fast": "v", "low": "hf", "high": "x"}, "factorial.high: unknown stack 'x'"),
        (
            {"fast": "v", "low": "hf", "high": "hf", "sampling": ["greedy", "x"]},
            "factorial.sampling[1]: unknown sampling 'x'",
        ),
        (
            {"fast": "v", "low": "hf", "high": "hf", "sampling": ["greedy", "hot"], "workload": "x"},
            "factorial.workload: unknown workload 'x'",
        ),
    ],
)
def test_a_factorial_names_stacks_sampling_and_a_workload_of_the_config(factorial, expect):
    assert refusal(factorial={"enabled": True, **factorial}) == f"config error at {expect}"


def test_a_factorials_workload_is_the_grids_first_cells_unless_named():
    on = {"enabled": True, "fast": "v", "low": "hf", "high": "v2", "sampling": ["greedy", "hot"]}
    assert G.factorial_spec(C.validate(small(factorial=on)))["workload"] == "w"
    assert G.factorial_spec(C.validate(small(factorial={**on, "workload": "o"})))["workload"] == "o"


@pytest.mark.parametrize(
    "sections, expect",
    [
        ({"coordination": {"stack": "hf"}}, "coordination.stack: 'hf' is not a vLLM stack of this config"),
        ({"coordination": {"stack": "x"}}, "coordination.stack: 'x' is not a vLLM stack of this config"),
        (
            {"coordination": {"stack": "v", "topologies": ["tp9"]}},
            "coordination.topologies[0]: 'tp9' is not a single-instance topology",
        ),
        (
            {
                "coordination": {"stack": "v", "topologies": ["tp1", "2x1"]},
                "topologies": {"tp1": {}, "2x1": {"instances": 2}},
            },
            "coordination.topologies[1]: '2x1' is not a single-instance topology",
        ),
        (
            {
                "coordination": {"stack": "v", "topologies": ["tp2"]},
                "topologies": {"tp1": {}, "tp2": {"tensor_parallel": 2}},
                "platform": "cuda",
                "gpus_available": 1,
            },
            "coordination.topologies[0]: 'tp2' needs more GPUs than gpus_available",
        ),
        ({"coordination": {"stack": "v", "cell": "u64-w-greedy"}}, "coordination.cell: unknown cell 'u64-w-greedy'"),
    ],
)
def test_a_coordination_profile_names_a_vllm_stack_single_instance_topologies_and_a_cell(sections, expect):
    sections = {**sections, "coordination": {"enabled": True, **sections["coordination"]}}
    assert refusal(**sections) == f"config error at {expect}"


def test_a_coordination_profile_runs_the_grids_first_cell_unless_named():
    on = {"enabled": True, "stack": "v"}
    assert G.coordination_cell(C.validate(small(coordination=on))).name == "u1-w-greedy"
    named = C.validate(small(coordination={**on, "cell": "u4-w-greedy"}))
    assert G.coordination_cell(named).name == "u4-w-greedy" and named.coordination.cell == "u4-w-greedy"


@pytest.mark.parametrize(
    "profile, expect",
    [
        ({"cells": ["u4-w-greedy", "u9-w-greedy"]}, "mechanism.profile.cells[1]: unknown cell 'u9-w-greedy'"),
        (
            {"cells": ["r1-o-greedy"]},
            "mechanism.profile.cells[0]: 'r1-o-greedy' is an open-loop or trace cell (a profiled window is one "
            "request per user of a closed-loop cell)",
        ),
        (
            {"cells": [], "stacks": ["v", "hf"]},
            "mechanism.profile.stacks[1]: 'hf' is not a vLLM stack of this config (the profiler is vLLM's)",
        ),
    ],
)
def test_a_mechanism_profile_names_closed_loop_cells_and_vllm_stacks(profile, expect):
    grid = {"users": [1, 4], "workloads": ["w", "o"]}
    assert refusal(grid=grid, mechanism={"profile": profile}) == f"config error at {expect}"


def test_a_profiled_window_is_run_zero_of_a_named_cell_on_a_profiled_stack():
    cfg = C.validate(small(mechanism={"profile": {"cells": ["u4-w-greedy"], "stacks": ["v2"], "iterations": 8}}))
    windows = {(j.stack, j.cell, j.run): P.profile_window(cfg, j) for j in P.bench_jobs(cfg)}
    assert {k: w for k, w in windows.items() if w} == {
        ("v2", "u4-w-greedy", 0): {"delay_iterations": 16, "iterations": 8}
    }
    # absent stacks: every vLLM stack benchmarked; an empty list: none
    cfg = C.validate(small(mechanism={"profile": {"cells": ["u4-w-greedy"]}}))
    assert P.profiled_stacks(cfg) == ["v", "v2"]
    assert P.profiled_stacks(C.validate(small(mechanism={"profile": {"stacks": []}}))) == []


def test_the_schema_entries_are_the_sections_filled_from_empty_defaults():
    schemas = json_schemas()
    assert list(schemas) == list(SECTIONS) == list(FILLED)
    for key, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert (schema["type"], schema["additionalProperties"], schema["default"]) == ("object", False, {}), key
        assert list(schema["properties"]) == list(SECTIONS[key].model_fields) and "required" not in schema
        assert schema == {**plain_schema(SECTIONS[key]), "default": {}}, key  # generated from the section's type
    for where, keys in ABSENT.items():
        section, _, inner = where.partition(".")
        props = schemas[section]["properties"][inner]["properties"] if inner else schemas[section]["properties"]
        for key in keys:
            assert "default" not in props[key] and props[key]["type"] == "array", f"{where}.{key}"
    capacity = schemas["capacity"]["properties"]
    assert capacity["rates"]["items"] == {"type": "number", "exclusiveMinimum": 0}
    assert (capacity["rates"]["minItems"], capacity["users"]["minItems"]) == (1, 1)
    assert capacity["workload"]["type"] == capacity["reference"]["type"] == ["string", "null"]
    factorial = schemas["factorial"]["properties"]["sampling"]
    assert (factorial["minItems"], factorial["maxItems"]) == (2, 2)
    assert schemas["link_control"]["properties"]["gpus"]["minimum"] == 2
    assert schemas["slo"]["properties"]["ttft_p99_s"]["type"] == "number"


def _keys(schema: dict, where: str):
    for key, p in schema.get("properties", {}).items():
        yield f"{where}.{key}", p
        yield from _keys(p, f"{where}.{key}")


def test_a_description_is_one_line_and_says_null_only_where_null_is_taken():
    for section, schema in json_schemas().items():
        assert schema["description"].strip() and "\n" not in schema["description"], section
        for where, p in _keys(schema, section):
            text = p.get("description", "")
            assert "\n" not in text and "  " not in text, where
            if "null" not in (p["type"] if isinstance(p.get("type"), list) else [p.get("type")]):
                assert "null" not in text, f"{where}: {text}"


def test_the_default_config_asks_for_no_study():
    cfg = C.load()
    for key in SECTIONS:
        assert cfg.filled()[key] == FILLED[key] and getattr(cfg, key) == SECTIONS[key](), key


def test_the_h200_studies_read_as_their_files_say():
    capacity = C.load(REPO / "config/h200-smoke.yaml", REPO / "config/h200-capacity.yaml")
    assert capacity.capacity == CapacityConfig(
        enabled=True, workload="h200-wide", stacks=["vllm-fp16", "vllm-marlin", "hf-fp16"], reference="vllm-fp16"
    )
    topologies = C.load(REPO / "config/h200-smoke.yaml", REPO / "config/h200-topologies.yaml")
    assert topologies.coordination == CoordinationConfig(
        enabled=True, topologies=["tp1", "tp2"], cell="u64-h200-wide-greedy"
    )
    assert topologies.link_control == LinkControlConfig(enabled=True)
    why = C.load(REPO / "config/h200-smoke.yaml", REPO / "config/h200-why.yaml")
    assert why.mechanism.profile == ProfileConfig(cells=["u64-h200-wide-greedy", "u8-h200-narrow-greedy"])


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_study_sections_of_every_shipped_config_pass_their_schema_entries_and_types(name):
    """Each file over the default (what they name is checked where the files are loaded together)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    for key, schema in json_schemas().items():
        section = merged.get(key, {})
        assert [e.message for e in Draft202012Validator(schema).iter_errors(section)] == [], f"{name}: {key}"
        typed = SECTIONS[key].model_validate(section)
        assert typed.model_dump(include=set(section), exclude_unset=True) == section, f"{name}: {key}"


# Found by this file's tests, mended in planning/config.py and plan.py: each was a KeyError or a
# check that let a non-vLLM stack through.


def test_an_unknown_capacity_workload_is_one_line_not_a_key_error():
    with pytest.raises(ConfigError, match=r"^config error at capacity.workload: unknown workload 'nope'$"):
        C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"capacity": {"enabled": True, "workload": "nope"}}))


def test_an_unknown_benchmark_model_beside_a_drafting_stack_is_one_line_not_a_key_error():
    top = {"benchmark": {"models": ["nope"], "stacks": ["vllm-fp16-draft"]}}
    with pytest.raises(ConfigError, match=r"^config error at benchmark.models\[0\]: unknown model 'nope'$"):
        C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), top))


@pytest.mark.parametrize(
    "top, where",
    [
        ({"coordination": {"enabled": True, "stack": "reference"}}, "coordination.stack"),
        ({"mechanism": {"profile": {"stacks": ["hf-generate"]}}}, r"mechanism.profile.stacks\[0\]"),
    ],
)
def test_a_stack_that_runs_no_vllm_is_not_taken_for_one_by_its_default_dialect(top, where):
    with pytest.raises(ConfigError, match=rf"^config error at {where}: .* is not a vLLM stack"):
        C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), top))


def test_the_stacks_profiled_by_default_are_the_vllm_ones():
    top = {"benchmark": {"stacks": ["hf-generate", "reference", "vllm-fp16", "vllm-marlin"]}}
    cfg = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), top))
    assert P.profiled_stacks(cfg) == ["vllm-fp16", "vllm-marlin"]


def test_a_link_control_over_more_cards_than_the_host_has_is_refused():
    top = {"platform": "cuda", "gpus_available": 1, "link_control": {"enabled": True, "gpus": 2}}
    with pytest.raises(ConfigError, match=r"^config error at link_control.gpus: the control leases 2 GPUs"):
        C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), top))
