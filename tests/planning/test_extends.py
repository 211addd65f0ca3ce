"""Stacks that extend stacks (speedsplit/planning/extends.py), through the config loader."""

import pytest
import yaml
from conftest import REPO

from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.experiment import Experiment

DEFAULT = REPO / "config" / "config.yaml"


def config_with(stacks: dict, **top) -> Experiment:
    cfg = {
        "models": {"m": {}},
        "stacks": stacks,
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
        "sampling": {"greedy": {}},
    }
    cfg.update(top)
    return C.validate(cfg)


BASE = {
    "abstract": True,
    "args": ["serve", "--port", "{port}", "--max-batch", "8"],
    "env": {"A": "1", "B": "2"},
    "startup_timeout_s": 900,
    "on_cpu": {"args": ["--eager"], "env": {"C": "3"}, "dtype": "bfloat16"},
}


def test_a_stack_gives_only_what_differs_from_its_base():
    stacks = config_with(
        {
            "base": BASE,
            "child": {
                "extends": "base",
                "variant": "gptq",
                "env": {"B": "20", "A": None, "D": "4"},
                "set_args": {"--max-batch": "64", "--seed": 0},
                "add_args": ["--quantization", "gptq_marlin"],
                "on_cpu": {"env": {"E": "5"}, "expect_kernel": "CPUWNA16"},
            },
        }
    ).filled()["stacks"]
    child = stacks["child"]
    assert child["variant"] == "gptq" and child["startup_timeout_s"] == 900
    assert child["args"] == [
        "serve",
        "--port",
        "{port}",
        "--max-batch",
        "64",
        "--seed",
        "0",
        "--quantization",
        "gptq_marlin",
    ]
    assert child["env"] == {"B": "20", "D": "4"}  # merged; a key set to null removed
    assert child["on_cpu"]["args"] == ["--eager"] and child["on_cpu"]["env"] == {"C": "3", "E": "5"}
    assert child["on_cpu"]["expect_kernel"] == "CPUWNA16"
    assert not {"extends", "add_args", "set_args", "abstract"} & set(child)
    assert "base" not in stacks  # abstract: a base only


def test_extends_chains_and_args_replace():
    stacks = config_with(
        {
            "a": {"args": ["x", "--flag"], "env": {"K": "1"}},
            "b": {"extends": "a", "add_args": ["--more"]},
            "c": {"extends": "b", "args": ["y"]},
        }
    ).filled()["stacks"]
    assert stacks["a"]["args"] == ["x", "--flag"] and stacks["b"]["args"] == ["x", "--flag", "--more"]
    assert stacks["c"]["args"] == ["y"] and stacks["c"]["env"] == {"K": "1"}


@pytest.mark.parametrize(
    "stacks, chains, expect",
    [
        (
            {"a": {"extends": "nope"}},
            {},
            "config error at stacks.a.extends: unknown stack 'nope' (stacks: a)",
        ),
        (
            {"a": {"extends": "b", "args": ["x"]}, "b": {"extends": "a"}},
            {},
            "config error at stacks.b.extends: stacks extend each other in a loop (a -> b -> a)",
        ),
        (
            {"base": {"abstract": True, "args": ["x"]}, "a": {"extends": "base"}},
            {"c": ["base", "a"]},
            "config error at chains.c[0]: unknown stack 'base' (stacks: a)",
        ),
        (
            {"a": {"args": ["x"]}, "b": {"extends": "a", "add_args": "--oops"}},
            {},
            "config error at stacks.b.add_args: a list of strings (arguments appended)",
        ),
    ],
)
def test_a_wrong_extends_is_one_line_naming_its_key(stacks, chains, expect):
    with pytest.raises(ConfigError) as err:
        config_with(stacks, chains=chains)
    assert str(err.value) == expect


def test_an_override_of_a_base_in_a_later_file_reaches_the_stacks_extending_it(tmp_path):
    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"stacks": {"vllm": {"env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}}}))
    cfg = C.load(top)
    vllm_stacks = [name for name, s in cfg.stacks.items() if G.family(s) == "vllm"]
    assert len(vllm_stacks) >= 10
    stacks = cfg.filled()["stacks"]
    assert all(stacks[name]["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG" for name in vllm_stacks)
    assert stacks["vllm-marlin"]["env"]["VLLM_DISABLED_KERNELS"] == "MacheteLinearKernel"


def test_the_default_config_states_the_vllm_command_and_its_cpu_overlay_once():
    text = DEFAULT.read_text()
    assert text.count("vllm.entrypoints.openai.api_server") == 1
    assert text.count("VLLM_CPU_KVCACHE_SPACE") == 1
    cfg = C.load()
    vllm_stacks = {name: s for name, s in cfg.stacks.items() if G.family(s) == "vllm"}
    base_args = yaml.safe_load(text)["stacks"]["vllm"]["args"]
    for name, s in vllm_stacks.items():
        assert s.args[: len(base_args)] == base_args, name
        if s.variant != "fp8":
            assert s.on_cpu.args == ["--enforce-eager"], name
    # the kernel sweep and the prefix switch: what each stack adds, and nothing else
    stacks = cfg.filled()["stacks"]
    assert stacks["vllm-fp16-noprefix"]["args"] == base_args + ["--no-enable-prefix-caching"]
    assert stacks["vllm-marlin"]["args"] == base_args + ["--quantization", "gptq_marlin"]
    assert stacks["hf-generate-b64"]["args"][-2:] == ["--max-batch", "64"]
    batch = C.read_yaml(DEFAULT)
    batch["chains"] = {"f": ["hf-generate", "hf-generate-b64"]}
    assert G.chain_steps(C.validate(batch))["f"] == ["batch ceiling"]
