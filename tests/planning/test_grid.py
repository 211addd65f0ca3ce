"""What a config describes (planning/grid.py): the steps of its chains named from their stacks,
its cells named by their load, and the params each job is planned with, in the shape every
finished cell was planned with (Snakemake reruns a cell whose params change)."""

import pytest
from conftest import REPO

from speedsplit.core.errors import ConfigError
from speedsplit.core.specs import CellParams, load_from_flat
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.stack_config import StackConfig


@pytest.fixture(scope="module")
def cfg():
    return C.load()


@pytest.fixture(scope="module")
def truth():
    return C.load(REPO / "tests/config/truth.yaml")


def truth_with(top: dict) -> dict:
    """What C.load(tests/config/truth.yaml) validates, `top` merged over it."""
    truth = C.merge(C.read_yaml(C.DEFAULT_CONFIG), C.read_yaml(REPO / "tests/config/truth.yaml"))
    return C.merge(truth, top)


def test_each_step_is_named_from_its_two_stacks(cfg):
    chains = {
        "engine": ["hf-fp16", "vllm-fp16", "vllm-fp16-ngram"],
        "offload": ["vllm-fp16", "vllm-fp16-offload"],
        "lmcache": ["vllm-fp16", "vllm-fp16-lmcache"],
        "cache": ["vllm-fp16-noprefix", "vllm-fp16"],
        "kernels": ["vllm-fp16", "vllm-gptq-exllama", "vllm-marlin", "vllm-awq-marlin"],
        "hf": ["hf-generate", "hf-generate-b64", "hf-fp16"],
        "gguf": ["vllm-fp16", "llamacpp-f16", "llamacpp-q8_0"],
        "fp8": ["vllm-fp16", "vllm-fp8"],
        "draft": ["vllm-fp16", "vllm-fp16-draft"],
        "twice": ["vllm-fp16", "vllm-marlin", "vllm-fp16", "vllm-marlin"],
    }
    # not validated: these chains would benchmark stacks this platform cannot serve
    assert G.chain_steps(cfg.model_copy(update={"chains": chains})) == {
        "engine": ["runtime", "speculative decoding (ngram)"],
        "offload": ["KV-cache offload (native)"],
        "lmcache": ["KV-cache offload (LMCache)"],  # its --kv-transfer-config's connector
        "cache": ["prefix caching"],
        # a kernel step in the chain: the weight steps are the format alone
        "kernels": ["INT4 format (vllm-fp16 → vllm-gptq-exllama)", "kernel", "INT4 format (vllm-marlin → vllm-awq-marlin)"],
        "hf": ["batch ceiling", "scheduler"],
        "gguf": ["runtime", "GGUF Q8_0 weights"],  # a 16-bit GGUF file holds the FP16 weights
        "fp8": ["FP8 weights + activations"],
        "draft": ["speculative decoding (draft model)"],
        # two steps that would read alike each name their stacks
        "twice": ["INT4 weights + kernel (vllm-fp16 → vllm-marlin)", "FP16 weights", "INT4 weights + kernel (vllm-fp16 → vllm-marlin)"],
    }  # fmt: skip
    assert [G.family(cfg.stacks[s]) for s in ("hf-fp16", "vllm-fp16", "llamacpp-f16", "reference")] == [
        "hf",
        "vllm",
        "llama.cpp",
        "reference",
    ]
    assert G.kernel_reference(cfg) == "vllm-fp16"  # the stack before the first chain's INT4 one


def test_cells_are_named_by_their_load_and_measured_by_their_stacks(truth):
    cells = G.cells(truth)
    named = {(c.name, c.kind, c.users, c.rate) for c in cells}
    assert {
        ("u1-alone-greedy", "closed", 1, None),
        ("r6-traffic-greedy", "open", 0, 6.0),  # a rate's cell: users 0
        ("x4-trace-greedy", "trace", 0, 4.0),  # a trace at 4x its speed
        ("s2-agent-greedy", "sessions", 0, 2.0),  # two sessions begun a second
    } <= named
    agent = G.cell_by_name(truth, "s2-agent-greedy")
    assert agent.measured_by("ref-cache") and not agent.measured_by("ref-slow")
    assert set(G.bench_stacks(truth)) == {s for c in cells for s in c.stacks}
    with pytest.raises(ConfigError, match="unknown cell 'u3-none-greedy'"):
        G.cell_by_name(truth, "u3-none-greedy")


# The params of each kind of cell, as finished cells were planned with them: a key added or
# dropped here reruns every finished cell of that kind (say so, or keep the shape).
SHARED = {
    "capacity_below", "capacity_stop_after", "cell", "min_measured_s", "output_tokens", "prompt_tokens",
    "requests_per_user", "sampling", "seed", "slo_tpot_p99_s", "slo_ttft_p99_s", "telemetry_s", "temperature",
    "top_p", "users", "warmup", "warmup_requests", "workload",
}  # fmt: skip
PARAMS = {
    "u1-alone-greedy": SHARED,
    "r6-traffic-greedy": SHARED | {"arrival", "lengths", "max_client_lag_s"},
    "x4-trace-greedy": SHARED | {"trace", "max_client_lag_s"},
    "s2-agent-greedy": SHARED | {"sessions", "max_client_lag_s"},
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_cells_params_keep_the_shape_finished_cells_were_planned_with(truth, name):
    params = G.cell_params(truth, G.cell_by_name(truth, name))
    assert set(params) == PARAMS[name]
    load = CellParams(**load_from_flat(params)).load  # the typed cell a job reads them as
    assert load.kind == G.cell_by_name(truth, name).kind
    if name.startswith("s"):
        assert params["sessions"] == {
            "pattern": "poisson", "rate_rps": 2.0, "burstiness": 1.0, "count": 4, "turns": 3, "turn_tokens": 100,
            "think_s": 0.2, "shared_prefix_tokens": 64,
        }  # fmt: skip


def test_a_workloads_prompt_text_is_in_its_cells_params_only_when_not_random_words(truth):
    coded = C.validate(truth_with({"workloads": {"alone": {"text": "code-edit"}}}))
    params = G.cell_params(coded, G.cell_by_name(coded, "u1-alone-greedy"))
    assert set(params) == SHARED | {"text"} and CellParams(**load_from_flat(params)).text == "code-edit"
    assert "text" not in G.cell_params(truth, G.cell_by_name(truth, "u1-alone-greedy"))
    with pytest.raises(ConfigError, match=r"workloads\.agent\.text: code prompts .* this workload is sessions"):
        C.validate(truth_with({"workloads": {"agent": {"text": "code"}}}))


def test_a_stacks_params_are_its_definition_with_its_model_and_topology(cfg):
    params = G.stack_params(cfg, "tiny", "vllm-fp16", "tp1")
    assert (params["model"], params["stack"], params["topology"]) == ("tiny", "vllm-fp16", "tp1")
    assert params["platform"] == G.platform_of(cfg) and G.topology_gpus(cfg, "tp1") == 1


@pytest.mark.parametrize(
    "args, backend",
    [
        (["--kv-offloading-size", "16"], "native"),
        (["--kv-offloading-size", "16", "--kv-offloading-backend", "lmcache"], "LMCache server"),
        (["--kv-transfer-config", '{{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}}'], "LMCache"),
        (["--kv-transfer-config", '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}'], "native"),
        # a connector that moves KV between instances (disaggregated prefill) keeps nothing offloaded
        (["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'], None),
        (["--kv-transfer-config", "not json"], None),
        ([], None),
    ],
)
def test_a_stacks_kv_offload_backend_is_read_from_either_flag(args, backend):
    entry = StackConfig.model_validate({"args": ["{python}", "-m", "vllm.entrypoints.openai.api_server", *args]})
    assert G.kv_offload(entry) == backend
