"""Does sharding pay? Topologies compared on the same model, stack and cell.

A topology is `tensor_parallel` cards per instance times `instances` instances. From the
cells and runs frames:
- `topology_frame`: throughput per GPU and per user of every topology, with intervals;
- `scaling_frame`: tp{k} over tp1 (efficiency = factor / k), m instances over tp1
  (efficiency = factor / m), and m instances over tp{m} on the same cards, each a ratio of
  throughputs over runs with a 95% t interval (the attribution's own), and which topology
  wins (a tie when the interval holds 1).
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from speedsplit.analysis import attribution as attr
from speedsplit.analysis.chains import clean_runs
from speedsplit.core.spans import length, union

KEYS = ["model", "stack", "cell", "users", "workload", "sampling", "prompt_tokens", "output_tokens"]


def topology_frame(cells: pl.DataFrame) -> pl.DataFrame:
    """Per (model, stack, cell, topology): GPUs, throughput, per GPU and per user, with intervals."""
    gpus = pl.col("tensor_parallel") * pl.col("instances")
    out = cells.select(
        *KEYS,
        "topology",
        "tensor_parallel",
        "instances",
        gpus.alias("gpus"),
        "output_tok_s",
        "output_tok_s_lo",
        "output_tok_s_hi",
        *[(pl.col(f"output_tok_s{e}") / gpus).alias(f"tok_s_per_gpu{e}") for e in ("", "_lo", "_hi")],
        # an open-loop cell has no users (0): no throughput per user, rather than infinity
        *[
            pl.when(pl.col("users") > 0).then(pl.col(f"output_tok_s{e}") / pl.col("users")).alias(f"tok_s_per_user{e}")
            for e in ("", "_lo", "_hi")
        ],
    )
    return out.sort([*KEYS[:3], "gpus", "tensor_parallel"])


SCALING_SCHEMA = {
    **{k: pl.Utf8 for k in ("model", "stack", "cell", "workload", "sampling")},
    **{k: pl.Int64 for k in ("users", "prompt_tokens", "output_tokens")},
    "kind": pl.Utf8,
    "comparison": pl.Utf8,
    "numerator": pl.Utf8,
    "denominator": pl.Utf8,
    "gpus": pl.Int64,
    "value": pl.Float64,
    "lo": pl.Float64,
    "hi": pl.Float64,
    "ideal": pl.Float64,
    "efficiency": pl.Float64,
    "efficiency_lo": pl.Float64,
    "efficiency_hi": pl.Float64,
    "winner": pl.Utf8,
    "runs_used": pl.Int64,
    "excluded": pl.List(pl.Utf8),
    "note": pl.Utf8,
}


def _comparisons(shapes: dict[str, tuple[int, int]]) -> list[tuple[str, str, str, float | None]]:
    """(kind, numerator, denominator, ideal factor) for the topologies present at one cell."""
    one = [t for t, (tp, n) in shapes.items() if tp == 1 and n == 1]
    out = []
    for t, (tp, n) in sorted(shapes.items(), key=lambda kv: (kv[1][0] * kv[1][1], kv[0])):
        if one and n == 1 and tp > 1:
            out.append(("tensor_parallel", t, one[0], float(tp)))
        if one and tp == 1 and n > 1:
            out.append(("instances", t, one[0], float(n)))
        if tp == 1 and n > 1:
            for u, (tp2, n2) in shapes.items():
                if n2 == 1 and tp2 == n:
                    out.append(("instances_vs_tensor_parallel", t, u, None))
    return out


def scaling_frame(runs: pl.DataFrame, tolerate_flags: Collection[str] = ()) -> pl.DataFrame:
    """Every topology comparison at every (model, stack, cell) measured on more than one topology."""
    rows = []
    for group, df in runs.group_by(KEYS, maintain_order=True):
        shapes = {
            t: (int(d["tensor_parallel"][0]), int(d["instances"][0]))
            for (t,), d in df.group_by(["topology"], maintain_order=True)
        }
        for kind, num, den, ideal in _comparisons(shapes):
            tp, why, used = {}, [], 0
            missing = {}
            for topo in (den, num):
                clean, excluded = clean_runs(df.filter(pl.col("topology") == topo), tolerate_flags)
                tp[topo] = dict(zip(clean["run"], clean["output_tok_s"]))
                why += [f"{topo} {w.removeprefix(df['stack'][0] + ' ')}" for w in excluded]
                used += clean.height
                if not tp[topo]:
                    missing[topo] = "no clean run"
            f = attr.attribute([den, num], tp, missing=missing).factors[0]
            eff = [None if v is None or ideal is None else v / ideal for v in (f.value, *f.ci)]
            if f.value is None:
                winner = None
            elif f.ci[0] is not None and f.ci[0] <= 1.0 <= f.ci[1]:
                winner = "tie"
            else:
                winner = num if f.value > 1 else den
            rows.append(
                {
                    **dict(zip(KEYS, group)),
                    "kind": kind,
                    "comparison": f"{num} / {den}",
                    "numerator": num,
                    "denominator": den,
                    "gpus": shapes[num][0] * shapes[num][1],
                    "value": f.value,
                    "lo": f.ci[0],
                    "hi": f.ci[1],
                    "ideal": ideal,
                    "efficiency": eff[0],
                    "efficiency_lo": eff[1],
                    "efficiency_hi": eff[2],
                    "winner": winner,
                    "runs_used": used,
                    "excluded": why,
                    "note": "; ".join(f"{t}: {m}" for t, m in missing.items()),
                }
            )
    return pl.DataFrame(rows, schema=SCALING_SCHEMA)


def link_frame(link: dict) -> pl.DataFrame:
    """The interconnect control (results/hardware/link.json) as one row per pair, mode and payload."""
    decode = set(link["decode_payload_bytes"])
    rows = [{"backend": link["backend"], **m, "decode_sized": m["bytes"] in decode} for m in link["measurements"]]
    return pl.DataFrame(
        rows,
        schema={
            "backend": pl.Utf8,
            "pair": pl.Utf8,
            "mode": pl.Utf8,
            "bytes": pl.Int64,
            "iterations": pl.Int64,
            "latency_us": pl.Float64,
            "algbw_gb_s": pl.Float64,
            "busbw_gb_s": pl.Float64,
            "decode_sized": pl.Boolean,
        },
    )


COORDINATION_PARTS = ("compute_ms", "communication_ms", "copy_ms", "gap_ms")


def coordination_frame(profiles: list[dict]) -> pl.DataFrame:
    """Each profiled tp{k} against tp1 at the same model, stack and cell: the per-step
    shortfall against ideal scaling (tp{k} step - tp1 step / k) split exactly into what each
    part of the step gained or lost (part at tp{k} - part at tp1 / k), and the share of the
    shortfall that communication and idle gaps make up."""
    schema = {
        **{k: pl.Utf8 for k in ("model", "stack", "cell", "topology")},
        "tensor_parallel": pl.Int64,
        "step_ms_tp1": pl.Float64,
        "step_ms": pl.Float64,
        "ideal_step_ms": pl.Float64,
        "shortfall_ms": pl.Float64,
        **{f"excess_{p}": pl.Float64 for p in COORDINATION_PARTS},
        "coordination_share": pl.Float64,
        "step_speedup": pl.Float64,
        "note": pl.Utf8,
    }
    by_key = {(p["model"], p["stack"], p["cell"], p["tensor_parallel"]): p for p in profiles}
    rows = []
    for (model, stack, cell, k), prof in sorted(by_key.items()):
        if k == 1:
            continue
        base = {"model": model, "stack": stack, "cell": cell, "topology": prof["topology"], "tensor_parallel": k}
        one = by_key.get((model, stack, cell, 1))
        why = (
            "no tp1 profile"
            if one is None
            else next(
                (f"{p['topology']}: {p.get('error') or p.get('note')}" for p in (one, prof) if not p.get("breakdown")),
                None,
            )
        )
        if why:
            rows.append({**base, "note": why})
            continue
        b1, bk = one["breakdown"], prof["breakdown"]
        ideal = b1["step_ms"] / k
        shortfall = bk["step_ms"] - ideal
        excess = {f"excess_{p}": bk[p] - b1[p] / k for p in COORDINATION_PARTS}
        coordination = excess["excess_communication_ms"] + excess["excess_gap_ms"]
        rows.append(
            {
                **base,
                "step_ms_tp1": b1["step_ms"],
                "step_ms": bk["step_ms"],
                "ideal_step_ms": ideal,
                "shortfall_ms": shortfall,
                **excess,
                "coordination_share": coordination / shortfall if shortfall > 0 else None,
                "step_speedup": b1["step_ms"] / bk["step_ms"],
                "note": "" if shortfall > 0 else "no shortfall: scales at least ideally",
            }
        )
    return pl.DataFrame(rows, schema=schema)


PACKING_SCHEMA = {
    "device": pl.Utf8,
    "wall_s": pl.Float64,
    "measuring_s": pl.Float64,
    "measuring_share": pl.Float64,
    "starting_s": pl.Float64,
    "starting_share": pl.Float64,
    "jobs": pl.Int64,
}


RUN_GAP_S = 900.0  # no bench job running for this long: the next job belongs to another run


def packing_frame(runs: pl.DataFrame) -> pl.DataFrame:
    """How busy each card was over the runs' wall time: the share spent measuring (load running
    on it) and starting servers (from each session's first job: lease wait, then start-up). A
    last row, device 'all', pools the cards (GPU-busy share of the makespan; a '(none)' row,
    the runs that held no card, is no card of it). Empty for results without timing.

    The wall time is each workflow run's, from its first bench job's start to its last one's
    end, summed over runs; results measured apart (no bench job running for RUN_GAP_S, e.g. a
    later run on another host added to the same folder) are separate runs, so the time between
    them counts for none."""
    timed = runs.filter(pl.col("job_start").is_not_null() & pl.col("job_end").is_not_null())
    if timed.height == 0:
        return pl.DataFrame(schema=PACKING_SCHEMA)
    wall = length(union(list(zip(timed["job_start"], timed["job_end"])), join_gaps_under=RUN_GAP_S))
    rows = []
    per_device: dict[str, dict[str, list]] = {}
    for r in timed.iter_rows(named=True):
        for dev in r["devices"] or ["(none)"]:
            d = per_device.setdefault(dev, {"measuring": [], "starting": [], "jobs": []})
            d["jobs"].append(1)
            if r["load_start"] is not None and r["load_end"] is not None:
                d["measuring"].append((r["load_start"], r["load_end"]))
            if not r["reused"] and r["startup_s"] is not None:
                start = r["job_start"] + (r["lease_wait_s"] or 0.0)
                d["starting"].append((start, start + r["startup_s"]))
    for dev, d in sorted(per_device.items()):
        m, s = length(union(d["measuring"])), length(union(d["starting"]))
        rows.append(
            {
                "device": dev,
                "wall_s": wall,
                "measuring_s": m,
                "measuring_share": m / wall if wall > 0 else None,
                "starting_s": s,
                "starting_share": s / wall if wall > 0 else None,
                "jobs": len(d["jobs"]),
            }
        )
    # the cards pooled: runs that held none (skipped, or failed before a lease) are no card
    cards = [r for r in rows if r["device"] != "(none)"] or rows
    n = len(cards)
    m_all, s_all = sum(r["measuring_s"] for r in cards), sum(r["starting_s"] for r in cards)
    rows.append(
        {
            "device": "all",
            "wall_s": wall,
            "measuring_s": m_all,
            "measuring_share": m_all / (n * wall) if wall > 0 else None,
            "starting_s": s_all,
            "starting_share": s_all / (n * wall) if wall > 0 else None,
            "jobs": timed.height,
        }
    )
    return pl.DataFrame(rows, schema=PACKING_SCHEMA)
