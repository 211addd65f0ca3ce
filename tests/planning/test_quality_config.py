"""What a config asks of the models' quality (speedsplit/planning/quality_config.py): the INT4
quantization (`quantization`) and the quality probe beside speed (`quality`, with
lm-evaluation-harness in `lm_eval`): their defaults, their bounds as a user meets them (one line
naming the key) and as the typed sections and the probe a job is handed keep them, what the
config's loader checks of them, the schema entries generated from them, and every shipped
config's sections reading as them."""

from pathlib import Path

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.core.quality import LmEval, QualityProbe
from speedsplit.planning import config as C
from speedsplit.planning import plan as P
from speedsplit.planning.quality_config import (
    LmEvalConfig,
    QualityConfig,
    QuantizationConfig,
)
from speedsplit.planning.typed_config import plain_schema

QUANTIZATION = {
    "method": "gptqmodel",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "calibration_samples": 32,
    "calibration_tokens": 256,
    "eval_samples": 8,
    "seed": 0,
    "calibration_text": "",
}
LM_EVAL = {"tasks": [], "include_path": "", "limit": None, "timeout_s": 1800}
QUALITY = {
    "enabled": True,
    "prompts": 16,
    "prompt_tokens": 32,
    "output_tokens": 32,
    "windows": 8,
    "window_tokens": 128,
    "top_logprobs": 5,
    "text": "",
    "gate": 0.99,
    "lm_eval": LM_EVAL,
}
TASKS = "config/tasks/python-next-line"  # the example task the workflow ships
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schemas() -> dict[str, dict]:
    """The config schema's `quantization` and `quality` entries."""
    top = C.load_schema()["properties"]
    return {"quantization": top["quantization"], "quality": top["quality"]}


def small(**sections) -> dict:
    """A small config: one model, a chain of two stacks, one workload, on a CPU."""
    return {
        "platform": "cpu",
        "models": {"m": {}},
        "stacks": {"a": {"args": ["a"]}, "b": {"args": ["b"]}},
        "chains": {"ab": ["a", "b"]},
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
        "sampling": {"greedy": {}},
        **sections,
    }


def refusal(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(**sections))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_config_without_the_sections_quantizes_with_gptq_and_probes_every_stack():
    cfg = C.validate(small())
    assert (cfg.filled()["quantization"], cfg.filled()["quality"]) == (QUANTIZATION, QUALITY)
    assert QuantizationConfig().model_dump() == QUANTIZATION and QualityConfig().model_dump() == QUALITY
    assert cfg.quantization == QuantizationConfig() and cfg.quality == QualityConfig()
    assert cfg.quality.lm_eval == LmEvalConfig()


def test_lm_eval_given_in_part_is_filled_and_the_rest_of_quality_kept():
    cfg = C.validate(small(quality={"prompts": 4, "gate": 1, "lm_eval": {"limit": 10}}))
    assert cfg.filled()["quality"] == {**QUALITY, "prompts": 4, "gate": 1, "lm_eval": {**LM_EVAL, "limit": 10}}
    typed = cfg.quality
    assert (typed.prompts, typed.gate, typed.lm_eval.limit, typed.lm_eval.timeout_s) == (4, 1, 10, 1800)
    assert type(typed.gate) is int  # kept as YAML gave it


@pytest.mark.parametrize(
    "sections, expect",
    [
        ({"quantization": {"method": "awq"}}, "quantization.method: 'awq' is not one of ['gptqmodel', 'dummy']"),
        ({"quantization": {"bits": 8}}, "quantization.bits: 4 was expected"),
        ({"quantization": {"group_size": 96}}, "quantization.group_size: 96 is not one of [32, 64, 128, -1]"),
        ({"quantization": {"desc_act": "no"}}, "quantization.desc_act: 'no' is not of type 'boolean'"),
        (
            {"quantization": {"calibration_samples": 0}},
            "quantization.calibration_samples: 0 is less than the minimum of 1",
        ),
        (
            {"quantization": {"calibration_tokens": 7}},
            "quantization.calibration_tokens: 7 is less than the minimum of 8",
        ),
        ({"quantization": {"eval_samples": 0}}, "quantization.eval_samples: 0 is less than the minimum of 1"),
        ({"quantization": {"seed": 0.5}}, "quantization.seed: 0.5 is not of type 'integer'"),
        ({"quantization": {"calibration_text": None}}, "quantization.calibration_text: None is not of type 'string'"),
        (
            {"quantization": {"sym": True}},
            "quantization: unknown key 'sym' (expected one of: bits, calibration_samples, calibration_text, "
            "calibration_tokens, desc_act, eval_samples, group_size, method, seed)",
        ),
        ({"quality": {"enabled": "yes"}}, "quality.enabled: 'yes' is not of type 'boolean'"),
        ({"quality": {"prompts": 0}}, "quality.prompts: 0 is less than the minimum of 1"),
        ({"quality": {"prompt_tokens": 0}}, "quality.prompt_tokens: 0 is less than the minimum of 1"),
        ({"quality": {"output_tokens": 0}}, "quality.output_tokens: 0 is less than the minimum of 1"),
        ({"quality": {"windows": -1}}, "quality.windows: -1 is less than the minimum of 0"),
        ({"quality": {"window_tokens": 1}}, "quality.window_tokens: 1 is less than the minimum of 2"),
        ({"quality": {"top_logprobs": 0}}, "quality.top_logprobs: 0 is less than the minimum of 1"),
        ({"quality": {"top_logprobs": 21}}, "quality.top_logprobs: 21 is greater than the maximum of 20"),
        ({"quality": {"text": 1}}, "quality.text: 1 is not of type 'string'"),
        ({"quality": {"gate": 0}}, "quality.gate: 0 is less than or equal to the minimum of 0"),
        ({"quality": {"gate": 1.01}}, "quality.gate: 1.01 is greater than the maximum of 1"),
        ({"quality": {"lm_eval": {"tasks": "t"}}}, "quality.lm_eval.tasks: 't' is not of type 'array'"),
        ({"quality": {"lm_eval": {"limit": 0}}}, "quality.lm_eval.limit: 0 is less than the minimum of 1"),
        ({"quality": {"lm_eval": {"limit": 2.5}}}, "quality.lm_eval.limit: 2.5 is not of type 'integer', 'null'"),
        (
            {"quality": {"lm_eval": {"timeout_s": 0}}},
            "quality.lm_eval.timeout_s: 0 is less than or equal to the minimum of 0",
        ),
        (
            {"quality": {"lm_eval": {"shots": 5}}},
            "quality.lm_eval: unknown key 'shots' (expected one of: include_path, limit, tasks, timeout_s)",
        ),
        (
            {"quality": {"perplexity": True}},
            "quality: unknown key 'perplexity' (expected one of: enabled, gate, lm_eval, output_tokens, prompt_tokens, "
            "prompts, text, top_logprobs, window_tokens, windows)",
        ),
    ],
)
def test_a_wrong_key_is_refused_in_one_line_naming_its_path(sections, expect):
    assert refusal(**sections) == f"config error at {expect}"


@pytest.mark.parametrize(
    "model, fields",
    [
        (QuantizationConfig, {"bits": 8}),
        (QuantizationConfig, {"group_size": 96}),
        (QuantizationConfig, {"calibration_tokens": 7}),
        (QualityConfig, {"windows": -1}),
        (QualityConfig, {"window_tokens": 1}),
        (QualityConfig, {"top_logprobs": 21}),
        (QualityConfig, {"gate": 0}),
        (QualityConfig, {"gate": 1.5}),
        (LmEvalConfig, {"limit": 0}),
        (LmEvalConfig, {"timeout_s": -1}),
    ],
)
def test_the_typed_sections_refuse_what_the_schema_refuses(model, fields):
    with pytest.raises(ValidationError):
        model(**fields)


def test_a_value_at_its_bound_is_taken():
    at = {"prompts": 1, "prompt_tokens": 2, "output_tokens": 1, "windows": 0, "window_tokens": 2, "top_logprobs": 20}
    cfg = C.validate(small(quality={**at, "gate": 1.0}, quantization={"group_size": -1, "calibration_tokens": 8}))
    assert cfg.quality.model_dump(include=set(at)) == at and cfg.quality.gate == 1.0
    assert (cfg.quantization.group_size, cfg.quantization.calibration_tokens) == (-1, 8)


def test_a_continuations_prompt_is_the_start_of_a_window_while_the_probe_runs():
    assert refusal(quality={"prompt_tokens": 65, "window_tokens": 64}) == (
        "config error at quality.prompt_tokens: 65 is more than quality.window_tokens (64): a continuation's prompt "
        "is the start of a window"
    )
    assert C.validate(small(quality={"prompt_tokens": 64, "window_tokens": 64})).quality.prompt_tokens == 64
    # a probe that does not run asks nothing of its windows
    off = C.validate(small(quality={"enabled": False, "prompt_tokens": 65, "window_tokens": 64}))
    assert not off.quality.enabled and P.quality_carriers(off) == set()


def test_an_include_path_is_a_folder_here_else_beside_the_workflow(tmp_path, monkeypatch):
    lm = {"tasks": ["python_next_line"], "include_path": TASKS}
    assert C.validate(small(quality={"lm_eval": lm})).quality.lm_eval.include_path == TASKS  # from here
    monkeypatch.chdir(tmp_path)  # elsewhere, the shipped folder is the workflow's
    resolved = C.validate(small(quality={"lm_eval": lm})).quality.lm_eval.include_path
    assert Path(resolved) == REPO / TASKS and Path(resolved).is_absolute()
    (tmp_path / "mine").mkdir()  # a folder of one's own, in the working directory
    mine = C.validate(small(quality={"lm_eval": {**lm, "include_path": "mine"}})).quality.lm_eval
    assert mine.include_path == "mine"
    for missing in ("nope", str(tmp_path / "nope")):
        assert refusal(quality={"lm_eval": {**lm, "include_path": missing}}) == (
            f"config error at quality.lm_eval.include_path: {missing} is not a folder"
        )
    # without tasks nothing runs, so the folder is not looked for
    nothing = C.validate(small(quality={"lm_eval": {"include_path": "nope"}}))
    assert nothing.filled()["quality"]["lm_eval"]["include_path"] == "nope"


def test_the_probe_a_job_is_handed_is_the_quality_section_with_lm_eval_only_where_tasks_are_named():
    cfg = C.validate(small(quality={"prompts": 4, "windows": 0}))
    carrier = sorted(P.quality_carriers(cfg), key=str)[0]
    probe = P.quality_probe(cfg, carrier)
    assert probe == {k: v for k, v in QUALITY.items() if k not in ("enabled", "gate", "lm_eval")} | {
        "prompts": 4,
        "windows": 0,
    }
    assert QualityProbe(**probe).prompts == 4
    lm = {"tasks": ["python_next_line"], "include_path": TASKS, "limit": 3}
    cfg = C.validate(small(quality={"lm_eval": lm}))
    probe = P.quality_probe(cfg, sorted(P.quality_carriers(cfg), key=str)[0])
    assert probe["lm_eval"] == {**LM_EVAL, **lm} and QualityProbe(**probe).lm_eval == LmEval(**lm)


def test_the_sections_bounds_are_the_probes():
    """What the config takes, the job's probe record takes: a bound loosened on one side only
    would pass the config and fail the job."""

    def bounds(model):
        props = plain_schema(model)["properties"]
        return {
            k: {b: v for b, v in p.items() if b not in ("description", "default", "type")} for k, p in props.items()
        }

    config, probe = bounds(QualityConfig), bounds(QualityProbe)
    assert {k: config[k] for k in probe if k != "lm_eval"} == {k: v for k, v in probe.items() if k != "lm_eval"}
    assert set(config) - set(probe) == {"enabled", "gate"}  # the table's, not the job's
    assert bounds(LmEvalConfig) == bounds(LmEval)


def test_a_dummy_quantization_writes_gptq_configs_only():
    stacks = {"a": {"args": ["a"]}, "b": {"args": ["b"], "variant": "awq"}}
    assert refusal(stacks=stacks, quantization={"method": "dummy"}) == (
        "config error at quantization.method: dummy writes GPTQ configs only; stack b serves AWQ (use gptqmodel)"
    )
    assert C.validate(small(stacks=stacks)).quantization.method == "gptqmodel"


def test_the_schema_entries_are_the_sections_filled_from_empty_defaults():
    schemas = json_schemas()
    assert list(schemas) == ["quantization", "quality"]
    for key, model in (("quantization", QuantizationConfig), ("quality", QualityConfig)):
        schema = schemas[key]
        Draft202012Validator.check_schema(schema)
        assert (schema["type"], schema["additionalProperties"], schema["default"]) == ("object", False, {})
        assert list(schema["properties"]) == list(model.model_fields)
        assert schema == {**plain_schema(model), "default": {}}, key  # generated from the section's type
    quantization, quality = schemas["quantization"]["properties"], schemas["quality"]["properties"]
    assert {k: p["default"] for k, p in quantization.items()} == QUANTIZATION
    assert {k: p["default"] for k, p in quality.items()} == {**QUALITY, "lm_eval": {}}
    assert (quantization["bits"]["const"], quantization["group_size"]["enum"]) == (4, [32, 64, 128, -1])
    assert (quality["top_logprobs"]["minimum"], quality["top_logprobs"]["maximum"]) == (1, 20)
    assert {k: v for k, v in quality["gate"].items() if k != "description"} == {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "default": 0.99,
    }
    lm = quality["lm_eval"]
    assert (lm["default"], lm["additionalProperties"]) == ({}, False)
    assert {k: p["default"] for k, p in lm["properties"].items()} == LM_EVAL
    assert (lm["properties"]["limit"]["type"], lm["properties"]["limit"]["minimum"]) == (["integer", "null"], 1)


def test_every_key_says_what_it_does_in_one_line():
    schemas = json_schemas()
    keys = [(f"{s}.{k}", p) for s, schema in schemas.items() for k, p in schema["properties"].items()]
    keys += [(f"quality.lm_eval.{k}", p) for k, p in schemas["quality"]["properties"]["lm_eval"]["properties"].items()]
    for key, p in keys:
        assert p["description"].strip() and "\n" not in p["description"] and "  " not in p["description"], key
    assert schemas["quality"]["properties"]["lm_eval"]["description"].startswith("Task accuracy beside speed")


def test_the_default_config_quantizes_as_its_file_says():
    cfg = C.load()
    assert cfg.quantization == QuantizationConfig(calibration_samples=16, calibration_tokens=128)
    assert cfg.quality == QualityConfig()


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_quality_sections_of_every_shipped_config_pass_their_schema_entries_and_types(name):
    """Each file over the default (what they name is checked where the file is loaded)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    for key, model in (("quantization", QuantizationConfig), ("quality", QualityConfig)):
        section = merged.get(key, {})
        assert [e.message for e in Draft202012Validator(json_schemas()[key]).iter_errors(section)] == [], name
        assert model.model_validate(section).model_dump(include=set(section), exclude_unset=True) == section, name
