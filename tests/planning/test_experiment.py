"""The experiment (planning/experiment.py): the whole config typed once, its JSON Schema generated
from it, the validated dict in the order given, and the settings a config passes to its jobs
unchanged declared once (core/specs.StackSettings and CellSettings)."""

import json

import pytest
from conftest import REPO

from speedsplit.core.specs import CellParams, CellSettings, StackSettings, StackSpec
from speedsplit.planning import config as C
from speedsplit.planning import experiment as E
from speedsplit.planning import grid as G
from speedsplit.planning.stack_config import StackConfig
from speedsplit.planning.workload_config import WorkloadConfig


def test_a_validated_config_is_one_typed_experiment():
    exp = C.load()
    assert isinstance(exp, E.Experiment)
    assert isinstance(exp.stacks["vllm-fp16"], StackConfig) and isinstance(exp.workloads["wide"], WorkloadConfig)
    assert exp.grid.workloads == list(exp.workloads)  # a derived default, filled before it was typed
    assert list(exp.topologies) == ["tp1"] and exp.topologies["tp1"].tensor_parallel == 1


def test_the_config_schema_is_the_experiments_and_is_the_one_committed():
    schema = E.json_schema()
    assert C.load_schema() == schema
    assert json.loads((REPO / "docs/config-schema.json").read_text()) == schema
    assert list(schema["properties"]) == list(E.Experiment.model_fields)
    for key in ("models", "stacks", "workloads", "sampling", "topologies", "chains"):  # a map's keys are names
        assert schema["properties"][key]["propertyNames"] == {"$ref": "#/definitions/name"}, key


def test_filled_is_the_validated_dict_in_the_order_the_files_and_the_schema_gave():
    """The model and quantize rules' params and the report's config: Snakemake compares params as
    text, so the order a finished model was made with is the order it is asked with again."""
    given = {
        "models": {"m": {"max_model_len": 512, "shape": "tiny", "weights": "random"}},
        "benchmark": {"models": ["m"]},
    }
    exp = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), given))
    model = exp.filled()["models"]["m"]
    assert list(model)[:3] == ["max_model_len", "shape", "weights"]  # the file's, then the defaults
    assert model["source"] == "synthetic" and exp.models["m"].max_model_len == 512
    exp.filled()["models"]["m"]["shape"] = "changed"  # a copy each time
    assert exp.filled()["models"]["m"]["shape"] == "tiny"


@pytest.mark.parametrize(
    "settings, config_type, job_type",
    [(StackSettings, StackConfig, StackSpec), (CellSettings, WorkloadConfig, CellParams)],
)
def test_a_setting_passed_on_is_declared_once_for_the_config_and_the_job(settings, config_type, job_type):
    """A field added to StackSettings (or CellSettings) is a config key with its default, bound
    and description, and a job-file key, at once."""

    def declared(f):
        return f.annotation, f.default, f.description, f.metadata

    for name, field in settings.model_fields.items():
        for typed in (config_type, job_type):
            assert declared(typed.model_fields[name]) == declared(field), (typed.__name__, name)
    entry = C.load_schema()["properties"]["stacks" if settings is StackSettings else "workloads"][
        "additionalProperties"
    ]
    assert set(settings.model_fields) <= set(entry["properties"])


def test_a_job_names_a_setting_passed_on_only_where_it_is_not_its_default():
    """So a setting added later changes no other stack's or cell's params: no finished cell reruns."""
    exp = C.load()
    plain = G.stack_params(exp, "tiny", "vllm-fp16", "tp1")
    assert not set(StackSettings.model_fields) & set(plain)
    draft = G.stack_params(exp, "tiny", "vllm-fp16-draft", "tp1")
    assert (draft["draft_model"], draft["lossless"]) == ("tiny-draft", True) and "keep_alive" not in draft
    cell = G.cell_params(exp, G.cells(exp)[0])
    assert "text" not in cell
    code = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"workloads": {"wide": {"text": "code"}}}))
    assert G.cell_params(code, G.cell_by_name(code, "u2-wide-greedy"))["text"] == "code"


def test_every_config_key_says_what_it_is():
    """Every key of the config's schema has a description (its own, or its section type's)."""
    schema = E.json_schema()
    defs = schema.get("$defs", {})
    missing, seen = [], set()

    def walk(node: dict, path: str) -> None:
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            if (name, path) not in seen:
                seen.add((name, path))
                walk(defs[name], path)
            return
        for key, sub in node.get("properties", {}).items():
            typed = defs.get(sub.get("$ref", "").split("/")[-1], {})
            if "description" not in sub and "description" not in typed:
                missing.append(f"{path}.{key}")
            walk(sub, f"{path}.{key}")
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}.*")
        for key in ("anyOf", "allOf", "oneOf"):
            for sub in node.get(key, []):
                walk(sub, path)

    walk(schema, "")
    assert not missing, missing
