"""A stack as a config gives it (speedsplit/planning/stack_config.py): its defaults, its bounds as
a user meets them (one line naming the key), the config schema's stack entry generated from it,
and every stack of a shipped config reading as one."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning.extends import resolve_stacks
from speedsplit.planning.experiment import Experiment
from speedsplit.planning.stack_config import CpuOverlay, GpuOverlay, StackConfig
from speedsplit.planning.typed_config import plain_schema

# what a stack holds once the schema has filled it, given its command line alone
FILLED = {
    "args": ["serve"],
    "variant": "fp16",
    "gguf_type": "q8_0",
    "env": {},
    "dialect": "vllm",
    "keep_alive": True,
    "request_model": "{served_name}",
    "ready_path": "/health",
    "api_key_env": None,
    "startup_timeout_s": 600,
    "expect_kernel": "",
    "lossless": False,
    "draft_model": None,
    "card_memory_gib": None,
    "kv_cache_gib": None,
    "memory_cap_args": [],
    "on_cpu": {"args": [], "env": {}, "expect_kernel": "", "dtype": "bfloat16", "host_cache_cap": False},
    "on_gpu": {"args": [], "env": {}, "expect_kernel": "", "dtype": "float16"},
}
# keys that extends.py consumes: absent unless given, never filled
ABSENT = {"extends", "abstract", "add_args", "set_args"}
NULLABLE = ("card_memory_gib", "kv_cache_gib", "api_key_env", "draft_model")  # null: unset
KEYS = "abstract, add_args, api_key_env, args, card_memory_gib, dialect, draft_model, env, expect_kernel, extends, "


def json_schema() -> dict:
    """The config schema's entry for one stack (`stacks.<name>`)."""
    return C.load_schema()["properties"]["stacks"]["additionalProperties"]


def experiment(stacks: dict) -> Experiment:
    """A small config holding `stacks`, validated as a user's config is."""
    cfg = {
        "models": {"m": {}},
        "stacks": stacks,
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
        "sampling": {"greedy": {}},
    }
    return C.validate(cfg)


def validated(stacks: dict) -> dict:
    """The stacks of a small config holding `stacks`, validated as a user's config is, filled."""
    return experiment(stacks).filled()["stacks"]


def refusal(entry: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validated({"s": entry})
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_stack_given_only_its_command_line_is_filled_with_every_default():
    assert validated({"s": {"args": ["serve"]}}) == {"s": FILLED}
    typed = StackConfig(args=["serve"])
    assert typed == StackConfig.model_validate(FILLED)
    assert {k: getattr(typed, k) for k in ABSENT} == dict.fromkeys(ABSENT)  # never filled
    assert (typed.on_cpu.add_args, typed.on_gpu.set_args) == (None, None)


def test_the_cpu_overlay_serves_bfloat16_and_the_gpu_overlay_float16_and_only_cpu_caps_host_caches():
    assert CpuOverlay().model_dump(exclude_none=True) == FILLED["on_cpu"]
    assert GpuOverlay().model_dump(exclude_none=True) == FILLED["on_gpu"]
    with pytest.raises(ValidationError, match="host_cache_cap"):
        GpuOverlay(host_cache_cap=True)


def test_a_stack_without_its_command_line_or_with_an_unknown_key_is_refused():
    assert refusal({}) == "config error at stacks.s: 'args' is a required property"
    with pytest.raises(ValidationError, match="args\n  Field required"):
        StackConfig()
    with pytest.raises(ValidationError, match="port\n  Extra inputs are not permitted"):
        StackConfig(args=[], port=8000)


@pytest.mark.parametrize(
    "entry, expect",
    [
        ({"args": "serve"}, "config error at stacks.s.args: 'serve' is not of type 'array'"),
        ({"args": ["serve", 1]}, "config error at stacks.s.args[1]: 1 is not of type 'string'"),
        (
            {"variant": "int8"},
            "config error at stacks.s.variant: 'int8' is not one of ['fp16', 'gptq', 'awq', 'fp8', 'gguf']",
        ),
        ({"gguf_type": "q4_0"}, "config error at stacks.s.gguf_type: 'q4_0' is not one of ['f16', 'bf16', 'q8_0']"),
        (
            {"dialect": "openai"},
            "config error at stacks.s.dialect: 'openai' is not one of ['vllm', 'llamacpp', 'transformers']",
        ),
        ({"keep_alive": "no"}, "config error at stacks.s.keep_alive: 'no' is not of type 'boolean'"),
        ({"lossless": 1}, "config error at stacks.s.lossless: 1 is not of type 'boolean'"),
        ({"api_key_env": 3}, "config error at stacks.s.api_key_env: 3 is not of type 'string', 'null'"),
        ({"env": {"A": 1}}, "config error at stacks.s.env.A: 1 is not of type 'string'"),
        ({"startup_timeout_s": 0.5}, "config error at stacks.s.startup_timeout_s: 0.5 is less than the minimum of 1"),
        ({"startup_timeout_s": "60"}, "config error at stacks.s.startup_timeout_s: '60' is not of type 'number'"),
        (
            {"card_memory_gib": 0},
            "config error at stacks.s.card_memory_gib: 0 is less than or equal to the minimum of 0",
        ),
        (
            {"kv_cache_gib": -1},
            "config error at stacks.s.kv_cache_gib: -1 is less than or equal to the minimum of 0",
        ),
        ({"memory_cap_args": [0.9]}, "config error at stacks.s.memory_cap_args[0]: 0.9 is not of type 'string'"),
        ({"on_cpu": {"dtype": 16}}, "config error at stacks.s.on_cpu.dtype: 16 is not of type 'string'"),
        (
            {"on_gpu": {"host_cache_cap": True}},
            "config error at stacks.s.on_gpu: unknown key 'host_cache_cap' "
            "(expected one of: add_args, args, dtype, env, expect_kernel, set_args)",
        ),
        ({"port": 8000}, f"config error at stacks.s: unknown key 'port' (expected one of: {KEYS}"),
        ({"extends": "nope"}, "config error at stacks.s.extends: unknown stack 'nope' (stacks: s)"),
        ({"draft_model": "nope"}, "config error at stacks.s.draft_model: unknown model 'nope' (known: m)"),
        (
            {"draft_model": "m"},
            "config error at stacks.s.draft_model: the stack's args never name {draft_dir}, so its server would "
            "not use the draft",
        ),
        ({"kv_cache_gib": 4}, "config error at stacks.s.kv_cache_gib: only a vLLM stack sizes its KV cache by a flag"),
    ],
)
def test_a_wrong_stack_key_is_refused_in_one_line_naming_its_path(entry, expect):
    assert (refused := refusal({"args": ["serve"], **entry})).startswith(expect), refused


def test_a_number_at_its_bound_is_taken_and_kept_as_yaml_gave_it():
    vllm = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
    cfg = experiment({"s": {"args": vllm, "startup_timeout_s": 1, "card_memory_gib": 0.5, "kv_cache_gib": 24}})
    s = cfg.filled()["stacks"]["s"]
    assert (s["startup_timeout_s"], s["card_memory_gib"], s["kv_cache_gib"]) == (1, 0.5, 24)
    typed = cfg.stacks["s"]
    assert (type(typed.startup_timeout_s), type(typed.card_memory_gib), type(typed.kv_cache_gib)) == (int, float, int)
    assert type(StackConfig(args=[], startup_timeout_s=24.0).startup_timeout_s) is float
    for key, value, bound in (
        ("startup_timeout_s", 0.99, "greater than or equal to 1"),
        ("kv_cache_gib", -0.5, "greater than 0"),
    ):
        with pytest.raises(ValidationError, match=f"{key}.constrained-float\n  Input should be {bound}"):
            StackConfig(args=[], **{key: value})


def test_the_schema_entry_requires_args_and_refuses_keys_it_does_not_name():
    schema = json_schema()
    assert (schema["type"], schema["required"], schema["additionalProperties"]) == ("object", ["args"], False)
    assert list(schema["properties"]) == list(StackConfig.model_fields)
    for overlay, model in (("on_cpu", CpuOverlay), ("on_gpu", GpuOverlay)):
        assert schema["properties"][overlay]["additionalProperties"] is False
        assert list(schema["properties"][overlay]["properties"]) == list(model.model_fields)
    Draft202012Validator.check_schema(schema)
    assert schema == plain_schema(StackConfig)  # generated from the stack's type


def test_the_schema_fills_the_models_defaults_and_leaves_extends_keys_without_default_or_null():
    props = json_schema()["properties"]
    assert {k for k, p in props.items() if "default" not in p} == ABSENT | {"args"}
    assert {k: p["default"] for k, p in props.items() if "default" in p} == {
        **{k: v for k, v in FILLED.items() if k != "args"},
        "on_cpu": {},
        "on_gpu": {},
    }
    assert [props[k]["type"] for k in ("extends", "abstract", "add_args", "set_args")] == [
        "string", "boolean", "array", "object"
    ]  # fmt: skip
    assert props["set_args"]["additionalProperties"] == {"type": ["string", "number"]}
    assert props["startup_timeout_s"] == {
        "type": "number",
        "minimum": 1,
        "default": 600,
        "description": "Seconds to wait for readiness.",
    }
    assert [props[k]["type"] for k in NULLABLE] == [["number", "null"]] * 2 + [["string", "null"]] * 2
    assert props["card_memory_gib"]["exclusiveMinimum"] == props["kv_cache_gib"]["exclusiveMinimum"] == 0
    for overlay in ("on_cpu", "on_gpu"):
        inner = props[overlay]["properties"]
        assert {k for k, p in inner.items() if "default" not in p} == {"add_args", "set_args"}


def test_every_key_of_the_schema_entry_says_what_it_does_in_one_line():
    props = json_schema()["properties"]
    keys = list(props.items())
    keys += [(f"{o}.{k}", p) for o in ("on_cpu", "on_gpu") for k, p in props[o]["properties"].items()]
    for key, p in keys:
        assert p["description"].strip() and "\n" not in p["description"] and "  " not in p["description"], key
    assert props["on_cpu"]["description"] == "Overlay used on the cpu platform."
    assert props["on_gpu"]["properties"]["dtype"]["description"] == "Value of {dtype}."


def test_a_validated_configs_stacks_read_typed_by_name():
    stacks = {"a": {"args": ["x"], "dialect": "llamacpp"}, "b": {"args": ["y"], "keep_alive": False}}
    cfg = experiment(stacks)
    assert cfg.stacks["a"] == StackConfig(args=["x"], dialect="llamacpp")
    assert list(cfg.stacks) == ["a", "b"]  # in the order given
    assert cfg.stacks["b"] == StackConfig(args=["y"], keep_alive=False) and cfg.stacks["b"].keep_alive is False


def test_the_default_configs_stacks_read_as_the_file_says_their_bases_gone():
    stacks = C.load().stacks
    assert "vllm" not in stacks  # abstract: a base only
    hf = stacks["hf-fp16"]
    assert (hf.dialect, hf.request_model, hf.startup_timeout_s, hf.api_key_env) == (
        "transformers",
        "{model_dir}",
        300,
        None,
    )
    assert (hf.on_cpu.host_cache_cap, hf.on_cpu.args, hf.on_gpu.args) == (
        True,
        ["--device", "cpu"],
        ["--device", "cuda"],
    )
    v = stacks["vllm-fp16"]  # all it has, it has from the base it extends
    assert (v.startup_timeout_s, v.api_key_env, v.extends) == (900, "VLLM_API_KEY", None)
    assert v.memory_cap_args == ["--gpu-memory-utilization", "{memory_fraction}"]
    assert stacks["hf-generate-b64"].args[-2:] == ["--max-batch", "64"]


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_stack_of_a_shipped_config_passes_the_schema_entry_and_the_model(name):
    """Each file over the default, its stacks resolved (what the platform allows is not asked)."""
    merged = C.merge(C.read_yaml(C.DEFAULT_CONFIG), C.read_yaml(REPO / "config" / name))
    stacks = resolve_stacks(merged)["stacks"]
    check = Draft202012Validator(json_schema())
    for stack, entry in stacks.items():
        assert [e.message for e in check.iter_errors(entry)] == [], f"{name}: stacks.{stack}"
        assert StackConfig.model_validate(entry).args == entry["args"], f"{name}: stacks.{stack}"
    assert {"hf-fp16", "vllm-fp16"} <= set(stacks) and "vllm" not in stacks


def test_an_abstract_that_is_not_a_boolean_is_refused_not_taken_as_true():
    with pytest.raises(ConfigError, match=r"^config error at stacks.b.abstract: 'yes' is not of type 'boolean'$"):
        validated({"a": {"args": ["x"]}, "b": {"args": ["y"], "abstract": "yes"}})


def test_an_overlay_has_no_extends_and_refuses_one_as_an_unknown_key():
    assert refusal({"args": ["x"], "on_cpu": {"extends": "a"}}).startswith(
        "config error at stacks.s.on_cpu: unknown key 'extends' (expected one of:"
    )


def test_a_set_args_value_that_is_a_boolean_is_refused_as_the_schema_says():
    assert refusal({"args": ["x"], "set_args": {"--eager": True}}).startswith("config error at stacks.s.set_args:")


def test_a_set_args_number_stays_as_yaml_gave_it():
    assert type(StackConfig(args=[], set_args={"--max-batch": 64}).set_args["--max-batch"]) is int
