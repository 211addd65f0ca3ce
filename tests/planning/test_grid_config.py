"""The grid as a config gives it (speedsplit/planning/grid_config.py): a sampling mode
(`sampling.<name>`), the grid of cells (`grid`: a product or cells named one by one) and a
topology (`topologies.<name>`): their defaults, their bounds as a user meets them (one line
naming the key) and as the typed entries keep them, the names they must share with the rest of
the config, the schema entries generated from them, and every shipped config's reading as them."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.grid_config import (
    CellEntry,
    GridConfig,
    SamplingConfig,
    TopologyConfig,
)
from speedsplit.planning.typed_config import plain_schema

SAMPLING = {"temperature": 0, "top_p": 1, "seed": 0}
GRID = {"users": [1], "workloads": [], "sampling": [], "runs": 3, "cells": []}
CELL = {"sampling": "greedy", "stacks": []}  # what a cell holds beside its users and workload
TOPOLOGY = {"tensor_parallel": 1, "instances": 1, "stacks": []}
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schemas() -> dict[str, dict]:
    """The config schema's entries: one sampling mode, the grid (filled when absent), one topology."""
    top = C.load_schema()["properties"]
    return {
        "sampling": top["sampling"]["additionalProperties"],
        "grid": top["grid"],
        "topology": top["topologies"]["additionalProperties"],
    }


def small(**sections) -> dict:
    """A small config: one model, two stacks, two workloads, two sampling modes, on a CPU."""
    return {
        "platform": "cpu",
        "models": {"m": {}},
        "stacks": {"a": {"args": ["a"]}, "b": {"args": ["b"]}},
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}, "v": {"prompt_tokens": 4, "output_tokens": 4}},
        "sampling": {"greedy": {}, "hot": {"temperature": 0.7, "top_p": 0.9, "seed": 7}},
        **sections,
    }


def refusal(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(**sections))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_sampling_mode_given_nothing_is_greedy_over_the_whole_distribution():
    cfg = C.validate(small())
    assert cfg.filled()["sampling"] == {"greedy": SAMPLING, "hot": {"temperature": 0.7, "top_p": 0.9, "seed": 7}}
    assert SamplingConfig().model_dump() == SAMPLING
    assert cfg.sampling["greedy"] == SamplingConfig()
    hot = cfg.sampling["hot"]
    assert (hot.temperature, hot.top_p, hot.seed) == (0.7, 0.9, 7)


def test_a_config_without_a_grid_measures_one_user_at_every_workload_and_sampling_three_times():
    cfg = C.validate(small())
    assert cfg.filled()["grid"] == {**GRID, "workloads": ["w", "v"], "sampling": ["greedy", "hot"]}  # config order
    assert GridConfig().model_dump() == GRID
    assert cfg.grid == GridConfig(workloads=["w", "v"], sampling=["greedy", "hot"])
    assert [c.name for c in G.cells(cfg)] == ["u1-w-greedy", "u1-w-hot", "u1-v-greedy", "u1-v-hot"]


def test_a_named_cell_is_greedy_on_every_stack_unless_it_says_otherwise():
    cells = [{"users": 2, "workload": "w"}, {"users": 4, "workload": "v", "sampling": "hot", "stacks": ["b"]}]
    cfg = C.validate(small(grid={"cells": cells}))
    assert cfg.filled()["grid"]["cells"] == [{**cells[0], **CELL}, cells[1]]
    typed = cfg.grid.cells
    assert typed == [CellEntry(users=2, workload="w"), CellEntry(users=4, workload="v", sampling="hot", stacks=["b"])]
    # the cells replace the product of users, workloads and sampling
    assert [(c.name, c.stacks) for c in G.cells(cfg)] == [("u2-w-greedy", ()), ("u4-v-hot", ("b",))]


def test_a_config_without_topologies_measures_on_one_card():
    cfg = C.validate(small())
    assert list(cfg.filled()["topologies"]) == ["tp1"]
    assert cfg.topologies["tp1"] == TopologyConfig() and TopologyConfig().model_dump() == TOPOLOGY
    cfg = C.validate(small(topologies={"tp1": {}, "2x2": {"tensor_parallel": 2, "instances": 2, "stacks": ["a"]}}))
    assert cfg.filled()["topologies"] == {
        "tp1": TOPOLOGY,
        "2x2": {"tensor_parallel": 2, "instances": 2, "stacks": ["a"]},
    }
    assert G.topology_gpus(cfg, "2x2") == 4
    assert (G.bench_stacks(cfg, "2x2"), G.bench_stacks(cfg, "tp1")) == (["a"], ["a", "b"])  # empty: every stack


@pytest.mark.parametrize(
    "sections, expect",
    [
        (
            {"sampling": {"greedy": {"temperature": -0.1}}},
            "sampling.greedy.temperature: -0.1 is less than the minimum of 0",
        ),
        (
            {"sampling": {"greedy": {"top_p": 0}}},
            "sampling.greedy.top_p: 0 is less than or equal to the minimum of 0",
        ),
        ({"sampling": {"greedy": {"top_p": 1.01}}}, "sampling.greedy.top_p: 1.01 is greater than the maximum of 1"),
        ({"sampling": {"greedy": {"seed": 0.5}}}, "sampling.greedy.seed: 0.5 is not of type 'integer'"),
        (
            {"sampling": {"greedy": {"temp": 1}}},
            "sampling.greedy: unknown key 'temp' (expected one of: seed, temperature, top_p)",
        ),
        ({"grid": {"users": []}}, "grid.users: [] should be non-empty"),
        ({"grid": {"users": [1, 0]}}, "grid.users[1]: 0 is less than the minimum of 1"),
        ({"grid": {"users": [1.5]}}, "grid.users[0]: 1.5 is not of type 'integer'"),
        ({"grid": {"runs": 0}}, "grid.runs: 0 is less than the minimum of 1"),
        ({"grid": {"runs": 2.5}}, "grid.runs: 2.5 is not of type 'integer'"),
        ({"grid": {"workloads": "w"}}, "grid.workloads: 'w' is not of type 'array'"),
        ({"grid": {"sampling": [1]}}, "grid.sampling[0]: 1 is not of type 'string'"),
        ({"grid": {"cells": [{"workload": "w"}]}}, "grid.cells[0]: 'users' is a required property"),
        ({"grid": {"cells": [{"users": 1}]}}, "grid.cells[0]: 'workload' is a required property"),
        ({"grid": {"cells": [{"users": 0, "workload": "w"}]}}, "grid.cells[0].users: 0 is less than the minimum of 1"),
        (
            {"grid": {"cells": [{"users": 1, "workload": "w", "runs": 2}]}},
            "grid.cells[0]: unknown key 'runs' (expected one of: sampling, stacks, users, workload)",
        ),
        ({"grid": {"rums": 2}}, "grid: unknown key 'rums' (expected one of: cells, runs, sampling, users, workloads)"),
        (
            {"topologies": {"tp2": {"tensor_parallel": 0}}},
            "topologies.tp2.tensor_parallel: 0 is less than the minimum of 1",
        ),
        ({"topologies": {"tp2": {"instances": 0}}}, "topologies.tp2.instances: 0 is less than the minimum of 1"),
        ({"topologies": {"tp2": {"instances": 1.5}}}, "topologies.tp2.instances: 1.5 is not of type 'integer'"),
        ({"topologies": {"tp2": {"stacks": "a"}}}, "topologies.tp2.stacks: 'a' is not of type 'array'"),
        (
            {"topologies": {"tp2": {"tp": 2}}},
            "topologies.tp2: unknown key 'tp' (expected one of: instances, stacks, tensor_parallel)",
        ),
    ],
)
def test_a_wrong_key_is_refused_in_one_line_naming_its_path(sections, expect):
    assert refusal(**sections) == f"config error at {expect}"


@pytest.mark.parametrize(
    "model, fields",
    [
        (SamplingConfig, {"temperature": -0.1}),
        (SamplingConfig, {"top_p": 0}),
        (SamplingConfig, {"top_p": 1.5}),
        (GridConfig, {"users": []}),
        (GridConfig, {"users": [0]}),
        (GridConfig, {"runs": 0}),
        (CellEntry, {"users": 0, "workload": "w"}),
        (CellEntry, {"users": 1}),
        (TopologyConfig, {"tensor_parallel": 0}),
        (TopologyConfig, {"instances": 0}),
    ],
)
def test_the_typed_entries_refuse_what_the_schema_refuses(model, fields):
    with pytest.raises(ValidationError):
        model(**fields)


def test_a_value_at_its_bound_is_taken_and_kept_as_yaml_gave_it():
    cfg = C.validate(
        small(
            sampling={"greedy": {"temperature": 0, "top_p": 1}, "hot": {"temperature": 1.5, "top_p": 0.01}},
            grid={"users": [1], "runs": 1},
            topologies={"tp1": {"tensor_parallel": 1, "instances": 1}},
        )
    )
    greedy, hot = cfg.sampling["greedy"], cfg.sampling["hot"]
    assert [(type(s.temperature), type(s.top_p)) for s in (greedy, hot)] == [(int, int), (float, float)]
    assert (hot.temperature, hot.top_p) == (1.5, 0.01)
    assert (cfg.grid.users, cfg.grid.runs) == ([1], 1)
    # a seed is any integer: request k of run r is sent seed + 100003 r + k
    assert C.validate(small(sampling={"greedy": {"seed": -3}})).sampling["greedy"].seed == -3


@pytest.mark.parametrize(
    "sections, expect",
    [
        ({"grid": {"workloads": ["w", "x"]}}, "grid.workloads[1]: unknown workloads entry 'x' (known: w, v)"),
        ({"grid": {"sampling": ["x"]}}, "grid.sampling[0]: unknown sampling entry 'x' (known: greedy, hot)"),
        ({"grid": {"cells": [{"users": 1, "workload": "x"}]}}, "grid.cells[0].workload: unknown workload 'x'"),
        (
            {"grid": {"cells": [{"users": 1, "workload": "w"}, {"users": 1, "workload": "w", "sampling": "x"}]}},
            "grid.cells[1].sampling: unknown sampling 'x'",
        ),
        (
            {"grid": {"cells": [{"users": 1, "workload": "w", "stacks": ["a", "x"]}]}},
            "grid.cells[0].stacks[1]: unknown stack 'x'",
        ),
        (  # a cell's sampling defaults to greedy, which a config need not have
            {"sampling": {"hot": {}}, "grid": {"cells": [{"users": 1, "workload": "w"}]}},
            "grid.cells[0].sampling: unknown sampling 'greedy'",
        ),
        ({"topologies": {"tp1": {"stacks": ["x"]}}}, "topologies.tp1.stacks[0]: unknown stack 'x'"),
        (
            {"platform": "cuda", "gpus_available": 3, "topologies": {"tp1": {"tensor_parallel": 2, "instances": 2}}},
            "topologies.tp1: needs 4 GPUs but gpus_available is 3",
        ),
    ],
)
def test_the_names_it_gives_must_be_the_configs(sections, expect):
    assert refusal(**sections) == f"config error at {expect}"


def test_a_topology_needs_no_card_on_a_cpu():
    big = {"tp1": {"tensor_parallel": 8, "instances": 8}}
    assert G.topology_gpus(C.validate(small(topologies=big, gpus_available=0)), "tp1") == 64


def test_the_schema_entries_fill_the_grid_but_not_a_named_entry():
    schemas = json_schemas()
    assert list(schemas) == ["sampling", "grid", "topology"]
    for schema, model in (
        (schemas["sampling"], SamplingConfig),
        (schemas["grid"], GridConfig),
        (schemas["topology"], TopologyConfig),
    ):
        Draft202012Validator.check_schema(schema)
        assert (schema["type"], schema["additionalProperties"]) == ("object", False)
        assert list(schema["properties"]) == list(model.model_fields) and "required" not in schema
    assert schemas["grid"]["default"] == {}
    assert "default" not in schemas["sampling"] and "default" not in schemas["topology"]  # a name must be given
    # generated from the types
    assert schemas["grid"] == {**plain_schema(GridConfig), "default": {}}
    assert schemas["sampling"] == plain_schema(SamplingConfig)
    assert schemas["topology"] == plain_schema(TopologyConfig)
    assert {k: p["default"] for k, p in schemas["sampling"]["properties"].items()} == SAMPLING
    assert {k: p["default"] for k, p in schemas["grid"]["properties"].items()} == GRID
    assert {k: p["default"] for k, p in schemas["topology"]["properties"].items()} == TOPOLOGY


def test_the_schema_bounds_are_the_types():
    sampling = json_schemas()["sampling"]["properties"]
    assert {k: v for k, v in sampling["top_p"].items() if k != "description"} == {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "default": 1,
    }
    assert (sampling["temperature"]["type"], sampling["temperature"]["minimum"]) == ("number", 0)
    assert sampling["seed"]["type"] == "integer" and "minimum" not in sampling["seed"]
    grid = json_schemas()["grid"]["properties"]
    assert (grid["users"]["minItems"], grid["users"]["items"]) == (1, {"type": "integer", "minimum": 1})
    assert (grid["runs"]["type"], grid["runs"]["minimum"]) == ("integer", 1)
    cell = grid["cells"]["items"]
    assert (cell["required"], cell["additionalProperties"]) == (["users", "workload"], False)
    assert list(cell["properties"]) == list(CellEntry.model_fields)
    assert {k: p["default"] for k, p in cell["properties"].items() if "default" in p} == CELL
    topology = json_schemas()["topology"]["properties"]
    assert [topology[k]["minimum"] for k in ("tensor_parallel", "instances")] == [1, 1]


def test_every_key_says_what_it_does_in_one_line():
    schemas = json_schemas()
    keys = [(f"{entry}.{k}", p) for entry, s in schemas.items() for k, p in s["properties"].items()]
    keys += [(f"grid.cells.{k}", p) for k, p in schemas["grid"]["properties"]["cells"]["items"]["properties"].items()]
    for key, p in keys:
        assert p["description"].strip() and "\n" not in p["description"] and "  " not in p["description"], key
    assert schemas["sampling"]["properties"]["temperature"]["description"] == "0 is greedy."


def test_the_default_config_measures_its_grid_as_the_file_says():
    cfg = C.load()
    assert cfg.grid == GridConfig(users=[2, 8], workloads=["wide", "narrow"], sampling=["greedy"], runs=2)
    assert cfg.sampling["greedy"] == SamplingConfig(temperature=0.0)
    assert type(cfg.sampling["greedy"].temperature) is float  # the file says 0.0
    assert cfg.sampling["ancestral"] == SamplingConfig(temperature=1.0, top_p=1.0)
    assert cfg.topologies["tp1"] == TopologyConfig()


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_grid_sampling_and_topologies_of_every_shipped_config_pass_their_schema_entries_and_types(name):
    """Each file over the default (the names it gives are checked where the file is loaded)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    schemas = json_schemas()
    entries = [("grid", merged.get("grid", {}), schemas["grid"], GridConfig)]
    entries += [(f"sampling.{k}", v, schemas["sampling"], SamplingConfig) for k, v in merged["sampling"].items()]
    entries += [(f"topologies.{k}", v, schemas["topology"], TopologyConfig) for k, v in merged["topologies"].items()]
    for where, entry, schema, model in entries:
        assert [e.message for e in Draft202012Validator(schema).iter_errors(entry)] == [], f"{name}: {where}"
        typed = model.model_validate(entry)
        assert typed.model_dump(include=set(entry), exclude={"cells"}) == {
            k: v for k, v in entry.items() if k != "cells"
        }, f"{name}: {where}"
        for i, cell in enumerate(entry.get("cells", [])):
            assert (typed.cells[i].users, typed.cells[i].workload) == (cell["users"], cell["workload"]), name
