"""Why a step is worth what it is, as the client sees it: from what every run holds, for every
stack and cell, with no support from the server (the engine and kernel levels go further).

A run's throughput is, exactly (Little's law over its measured phase),

    X = L × n / E

L = Σ E2E / wall, the mean number of requests in flight; n, the mean output tokens a request;
E, the mean end-to-end latency of a request. So a step's throughput factor is, exactly,

    X_b / X_a = (L_b / L_a) × (n_b / n_a) × (E_a / E_b)
                 in flight     tokens a request   latency

(each a ratio of geometric means over runs, as every factor is: they multiply to the factor as
measured, raw_value in the attribution). A closed loop keeps its users' requests in flight, so
its factor is its latency's; an open loop below saturation keeps its throughput (the arrivals
set it), and what the step changes is how long each request stays and so how many are in
flight. The latency's change splits exactly into its two parts, the time to the first token
(waiting and prefill) and the decode after it:

    E_a - E_b = (T_a - T_b) + (D_a - D_b)      (means over runs of each run's mean)

its seconds less the uncontended client's offsets where the host was calibrated (the client's
milliseconds are the client's, not either server's: on two stacks whose first tokens come
alike, a millisecond of the client's would otherwise move 2-4% of a 46 ms saving into the first
token's share).

Where the server counts its engine's steps (vLLM's vllm:iteration_tokens_total, the reference
server's engine clock), the same throughput is, exactly,

    X = (steps / wall) × (output tokens / steps)
         step rate         tokens a step

so a step's factor is its step-rate factor × its tokens-a-step factor: a kernel that makes each
step quicker shows in the first, a batch that grows (or a speculative step that accepts more
tokens) in the second. Beside them: the mean running batch and the tokens a step carried in
all (prefill and decode), as the server counted them.

The factors are as measured: the client's own milliseconds are in every one of them (its
offsets are a millisecond or two beside requests of hundreds: the attribution's value takes
them out, its raw_value keeps them).
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis import run_estimates as est
from speedsplit.analysis.frames import CELL_KEYS, RUNS_SCHEMA, clean_runs, open_loop

# Below this share of the slower side's latency, a change is too small to split into parts.
MIN_SAVED = 0.01

SCHEMA = {
    **{k: RUNS_SCHEMA[k] for k in CELL_KEYS},
    "chain": pl.Utf8,
    "position": pl.Int64,
    "factor": pl.Utf8,
    "loop": pl.Utf8,
    "runs": pl.Int64,
    "throughput_factor": pl.Float64,
    "in_flight_factor": pl.Float64,
    "in_flight_lo": pl.Float64,
    "in_flight_hi": pl.Float64,
    "tokens_factor": pl.Float64,
    "latency_factor": pl.Float64,
    "latency_lo": pl.Float64,
    "latency_hi": pl.Float64,
    "in_flight_from": pl.Float64,
    "in_flight_to": pl.Float64,
    "e2e_from_s": pl.Float64,
    "e2e_to_s": pl.Float64,
    "ttft_from_s": pl.Float64,
    "ttft_to_s": pl.Float64,
    "decode_from_s": pl.Float64,
    "decode_to_s": pl.Float64,
    "e2e_saved_s": pl.Float64,
    "ttft_saved_s": pl.Float64,
    "decode_saved_s": pl.Float64,
    "ttft_share": pl.Float64,
    "decode_share": pl.Float64,
    # the engine level (null: the server does not count its steps)
    "step_rate_factor": pl.Float64,
    "step_rate_lo": pl.Float64,
    "step_rate_hi": pl.Float64,
    "tokens_per_step_factor": pl.Float64,
    "steps_per_s_from": pl.Float64,
    "steps_per_s_to": pl.Float64,
    "tokens_per_step_from": pl.Float64,  # output tokens a step
    "tokens_per_step_to": pl.Float64,
    "engine_tokens_per_step_from": pl.Float64,  # prefill and decode tokens a step, as the server counted
    "engine_tokens_per_step_to": pl.Float64,
    "running_from": pl.Float64,  # the engine's mean running batch
    "running_to": pl.Float64,
    "kv_cache_peak_from": pl.Float64,  # the engine's KV cache at its fullest (share of it)
    "kv_cache_peak_to": pl.Float64,
    "preemptions_from": pl.Float64,  # requests the engine preempted (out of KV cache), a run's mean
    "preemptions_to": pl.Float64,
    "prefix_hit_rate_from": pl.Float64,  # the share of prompt tokens its prefix cache served
    "prefix_hit_rate_to": pl.Float64,
    "offload_hit_rate_from": pl.Float64,  # the share of tokens past the card's cache an offloaded tier served
    "offload_hit_rate_to": pl.Float64,
    "acceptance_from": pl.Float64,  # a speculative decoder's accepted / drafted tokens (null: not one)
    "acceptance_to": pl.Float64,
    "missing_extension_from": pl.Utf8,  # a compiled extension the engine ran without, on its fallback
    "missing_extension_to": pl.Utf8,
    "note": pl.Utf8,
}


def parts(row: dict) -> dict[str, float | str] | None:
    """One run's parts: requests in flight (L), tokens a request (n), mean latency (E), and the
    seconds it splits into, the client's offsets taken out where calibrated: the mean latency
    (C), its time to the first token (T) and the decode after it (C - T); None where the run has
    no completed request or no means (results from before they were kept)."""
    x, wall, done = row["output_tok_s"], row["wall_s"], row["completed"]
    e, t = row.get("e2e_s_mean"), row.get("ttft_s_mean")
    if not (x and wall and done and e and t is not None):
        return None
    # the seconds a step's time splits into, less the uncontended client's offsets where the
    # host was calibrated (its milliseconds are not the server's); the factors stay exact, as measured
    off_t, off_e = row.get("client_least_ttft_s"), row.get("client_least_e2e_s")
    c, tc = (e - off_e, t - off_t) if off_t is not None and off_e is not None else (e, t)
    out = {"L": done * e / wall, "n": x * wall / done, "E": e, "C": c, "T": tc, "D": c - tc}
    steps = row.get("engine_steps")
    if steps:  # the engine level: X = (steps / wall) × (output tokens / steps)
        out |= {"S": steps / wall, "K": x * wall / steps}
        if row.get("engine_tokens") is not None:
            out["Q"] = row["engine_tokens"] / steps
        if row.get("running_mean") is not None:
            out["B"] = row["running_mean"]
    if row.get("spec_acceptance") is not None:
        out["A"] = row["spec_acceptance"]
    memory = (("V", "kv_cache_peak"), ("P", "preemptions"), ("H", "prefix_cache_hit_rate"), ("O", "offload_hit_rate"))
    for key, column in memory:
        if row.get(column) is not None:  # what the engine's memory did, where it said
            out[key] = row[column]
    if row.get("missing_extension"):  # the engine said it ran without a compiled extension
        out["X"] = row["missing_extension"]
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def step_row(a: dict[int, dict], b: dict[int, dict], paired: bool) -> dict:
    """A step's client-level mechanism from each side's runs' parts (by run index)."""
    if paired:
        common = sorted(set(a) & set(b))
        a, b = {r: a[r] for r in common}, {r: b[r] for r in common}
    if not a or not b:
        return {"runs": 0, "note": "a stack has no clean run with its latencies' means"}

    def ratio(key: str, invert: bool = False) -> est.Estimate:
        side = {
            name: {r: (1.0 / p[key] if invert else p[key]) for r, p in runs.items()}
            for name, runs in (("a", a), ("b", b))
        }
        return est.ratio(side["a"], side["b"], paired)

    flight, tokens, latency = ratio("L"), ratio("n"), ratio("E", invert=True)
    mean = {k: (_mean([p[k] for p in a.values()]), _mean([p[k] for p in b.values()])) for k in "LCTD"}
    saved = {k: mean[k][0] - mean[k][1] for k in "CTD"}
    split = abs(saved["C"]) >= MIN_SAVED * max(mean["C"])

    def sides(name: str, key: str, apart: bool = False) -> dict[str, float | None]:
        """{name}_from and {name}_to: each side's mean of `key` over its runs; None where a run
        lacks it (on either side, unless apart)."""
        has = [all(key in p for p in side.values()) for side in (a, b)]
        return {
            f"{name}_{end}": _mean([p[key] for p in side.values()]) if (ok if apart else all(has)) else None
            for end, side, ok in (("from", a, has[0]), ("to", b, has[1]))
        }

    engine = {
        f"missing_extension_{end}": ", ".join(sorted({p["X"] for p in side.values() if "X" in p})) or None
        for end, side in (("from", a), ("to", b))
    }
    engine |= sides("acceptance", "A", apart=True)
    engine |= sides("kv_cache_peak", "V", apart=True) | sides("preemptions", "P", apart=True)
    engine |= sides("prefix_hit_rate", "H", apart=True) | sides("offload_hit_rate", "O", apart=True)
    if all("S" in p for p in (*a.values(), *b.values())):
        rate, per_step = ratio("S"), ratio("K")
        engine |= {
            "step_rate_factor": rate.value,
            "step_rate_lo": rate.lo,
            "step_rate_hi": rate.hi,
            "tokens_per_step_factor": per_step.value,
            **sides("steps_per_s", "S"),
            **sides("tokens_per_step", "K"),
            **sides("engine_tokens_per_step", "Q"),
            **sides("running", "B"),
        }
    return engine | {
        "runs": min(len(a), len(b)),
        "throughput_factor": flight.value * tokens.value * latency.value,
        "in_flight_factor": flight.value,
        "in_flight_lo": flight.lo,
        "in_flight_hi": flight.hi,
        "tokens_factor": tokens.value,
        "latency_factor": latency.value,
        "latency_lo": latency.lo,
        "latency_hi": latency.hi,
        "in_flight_from": mean["L"][0],
        "in_flight_to": mean["L"][1],
        "e2e_from_s": mean["C"][0],
        "e2e_to_s": mean["C"][1],
        "ttft_from_s": mean["T"][0],
        "ttft_to_s": mean["T"][1],
        "decode_from_s": mean["D"][0],
        "decode_to_s": mean["D"][1],
        "e2e_saved_s": saved["C"],
        "ttft_saved_s": saved["T"],
        "decode_saved_s": saved["D"],
        "ttft_share": saved["T"] / saved["C"] if split else None,
        "decode_share": saved["D"] / saved["C"] if split else None,
        "note": None if split else f"latency changed by under {MIN_SAVED:.0%}: not split into parts",
    }


def mechanism_frame(
    runs: pl.DataFrame, chains: dict[str, list[str]], tolerate_flags: Collection[str] = ()
) -> pl.DataFrame:
    """One row per (cell, chain, step): the client-level mechanism of the step's throughput
    factor, from the clean runs of its two stacks (as the attribution's factors are)."""
    rows = []
    for group, df in runs.group_by(CELL_KEYS, maintain_order=True):
        base = dict(zip(CELL_KEYS, group))
        paired = open_loop(base["load"])
        by_stack = {}
        for stack in {s for chain in chains.values() for s in chain}:
            clean, _ = clean_runs(df.filter(pl.col("stack") == stack), tolerate_flags)
            by_stack[stack] = {r["run"]: p for r in clean.iter_rows(named=True) if (p := parts(r)) is not None}
        for name, chain in chains.items():
            if not any(by_stack[s] for s in chain):
                continue  # a chain this cell did not measure
            for i, (a, b) in enumerate(zip(chain, chain[1:])):
                rows.append(
                    {
                        **base,
                        "chain": name,
                        "position": i + 1,
                        "factor": f"{b}/{a}",
                        "loop": "open" if paired else "closed",
                        **step_row(by_stack[a], by_stack[b], paired),
                    }
                )
    return pl.DataFrame(rows, schema=SCHEMA)


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def why_words(row: dict) -> str | None:
    """A step's mechanism in words, never claiming more than the row shows: e.g. 'requests
    2.4× quicker end to end (1.26 s → 0.52 s: time to the first token 45% of the time saved,
    decode 55%); in flight 1.00×'."""
    if not row.get("runs"):
        return None
    e_from, e_to = row["e2e_from_s"], row["e2e_to_s"]
    lat = row["latency_factor"]
    said = f"requests {lat:.3g}× {'quicker' if lat >= 1 else 'slower'} end to end ({e_from:.3g} s → {e_to:.3g} s"
    if row["ttft_share"] is not None:
        said += f": time to the first token {_pct(row['ttft_share'])} of the time {'saved' if row['e2e_saved_s'] > 0 else 'added'}, decode {_pct(row['decode_share'])}"
    flight = row["in_flight_factor"]
    if abs(flight - 1.0) < 0.01:
        said += f"); as many in flight ({row['in_flight_to']:.3g})"
    else:
        said += f"); {flight:.3g}× as many in flight ({row['in_flight_from']:.3g} → {row['in_flight_to']:.3g})"
    if abs(row["tokens_factor"] - 1.0) > 1e-3:
        said += f", {row['tokens_factor']:.3g}× the tokens a request"
    if row.get("step_rate_factor") is not None:
        said += (
            f"; the engine: {row['step_rate_factor']:.3g}× the steps a second ({row['steps_per_s_from']:.3g} → "
            f"{row['steps_per_s_to']:.3g}), {row['tokens_per_step_factor']:.3g}× the output tokens a step "
            f"({row['tokens_per_step_from']:.3g} → {row['tokens_per_step_to']:.3g})"
        )
    accepted = [(side, row.get(f"acceptance_{side}")) for side in ("from", "to")]
    said += "".join(
        f"; {'before' if side == 'from' else 'after'} the step, a speculative decoder accepted {_pct(v)} of its drafted tokens"
        for side, v in accepted
        if v is not None
    )
    pre = (row.get("preemptions_from"), row.get("preemptions_to"))
    if any(pre) and None not in pre:  # the engine ran out of KV cache on a side
        said += f"; preemptions {pre[0]:.3g} → {pre[1]:.3g} a run (KV cache at its fullest "
        said += f"{_pct(row['kv_cache_peak_from'] or 0)} → {_pct(row['kv_cache_peak_to'] or 0)})"
    hit = [row.get(f"prefix_hit_rate_{side}") for side in ("from", "to")]
    if None not in hit and abs(hit[1] - hit[0]) >= 0.01:  # its prefix cache served another share of the prompts
        said += f"; the prefix cache held {_pct(hit[0])} → {_pct(hit[1])} of the prompt tokens"
    elif hit[0] is None and hit[1] is not None and hit[1] >= 0.01:  # a prefix cache that held some after the step only
        said += f"; after the step a prefix cache held {_pct(hit[1])} of the prompt tokens"
    off = row.get("offload_hit_rate_to")
    if off is not None:  # an offloaded KV cache, after the step
        said += f"; its offloaded KV cache held {_pct(off)} of the prompt tokens the card's cache did not"
    missing = (row.get("missing_extension_from"), row.get("missing_extension_to"))
    for side, ext in zip(("before", "after"), missing):
        if ext and missing.count(ext) == 1:  # a fallback on one side only: the step measured it too
            said += f"; {side} the step the engine ran without its compiled extension {ext}, on a slower fallback"
    return said
