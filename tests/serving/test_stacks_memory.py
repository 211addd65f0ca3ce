"""A server's memory: a card's memory cap and the host memory a CPU server sizes its caches from (serving/stacks.py)."""

import sys

import pytest
from records import stack_spec

from speedsplit.serving import stacks


def _capped(**over):
    return stack_spec(**{"platform": "cuda", "card_memory_gib": 24, "memory_cap_args": [], **over})


def test_a_memory_cap_uses_the_servers_own_flag_with_the_cards_share():
    flag = ["--gpu-memory-utilization", "{memory_fraction}"]
    argv, cap = stacks.memory_cap(_capped(memory_cap_args=flag), ["vllm", "serve"], 139.8)
    assert argv == ["vllm", "serve", "--gpu-memory-utilization", "0.1716"]  # 24 / 139.8, rounded down
    assert cap["applied"] and cap["fraction"] == 0.1716 and cap["how"] == "--gpu-memory-utilization 0.1716"


def test_a_python_server_without_a_flag_runs_under_memcap():
    argv, cap = stacks.memory_cap(_capped(), [sys.executable, "-m", "transformers.cli.transformers", "serve"], 80.0)
    assert argv == [
        sys.executable,
        "-m",
        "speedsplit.serving.memcap",
        "--gib",
        "24",
        "--",
        "-m",
        "transformers.cli.transformers",
        "serve",
    ]
    assert cap["applied"] and cap["fraction"] == 0.3
    with pytest.raises(ValueError, match="stack s: card_memory_gib needs memory_cap_args"):
        stacks.memory_cap(_capped(), ["/usr/bin/llama-server"], 80.0)


def test_a_cap_the_card_cannot_emulate_is_refused_and_a_cpu_records_it_unapplied():
    with pytest.raises(ValueError, match="card_memory_gib 96 is not below the card's 80.0 GiB"):
        stacks.memory_cap(_capped(card_memory_gib=96), [sys.executable], 80.0)
    argv, cap = stacks.memory_cap(_capped(platform="cpu"), [sys.executable, "x"], None)
    assert argv == [sys.executable, "x"] and not cap["applied"] and "not on a CUDA card" in cap["reason"]
    assert stacks.memory_cap(_capped(card_memory_gib=None), ["x"], 80.0) == (["x"], None)


def test_a_vllm_cache_sized_by_hand_is_passed_in_bytes_and_a_capped_cache_above_its_fit_is_flagged():
    """kv_cache_gib: vLLM's --kv-cache-memory-bytes (CUDA only); a capped run whose engine gave
    its cache more than it said would fit the cap is flagged over_memory_cap, and that flag
    fails a capacity level like a wrong kernel does."""
    from records import fake_result

    from speedsplit.core.facts import MemoryCap
    from speedsplit.measuring import checks
    from speedsplit.core.errors import ConfigError
    from speedsplit.planning import config as C
    from speedsplit.probes import slo

    flag = ["--gpu-memory-utilization", "{memory_fraction}"]
    argv, cap = stacks.memory_cap(_capped(memory_cap_args=flag, kv_cache_gib=6.5), ["vllm", "serve"], 139.8)
    assert argv == [
        "vllm",
        "serve",
        "--kv-cache-memory-bytes",
        str(int(6.5 * 2**30)),
        "--gpu-memory-utilization",
        "0.1716",
    ]
    assert stacks.memory_cap(_capped(platform="cpu", kv_cache_gib=6.5), ["x"], None)[0] == ["x"]

    res = fake_result("vllm-fp16", 8, 0, 100.0)
    res.server.memory_cap = MemoryCap(
        card_memory_gib=24,
        applied=True,
        card_total_gib=139.8,
        fraction=0.1716,
        how="--gpu-memory-utilization",
        reason=None,
    )
    res.engine.kv_cache_gib, res.engine.kv_cache_fit_gib = 7.9, 5.2  # graphs outside the fraction
    assert checks.over_memory_cap(res)
    res.engine.kv_cache_gib = 5.2  # sized to the fit
    assert not checks.over_memory_cap(res)
    # what NVML saw on the card: more than 0.5 GiB above the cap is over it, whatever the engine said
    from speedsplit.core.record import Telemetry
    from speedsplit.core.facts import GpuTelemetry

    res.telemetry = Telemetry(interval_s=0.5, server_absent="not read here")

    def seen(peak, devices):
        return GpuTelemetry(
            devices=devices, samples=3, energy_j=1.0, energy_per_output_token_j=None, power_mean_w=1.0,
            power_peak_w=1.0, sm_util_mean_pct=1.0, memory_peak_gib=peak, series={},
        )  # fmt: skip

    res.engine.kv_cache_gib = res.engine.kv_cache_fit_gib = None  # a cache sized by hand logs no fit
    for peak, devices, over in ((26.9, ["0"], True), (24.4, ["0"], False), (49.0, ["0", "1"], False)):
        res.telemetry.gpu = seen(peak, devices)
        assert checks.over_memory_cap(res) is over, (peak, devices)
    assert slo.level_failure("ok", True, [], ["over_memory_cap"]) == "flagged over_memory_cap"
    # every reason a level fails, not only the first kind: the flag and the objectives it missed
    missed = ["p99 TTFT 3.1 s > 2 s", "p99 TPOT 120 ms > 100 ms"]
    assert slo.level_failure("ok", False, missed, ["over_memory_cap"]) == "flagged over_memory_cap; " + "; ".join(
        missed
    )

    cfg = C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"stacks": {"hf-fp16": {"kv_cache_gib": 4}}})
    with pytest.raises(ConfigError, match=r"^config error at stacks.hf-fp16.kv_cache_gib: only a vLLM stack"):
        C.validate(cfg)


def test_render_args_names_an_unknown_placeholder():
    assert stacks.render_args(["--port", "{port}"], {"port": 5}) == ["--port", "5"]
    with pytest.raises(ValueError, match="unknown placeholder 'nope'"):
        stacks.render_args(["{nope}"], {})


def test_a_cpu_server_sizes_its_cache_from_its_grid_not_the_host(tiny_model):
    """host_cache_cap: twice the KV cache of what the session keeps in flight (at least one
    full-length sequence), the logit rows transformers sets aside for 1024 requests, plus 0.25
    GiB; no cap where the stack does not ask for one."""
    import json

    cfg = json.loads((tiny_model / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    rows = 1024 * (cfg["hidden_size"] * 2 + cfg["vocab_size"] * 4)
    stack = stack_spec(host_cache_cap=True, max_model_len=1024)
    want = round((2 * per_token * 64 * 2048 + rows) / 2**30 + 0.25, 3)
    assert stacks.host_cache_gib(stack, tiny_model, 64 * 2048) == want
    assert stacks.host_cache_gib(stack, tiny_model, 10) == round((2 * per_token * 1024 + rows) / 2**30 + 0.25, 3)
    assert stacks.host_cache_gib(stack_spec(host_cache_cap=False), tiny_model, 10) is None
