"""What each stack's tokens cost and what each step of a chain saves: an hour of the hardware
it ran on, divided over the tokens it served in that hour (analysis.cost in the config).

    dollars per million output tokens = price of a card-hour × cards / 3600 / (output tok/s) × 10^6

cards: tensor parallel × instances on CUDA; a CPU run's price is its host's (cards 1). The
interval comes from the throughput's (geometric mean over runs, 95% t interval), the far ends
swapped. Dollars per million tokens in and out divide the same hour over both (the cell's
prompt and output lengths). A step's cost factor is its hour's price over the step before's,
divided by its throughput factor (the attribution's, client offset taken out): below 1, the
step makes a token cheaper; the factors multiply to the chain's total like the speed factors.
"""

from __future__ import annotations

import polars as pl

from speedsplit.analysis.frames import CELL_KEYS, RUNS_SCHEMA

COST_SCHEMA = {
    **{k: RUNS_SCHEMA[k] for k in ("model", "stack", "topology", "cell", "users", "workload", "sampling", "platform")},
    "cards": pl.Int64,
    "hour_usd": pl.Float64,
    "usd_per_m_output": pl.Float64,
    "usd_per_m_output_lo": pl.Float64,
    "usd_per_m_output_hi": pl.Float64,
    "usd_per_m_tokens": pl.Float64,  # input and output tokens together
    "usd_per_m_tokens_lo": pl.Float64,
    "usd_per_m_tokens_hi": pl.Float64,
}


def hour_usd(spec: dict, stack: str, platform: str | None) -> float | None:
    """A card-hour of this stack: its own price, else its platform's; None: not priced."""
    if stack in spec.get("stacks", {}):
        return float(spec["stacks"][stack])
    price = spec.get("card_hour_usd", {}).get(platform or "")
    return None if price is None else float(price)


def cards(row: dict) -> int:
    """The cards a cell's server held: tensor parallel × instances on CUDA, the host on a CPU."""
    if row.get("platform") != "cuda":
        return 1
    return int(row.get("tensor_parallel") or 1) * int(row.get("instances") or 1)


def _per_million(hour: float, tok_s: float | None) -> float | None:
    return None if not tok_s else hour / 3600.0 / tok_s * 1e6


def cost_frame(cells: pl.DataFrame, spec: dict) -> pl.DataFrame:
    """Each priced stack's dollars per million tokens at every cell it measured."""
    rows = []
    for r in cells.iter_rows(named=True):
        price = hour_usd(spec, r["stack"], r["platform"])
        if price is None or not r["output_tok_s"]:
            continue
        hour = price * cards(r)
        # tokens in and out per output token: the cell's lengths (a trace's are its own: none)
        both = (
            (r["prompt_tokens"] + r["output_tokens"]) / r["output_tokens"]
            if r["prompt_tokens"] and r["output_tokens"]
            else None
        )
        out = {k: r[k] for k in COST_SCHEMA if k in r} | {"cards": cards(r), "hour_usd": hour}
        for name, scale in (("usd_per_m_output", 1.0), ("usd_per_m_tokens", both)):
            if scale is None:
                continue
            out[name] = _per_million(hour, r["output_tok_s"] * scale)
            # the faster end of the throughput's interval is the cheaper end of the cost's
            out[f"{name}_lo"] = _per_million(hour, (r["output_tok_s_hi"] or 0) * scale)
            out[f"{name}_hi"] = _per_million(hour, (r["output_tok_s_lo"] or 0) * scale)
        rows.append(out)
    return pl.DataFrame(rows, schema=COST_SCHEMA)


def step_frame(attribution: pl.DataFrame, cost: pl.DataFrame, chains: dict[str, list[str]]) -> pl.DataFrame:
    """Each chain step's cost factor (its hour over the step before's, over its throughput
    factor) and the total's, where every stack of the chain is priced at the cell."""
    hours = {(r["model"], r["stack"], r["topology"], r["cell"]): r["hour_usd"] for r in cost.iter_rows(named=True)}
    rows = []
    keys = [k for k in CELL_KEYS if k in attribution.columns]
    for r in attribution.iter_rows(named=True):
        chain = chains.get(r["chain"], [])
        if r["position"] == 0:
            frm, to = chain[0], chain[-1]
        else:
            frm, to = chain[r["position"] - 1], chain[r["position"]]
        a, b = (hours.get((r["model"], s, r["topology"], r["cell"])) for s in (frm, to))
        if a is None or b is None or not r["value"]:
            continue
        ratio = b / a
        rows.append(
            {k: r[k] for k in keys}
            | {
                "chain": r["chain"],
                "position": r["position"],
                "factor": r["factor"],
                "step": r.get("step"),
                "hour_ratio": ratio,
                "cost_factor": ratio / r["value"],
                "cost_lo": ratio / r["hi"] if r["hi"] else None,
                "cost_hi": ratio / r["lo"] if r["lo"] else None,
                "headline": r.get("headline"),
            }
        )
    schema = {
        "chain": pl.Utf8,
        "position": pl.Int64,
        "factor": pl.Utf8,
        "step": pl.Utf8,
        "hour_ratio": pl.Float64,
        "cost_factor": pl.Float64,
        "cost_lo": pl.Float64,
        "cost_hi": pl.Float64,
        "headline": pl.Boolean,
    }
    return pl.DataFrame(rows, schema={**{k: attribution.schema[k] for k in keys}, **schema})


def by_chain(cost: pl.DataFrame, chains: dict[str, list[str]]) -> dict[tuple[str, str, str, str], str]:
    """Per (chain, model, topology, cell): what a million output tokens cost on each of its
    stacks, e.g. 'hf-fp16 $41.2 → vllm-fp16 $3.61 → vllm-marlin $4.28 a million output tokens'."""
    price = {
        (r["model"], r["stack"], r["topology"], r["cell"]): r["usd_per_m_output"] for r in cost.iter_rows(named=True)
    }
    out = {}
    for model, topology, cell in {(r["model"], r["topology"], r["cell"]) for r in cost.iter_rows(named=True)}:
        for name, chain in chains.items():
            said = [price.get((model, s, topology, cell)) for s in chain]
            if all(v is not None for v in said):
                out[(name, model, topology, cell)] = (
                    " → ".join(f"{s} ${v:.3g}" for s, v in zip(chain, said)) + " a million output tokens"
                )
    return out


def priced_at(hour_usd_card: float) -> dict:
    """A cost spec that prices a card-hour at this many dollars on every platform (`speedsplit
    compare --card-hour-usd-a/-b`: one side's hardware, whatever its stacks)."""
    return {"card_hour_usd": {"cpu": hour_usd_card, "cuda": hour_usd_card}, "stacks": {}}


COMPARE_SCHEMA = {
    **{k: pl.Utf8 for k in ("model", "stack", "topology", "cell")},
    "hour_usd_a": pl.Float64,
    "hour_usd_b": pl.Float64,
    "usd_per_m_output_a": pl.Float64,
    "usd_per_m_output_b": pl.Float64,
    "b_over_a": pl.Float64,
    "lo": pl.Float64,
    "hi": pl.Float64,
}


def compare_frame(stacks: pl.DataFrame, runs_a: pl.DataFrame, runs_b: pl.DataFrame, spec_a: dict, spec_b: dict):
    """Per stack and cell whose throughput both sides measured (analysis/compare.stacks_frame) and
    whose hour each side prices: dollars per million output tokens on each side and B / A, the
    hours' ratio over the throughput's B / A (its interval's ends swapped): below 1 a token is
    cheaper on B. Each side's hour is its own cards' (tensor parallel × instances on CUDA)."""
    keys = ["model", "stack", "topology", "cell"]

    def hours(runs: pl.DataFrame, spec: dict) -> dict[tuple, float]:
        out = {}
        for r in runs.unique(subset=keys, keep="first", maintain_order=True).iter_rows(named=True):
            price = hour_usd(spec, r["stack"], r["platform"])
            if price is not None:
                out[tuple(r[k] for k in keys)] = price * cards(r)
        return out

    hour_a, hour_b = hours(runs_a, spec_a), hours(runs_b, spec_b)
    rows = []
    for r in stacks.filter(pl.col("metric") == "output_tok_s").iter_rows(named=True):
        key = tuple(r[k] for k in keys)
        if key not in hour_a or key not in hour_b or not r["b_over_a"]:
            continue
        ratio = hour_b[key] / hour_a[key]
        rows.append(
            dict(zip(keys, key))
            | {"hour_usd_a": hour_a[key], "hour_usd_b": hour_b[key]}
            | {
                "usd_per_m_output_a": _per_million(hour_a[key], r["a"]),
                "usd_per_m_output_b": _per_million(hour_b[key], r["b"]),
            }
            | {"b_over_a": ratio / r["b_over_a"], "lo": ratio / r["hi"] if r["hi"] else None}
            | {"hi": ratio / r["lo"] if r["lo"] else None}
        )
    return pl.DataFrame(rows, schema=COMPARE_SCHEMA)
