"""A model as a config gives it (speedsplit/planning/model_config.py): its defaults (a tiny
synthetic model of random weights), its bounds as a user meets them (one line naming the key)
and as the typed model keeps them, what the config's loader checks of a model beside it (a hub
repo, the context its workloads need, a draft's tokenizer), the schema entry generated from it
and every model of a shipped config reading as one. What serving a model needs beyond the
config (checkpoints, formats) is tests/planning/test_model_checks.py's."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.models.train import Training
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.model_config import ModelConfig, Prequantized
from speedsplit.planning.typed_config import plain_schema

TRAINING = {
    "steps": 1000,
    "seq_len": 128,
    "batch": 16,
    "lr": 0.003,
    "warmup_steps": 20,
    "max_s": None,
    "corpus_bytes": 4_000_000,
    "corpus": "stdlib",
}
# a model as the schema fills it, given nothing
FILLED = {
    "source": "synthetic",
    "path": "",
    "prequantized": {"gptq": "", "awq": ""},
    "shape": "tiny",
    "tokenizer": "wordlevel",
    "weights": "random",
    "training": TRAINING,
    "seed": 0,
    "repo": "",
    "revision": "main",
    "max_model_len": 4096,
}
SHAPES = ["tiny", "tiny-draft", "small", "small-draft", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "llama-3.1-70b"]
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schema() -> dict:
    """The config schema's entry for one model (`models.<name>`)."""
    return C.load_schema()["properties"]["models"]["additionalProperties"]


def small(models: dict, **sections) -> dict:
    """A small config of these models, one stack and one workload of 8 + 8 tokens, on a CPU."""
    return {
        "platform": "cpu",
        "models": models,
        "stacks": {"s": {"args": ["serve"]}},
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
        "sampling": {"greedy": {}},
        **sections,
    }


def refusal(models: dict, **sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(models, **sections))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_model_given_nothing_is_a_tiny_synthetic_model_of_random_weights():
    cfg = C.validate(small({"m": {}}))
    assert cfg.filled()["models"]["m"] == FILLED
    assert ModelConfig().model_dump() == FILLED
    assert cfg.models["m"] == ModelConfig()
    assert Training().model_dump() == TRAINING and Prequantized().model_dump() == FILLED["prequantized"]


def test_a_model_keeps_what_it_is_given_and_fills_the_rest():
    given = {"source": "hub", "repo": "org/name", "revision": "abc123", "max_model_len": 16}
    cfg = C.validate(small({"m": given}))
    assert cfg.filled()["models"]["m"] == {**FILLED, **given}
    typed = cfg.models["m"]
    assert (typed.source, typed.repo, typed.revision, typed.max_model_len) == ("hub", "org/name", "abc123", 16)
    trained = C.validate(small({"m": {"weights": "trained", "training": {"steps": 5, "max_s": 30}}}))
    training = trained.models["m"].training
    assert (training.steps, training.max_s, training.seq_len) == (5, 30, 128)
    assert type(training.max_s) is int  # kept as YAML gave it


@pytest.mark.parametrize(
    "entry, expect",
    [
        ({"source": "s3"}, "source: 's3' is not one of ['synthetic', 'hub', 'local']"),
        ({"path": 1}, "path: 1 is not of type 'string'"),
        ({"prequantized": {"exl2": "x"}}, "prequantized: unknown key 'exl2' (expected one of: awq, gptq)"),
        ({"prequantized": {"gptq": 4}}, "prequantized.gptq: 4 is not of type 'string'"),
        ({"prequantized": "x"}, "prequantized: 'x' is not of type 'object'"),
        ({"shape": "gpt5"}, f"shape: 'gpt5' is not one of {SHAPES}"),
        ({"tokenizer": "bpe"}, "tokenizer: 'bpe' is not one of ['wordlevel', 'gpt2']"),
        ({"weights": "zeros"}, "weights: 'zeros' is not one of ['random', 'dummy', 'trained']"),
        ({"training": {"steps": 0}}, "training.steps: 0 is less than the minimum of 1"),
        ({"training": {"seq_len": 7}}, "training.seq_len: 7 is less than the minimum of 8"),
        ({"training": {"batch": 0}}, "training.batch: 0 is less than the minimum of 1"),
        ({"training": {"lr": 0}}, "training.lr: 0 is less than or equal to the minimum of 0"),
        ({"training": {"warmup_steps": -1}}, "training.warmup_steps: -1 is less than the minimum of 0"),
        ({"training": {"max_s": 0}}, "training.max_s: 0 is less than or equal to the minimum of 0"),
        ({"training": {"corpus_bytes": 99_999}}, "training.corpus_bytes: 99999 is less than the minimum of 100000"),
        ({"training": {"corpus": "web"}}, "training.corpus: 'web' is not one of ['stdlib', 'installed']"),
        (
            {"training": {"epochs": 1}},
            "training: unknown key 'epochs' (expected one of: batch, corpus, corpus_bytes, lr, max_s, seq_len, "
            "steps, warmup_steps)",
        ),
        ({"seed": "0"}, "seed: '0' is not of type 'integer'"),
        ({"repo": 3}, "repo: 3 is not of type 'string'"),
        ({"revision": None}, "revision: None is not of type 'string'"),
        ({"max_model_len": 15}, "max_model_len: 15 is less than the minimum of 16"),
        ({"max_model_len": 1024.5}, "max_model_len: 1024.5 is not of type 'integer'"),
        (
            {"shap": "tiny"},
            ": unknown key 'shap' (expected one of: max_model_len, path, prequantized, repo, revision, seed, shape, "
            "source, tokenizer, training, weights)",
        ),
    ],
)
def test_a_wrong_model_key_is_refused_in_one_line_naming_its_path(entry, expect):
    assert refusal({"m": entry}) == "config error at models.m" + ("" if expect.startswith(":") else ".") + expect


def test_a_whole_number_written_as_a_float_is_an_integer_to_the_schema_and_read_as_one():
    """JSON Schema's integer is any number without a fraction: YAML's 1024.0 passes, and the
    typed model reads it as 1024 (the servers are started with --max-model-len 1024)."""
    cfg = C.validate(small({"m": {"max_model_len": 1024.0}}))
    assert cfg.filled()["models"]["m"]["max_model_len"] == 1024.0
    assert type(cfg.models["m"].max_model_len) is int
    assert G.stack_params(cfg, "m", "s", "tp1")["max_model_len"] == 1024
    assert type(G.stack_params(cfg, "m", "s", "tp1")["max_model_len"]) is int


@pytest.mark.parametrize(
    "fields",
    [
        {"source": "s3"},
        {"shape": "gpt5"},
        {"tokenizer": "bpe"},
        {"weights": "zeros"},
        {"max_model_len": 15},
        {"prequantized": {"exl2": "x"}},
        {"training": {"lr": 0}},
        {"training": {"corpus_bytes": 99_999}},
        {"shap": "tiny"},
    ],
)
def test_the_typed_model_refuses_what_the_schema_refuses(fields):
    with pytest.raises(ValidationError):
        ModelConfig(**fields)


def test_a_hub_model_needs_a_repo_where_it_is_made():
    assert refusal({"m": {"source": "hub"}}) == "config error at models.m.repo: a hub model needs a repo id"
    # a model nothing benchmarks or drafts with is never fetched
    cfg = C.validate(small({"m": {}, "h": {"source": "hub"}}, benchmark={"models": ["m"]}))
    assert G.bench_models(cfg) == ["m"] and cfg.models["h"].repo == ""
    # a draft of a benchmarked stack is fetched too
    drafting = {"s": {"args": ["serve", "{draft_dir}"], "draft_model": "h"}}
    assert refusal({"m": {}, "h": {"source": "hub"}}, stacks=drafting, benchmark={"models": ["m"]}) == (
        "config error at models.h.repo: a hub model needs a repo id"
    )


def test_a_model_holds_the_longest_request_its_workloads_send():
    assert C.validate(small({"m": {"max_model_len": 16}})).filled()["models"]["m"]["max_model_len"] == 16  # 8 + 8
    assert refusal({"m": {"max_model_len": 16}}, workloads={"w": {"prompt_tokens": 9, "output_tokens": 8}}) == (
        "config error at workloads.w: prompt_tokens + output_tokens = 17 exceeds models.m.max_model_len (16)"
    )
    # a session's last turn holds 8 + (3 - 1) x (8 + 10) + 8 = 52 tokens
    sessions = {
        "prompt_tokens": 8,
        "output_tokens": 8,
        "sessions": {"rates": [1], "count": 2, "turns": 3, "turn_tokens": 10},
    }
    fits = C.validate(small({"m": {"max_model_len": 52}}, workloads={"w": sessions}))
    assert fits.models["m"].max_model_len == 52
    assert refusal({"m": {"max_model_len": 51}}, workloads={"w": sessions}) == (
        "config error at workloads.w.sessions: a session's last turn holds 52 tokens (prompt_tokens + (turns - 1) "
        "x (output_tokens + turn_tokens) + output_tokens), beyond models.m.max_model_len (51)"
    )
    # a model that only drafts serves no workload of its own
    drafting = {"s": {"args": ["serve", "{draft_dir}"], "draft_model": "d"}}
    models = {"m": {}, "d": {"shape": "tiny-draft", "max_model_len": 16}}
    cfg = C.validate(small(models, stacks=drafting, workloads={"w": {"prompt_tokens": 64, "output_tokens": 64}}))
    assert G.bench_models(cfg) == ["m"] and cfg.models["d"].max_model_len == 16


def test_a_draft_is_a_model_of_the_config_with_the_served_models_tokenizer():
    drafting = {"s": {"args": ["serve", "{draft_dir}"], "draft_model": "d"}}
    assert refusal({"m": {}}, stacks=drafting) == "config error at stacks.s.draft_model: unknown model 'd' (known: m)"
    assert refusal({"m": {}, "d": {"tokenizer": "gpt2"}}, stacks=drafting) == (
        "config error at stacks.s.draft_model: d and models.m have different tokenizers (a draft must share the "
        "served model's)"
    )
    assert C.validate(small({"m": {}, "d": {"shape": "tiny-draft"}}, stacks=drafting)).models["d"].shape == (
        "tiny-draft"
    )


def test_the_schema_entry_fills_a_model_and_its_nested_objects_from_empty_defaults():
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    assert (schema["type"], schema["additionalProperties"]) == ("object", False)
    assert "required" not in schema and "default" not in schema  # a model is named: the map holds it
    assert list(schema["properties"]) == list(ModelConfig.model_fields)
    assert schema == plain_schema(ModelConfig)  # generated from the model's type
    props = schema["properties"]
    assert {k: p["default"] for k, p in props.items()} == {**FILLED, "prequantized": {}, "training": {}}
    for nested, model in (("prequantized", Prequantized), ("training", Training)):
        assert props[nested]["additionalProperties"] is False
        assert list(props[nested]["properties"]) == list(model.model_fields)
    training = props["training"]["properties"]
    assert {k: p["default"] for k, p in training.items()} == TRAINING
    assert training["max_s"]["type"] == ["number", "null"] and training["max_s"]["exclusiveMinimum"] == 0
    assert training["lr"]["type"] == "number" and training["corpus_bytes"]["minimum"] == 100_000
    assert props["shape"]["enum"] == SHAPES
    assert (props["max_model_len"]["type"], props["max_model_len"]["minimum"]) == ("integer", 16)


def test_every_key_says_what_it_does_in_one_line():
    props = json_schema()["properties"]
    keys = list(props.items())
    keys += [(f"{n}.{k}", p) for n in ("prequantized", "training") for k, p in props[n]["properties"].items()]
    for key, p in keys:
        assert p["description"].strip() and "\n" not in p["description"] and "  " not in p["description"], key
    assert props["seed"]["description"] == "Seed of the synthetic weights."


def test_the_default_configs_models_read_as_the_file_says():
    cfg = C.load()
    tiny, draft = cfg.models["tiny"], cfg.models["tiny-draft"]
    assert (tiny.source, tiny.shape, tiny.weights, tiny.seed, tiny.max_model_len) == (
        "synthetic",
        "tiny",
        "trained",
        0,
        1024,
    )
    assert (draft.shape, draft.weights, draft.max_model_len) == ("tiny-draft", "trained", 1024)
    assert tiny.training == draft.training == Training()  # the same learnt tokenizer
    assert G.bench_models(cfg) == ["tiny"]  # tiny-draft only drafts


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_model_of_a_shipped_config_passes_the_schema_entry_and_the_model(name):
    """Each file over the default (what serving it needs is checked where the file is loaded)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    check = Draft202012Validator(json_schema())
    for model, entry in merged["models"].items():
        assert [e.message for e in check.iter_errors(entry)] == [], f"{name}: models.{model}"
        typed = ModelConfig.model_validate(entry)
        assert typed.model_dump(include=set(entry), exclude_unset=True) == entry, f"{name}: models.{model}"
    assert "tiny" in merged["models"]
