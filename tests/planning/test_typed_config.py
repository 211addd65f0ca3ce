"""A stack as a config gives it, typed (speedsplit/planning/stack_config.py): the config schema's
stack entry is generated from it, and every stack of every shipped config reads as it holds."""

import json

import pytest
import yaml
from conftest import REPO
from jsonschema import Draft202012Validator

from speedsplit.planning import config as C
from speedsplit.planning.stack_config import StackConfig, json_schema, stacks_of


def test_the_config_schema_takes_its_stack_entry_from_the_model():
    schema = C.load_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["properties"]["stacks"]["additionalProperties"] == json_schema()
    # plain JSON Schema, as jsonschema reads it: pydantic's own bounds and titles are gone
    text = json.dumps(json_schema())
    assert not any(f'"{key}":' in text for key in ("gt", "ge", "title", "$ref", "$defs"))
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
def test_every_stack_of_a_shipped_config_reads_as_its_filled_dict(configs):
    """What a typed stack says is what the filled config says, to the type (24 stays 24: the job
    files and results say what they always said)."""
    cfg = C.load(*[REPO / c for c in configs])
    for stack, typed in stacks_of(cfg).items():
        filled = cfg["stacks"][stack]
        dumped = typed.model_dump(exclude_unset=True)
        assert dumped == filled, stack
        assert all(type(dumped[k]) is type(filled[k]) for k in filled), stack


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
    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"stacks": {"hf-fp16": change}}))
    with pytest.raises(C.ConfigError) as err:
        C.load(top)
    assert str(err.value).startswith(expect), err.value


def test_a_stack_needs_its_command_line():
    with pytest.raises(ValueError, match="args"):
        StackConfig()
