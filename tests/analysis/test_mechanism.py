"""The client-level mechanism of a step: exact identities over made-up runs whose every
request is known (analysis/mechanism.py). The truth tier proves it on real servers."""

import math

import polars as pl
import pytest

from speedsplit.analysis import mechanism as M
from speedsplit.analysis.frames import RUNS_SCHEMA

CELL = {"model": "m", "topology": "tp1", "users": 4, "workload": "w", "sampling": "greedy", "prompt_tokens": 8}


# a cell's load by its name's first letter (planning/grid.py names them so)
LOADS = {"u": "closed", "r": "open", "x": "trace", "s": "sessions"}


def run(stack, r, *, tok_s, wall, done, e2e, ttft, cell="u4-w-greedy", out=16, flags=()):
    return CELL | {
        "cell": cell,
        "load": LOADS[cell[0]],
        "output_tokens": out,
        "stack": stack,
        "run": r,
        "status": "ok",
        "flags": list(flags),
        "output_tok_s": tok_s,
        "wall_s": wall,
        "completed": done,
        "e2e_s_mean": e2e,
        "ttft_s_mean": ttft,
    }


def frame(rows):
    return pl.DataFrame(rows, schema=RUNS_SCHEMA)


def test_the_factor_is_in_flight_times_tokens_times_latency_exactly():
    # slow: 4 users, 8 requests of 16 tokens, each 1.0 s (0.6 s to the first token), wall 2.1 s
    # fast: the same, each 0.5 s (0.2 s to the first token), wall 1.05 s; a second run a little off
    rows = [
        run("slow", 0, tok_s=128 / 2.1, wall=2.1, done=8, e2e=1.0, ttft=0.6),
        run("slow", 1, tok_s=128 / 2.2, wall=2.2, done=8, e2e=1.05, ttft=0.62),
        run("fast", 0, tok_s=128 / 1.05, wall=1.05, done=8, e2e=0.5, ttft=0.2),
        run("fast", 1, tok_s=128 / 1.1, wall=1.1, done=8, e2e=0.52, ttft=0.21),
    ]
    row = M.mechanism_frame(frame(rows), {"c": ["slow", "fast"]}).row(0, named=True)
    measured = math.sqrt((128 / 1.05) * (128 / 1.1)) / math.sqrt((128 / 2.1) * (128 / 2.2))
    assert row["throughput_factor"] == pytest.approx(measured, rel=1e-12)
    product = row["in_flight_factor"] * row["tokens_factor"] * row["latency_factor"]
    assert product == pytest.approx(row["throughput_factor"], rel=1e-12)
    assert row["tokens_factor"] == pytest.approx(1.0) and row["loop"] == "closed" and row["runs"] == 2
    assert row["latency_factor"] == pytest.approx(math.sqrt(1.0 * 1.05) / math.sqrt(0.5 * 0.52), rel=1e-12)
    assert row["latency_lo"] < row["latency_factor"] < row["latency_hi"]
    # the time saved, exactly its two parts: (1.025 - 0.51) = (0.61 - 0.205) + (0.415 - 0.305)
    assert row["e2e_saved_s"] == pytest.approx(0.515)
    assert row["ttft_saved_s"] + row["decode_saved_s"] == pytest.approx(row["e2e_saved_s"], rel=1e-12)
    assert row["ttft_share"] == pytest.approx(0.405 / 0.515) and row["decode_share"] == pytest.approx(0.11 / 0.515)
    words = M.why_words(row)
    assert words.startswith(
        "requests 2.01× quicker end to end (1.02 s → 0.51 s: time to the first token 79% of the time saved, decode 21%)"
    )


def test_an_open_loop_pairs_its_runs_and_a_change_too_small_is_not_split():
    cell = "r6-w-greedy"
    rows = [
        run("a", 0, tok_s=100.0, wall=2.0, done=10, e2e=0.40, ttft=0.1, cell=cell),
        run("a", 1, tok_s=100.0, wall=2.0, done=10, e2e=0.40, ttft=0.1, cell=cell),
        run("b", 0, tok_s=100.0, wall=2.0, done=10, e2e=0.399, ttft=0.1, cell=cell),
        run("b", 2, tok_s=100.0, wall=2.0, done=10, e2e=0.399, ttft=0.1, cell=cell, flags=["kernel_mismatch"]),
    ]
    row = M.mechanism_frame(frame(rows), {"c": ["a", "b"]}).row(0, named=True)
    assert row["loop"] == "open" and row["runs"] == 1  # run 0 alone is common (b's run 2 is not clean)
    assert row["ttft_share"] is None and "not split" in row["note"]
    assert "time to the first token" not in M.why_words(row)


def test_a_stack_with_no_clean_run_says_so():
    rows = [run("a", 0, tok_s=100.0, wall=2.0, done=10, e2e=0.4, ttft=0.1)]
    out = M.mechanism_frame(frame(rows), {"c": ["a", "b"]})
    assert out.height == 1 and out["runs"][0] == 0 and "no clean run" in out["note"][0]
    assert M.why_words(out.row(0, named=True)) is None


def test_where_the_server_counts_its_steps_the_factor_is_step_rate_times_tokens_a_step():
    """A kernel that halves the step time: twice the steps a second, the same tokens a step."""
    rows = [
        run("slow", 0, tok_s=128 / 2.0, wall=2.0, done=8, e2e=1.0, ttft=0.2)
        | {"engine_steps": 40.0, "running_mean": 4.0},
        run("fast", 0, tok_s=128 / 1.0, wall=1.0, done=8, e2e=0.5, ttft=0.1)
        | {"engine_steps": 40.0, "running_mean": 4.0},
    ]
    row = M.mechanism_frame(frame(rows), {"c": ["slow", "fast"]}).row(0, named=True)
    assert row["step_rate_factor"] == pytest.approx(2.0) and row["tokens_per_step_factor"] == pytest.approx(1.0)
    assert row["step_rate_factor"] * row["tokens_per_step_factor"] == pytest.approx(row["throughput_factor"])
    assert (row["steps_per_s_from"], row["tokens_per_step_from"], row["running_from"]) == (20.0, 3.2, 4.0)
    assert "the engine: 2× the steps a second (20 → 40), 1× the output tokens a step (3.2 → 3.2)" in M.why_words(row)
    # a server that counts no steps: no engine level
    plain = [{k: v for k, v in r.items() if k not in ("engine_steps", "running_mean")} for r in rows]
    row = M.mechanism_frame(frame(plain), {"c": ["slow", "fast"]}).row(0, named=True)
    assert row["step_rate_factor"] is None and "engine" not in M.why_words(row)


def test_a_speculative_stack_says_how_much_of_its_drafts_it_accepted():
    rows = [
        run("plain", 0, tok_s=64.0, wall=2.0, done=8, e2e=1.0, ttft=0.2),
        run("spec", 0, tok_s=128.0, wall=1.0, done=8, e2e=0.5, ttft=0.2) | {"spec_acceptance": 0.7},
    ]
    row = M.mechanism_frame(frame(rows), {"c": ["plain", "spec"]}).row(0, named=True)
    assert row["acceptance_from"] is None and row["acceptance_to"] == 0.7
    assert M.why_words(row).endswith("after the step, a speculative decoder accepted 70% of its drafted tokens")


def test_the_time_saved_splits_with_the_clients_offsets_taken_out():
    """Two stacks whose first tokens come alike (70 ms) but whose client read one 2 ms late: the
    first token's share of the 46 ms saved is its truth, 0, not 2/46, once the calibrated
    offsets are out; the factors stay as measured."""
    offsets = [(0.0005, 0.0007), (0.0025, 0.0027)]  # (ttft, e2e): the uncontended client's, per stack
    rows = []
    for stack, e2e, off in (("lazy", 0.3, offsets[0]), ("quick", 0.254, offsets[1])):
        for r in (0, 1):
            ttft, e = 0.07 + off[0], e2e + off[1]
            rows.append(
                run(stack, r, tok_s=6 * 24 / e, wall=e * 4, done=24, e2e=e, ttft=ttft)
                | {"client_least_ttft_s": off[0], "client_least_e2e_s": off[1]}
            )
    row = M.mechanism_frame(frame(rows), {"c": ["lazy", "quick"]}).row(0, named=True)
    assert row["e2e_saved_s"] == pytest.approx(0.046) and row["ttft_saved_s"] == pytest.approx(0.0, abs=1e-12)
    assert row["decode_share"] == pytest.approx(1.0) and row["ttft_share"] == pytest.approx(0.0, abs=1e-9)
    assert row["latency_factor"] == pytest.approx((0.3 + 0.0007) / (0.254 + 0.0027), rel=1e-12)


def test_what_the_engines_memory_did_stands_beside_the_step_and_preemptions_are_said():
    rows = [
        run("fp16", r, tok_s=100.0, wall=2.0, done=8, e2e=1.0, ttft=0.5)
        | {"kv_cache_peak": 1.0, "preemptions": 6.0 + 2 * r, "prefix_cache_hit_rate": 0.0}
        for r in (0, 1)
    ] + [
        run("int4", r, tok_s=150.0, wall=2.0, done=12, e2e=0.66, ttft=0.3)
        | {"kv_cache_peak": 0.5, "preemptions": 0.0, "prefix_cache_hit_rate": 0.0}
        for r in (0, 1)
    ]
    row = M.mechanism_frame(frame(rows), {"c": ["fp16", "int4"]}).row(0, named=True)
    assert (row["kv_cache_peak_from"], row["kv_cache_peak_to"]) == (1.0, 0.5)
    assert (row["preemptions_from"], row["preemptions_to"]) == (7.0, 0.0) and row["prefix_hit_rate_to"] == 0.0
    assert M.why_words(row).endswith("; preemptions 7 → 0 a run (KV cache at its fullest 100% → 50%)")
    quiet = [r | {"preemptions": 0.0} for r in rows]
    assert "preemptions" not in M.why_words(M.mechanism_frame(frame(quiet), {"c": ["fp16", "int4"]}).row(0, named=True))


def test_a_step_to_a_cache_says_what_its_caches_held():
    """A prefix cache after the step only, then an offloaded KV cache: each run's hit rates (vLLM's
    prefix-cache and external prefix-cache counters) go into the step's why."""
    cell = "s2-agent-greedy"
    rows = []
    for r in (0, 1):
        rows += [
            {**run("none", r, tok_s=100.0, wall=2.0, done=10, e2e=0.5, ttft=0.3, cell=cell)},
            {**run("cache", r, tok_s=110.0, wall=2.0, done=10, e2e=0.4, ttft=0.2, cell=cell), "prefix_cache_hit_rate": 0.3},
            {**run("offload", r, tok_s=120.0, wall=2.0, done=10, e2e=0.35, ttft=0.15, cell=cell),
             "prefix_cache_hit_rate": 0.4, "offload_hit_rate": 0.5},
        ]  # fmt: skip
    out = M.mechanism_frame(frame(rows), {"c": ["none", "cache", "offload"]})
    first, second = (M.why_words(r) for r in out.iter_rows(named=True))
    assert first.endswith("; after the step a prefix cache held 30% of the prompt tokens")
    assert "; the prefix cache held 30% → 40% of the prompt tokens" in second
    assert second.endswith("; its offloaded KV cache held 50% of the prompt tokens the card's cache did not")
    assert out["offload_hit_rate_to"].to_list() == [None, 0.5]


def test_a_step_whose_engine_ran_without_its_compiled_extension_says_so():
    """LMCache on its torch fallback (its cuda_ops did not load): the step's why names it on the
    side that ran so, and not where both sides did."""
    cell = "s2-agent-greedy"
    rows = []
    for r in (0, 1):
        rows += [
            run("fp16", r, tok_s=100.0, wall=2.0, done=10, e2e=0.5, ttft=0.3, cell=cell),
            {**run("lmcache", r, tok_s=74.0, wall=2.0, done=10, e2e=0.95, ttft=0.6, cell=cell),
             "offload_hit_rate": 0.49, "missing_extension": "lmcache.cuda_ops"},
        ]  # fmt: skip
    row = M.mechanism_frame(frame(rows), {"c": ["fp16", "lmcache"]}).row(0, named=True)
    assert (row["missing_extension_from"], row["missing_extension_to"]) == (None, "lmcache.cuda_ops")
    assert M.why_words(row).endswith(
        "; after the step the engine ran without its compiled extension lmcache.cuda_ops, on a slower fallback"
    )
    both = [r | {"missing_extension": "lmcache.cuda_ops"} for r in rows]
    row = M.mechanism_frame(frame(both), {"c": ["fp16", "lmcache"]}).row(0, named=True)
    assert "compiled extension" not in M.why_words(row)
