"""Why a step's decode is faster, kernel by kernel (#49's kernel level): each profiled run's
decode step split into kernel classes (core/trace_split.py), and each chain step's change of step
time split into the classes' changes, which add up to it exactly.

`step_time_frame`: one row per profiled run (model, stack, topology, cell), the step's ms and
each class's, the longest kernel of each class, or why it has none. `step_time_changes`: one
row per chain step and cell where both neighbours were profiled, the step's ms on each side,
the class deltas (to - from, summing to the step's delta) and `step_speedup` (from / to).
"""

from __future__ import annotations

import polars as pl

from speedsplit.core.trace_split import CLASSES

CLASS_MS = [f"{c}_ms" for c in CLASSES]
KEYS = ["model", "stack", "topology", "cell"]
# a class whose change is under this share of the step's is "unchanged" in a sentence
UNCHANGED_SHARE = 0.05
# a profiled step this much slower than the measured phase's mean step (which holds prefill
# steps too: a profiled decode step is normally quicker) was slowed by the profiler
PROFILER_SLOWED = 0.10
NAMES = {
    "communication": "communication",
    "attention": "attention",
    "quantized_gemm": "quantized GEMM",
    "dense_gemm": "dense GEMM",
    "other": "other kernels",
    "copy": "copies",
    "idle": "GPU idle",
}


def step_time_frame(results, runs: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per run that profiled a window (core/record.RunResult.profile), with the mean
    step of that run's measured phase beside it where the engine counted its steps (`runs`, the
    runs frame: wall / engine steps, prefill steps included): a profiled step much slower than
    a measured one (no prefill in it) was slowed by the profiler."""
    rows = []
    for r in results:
        p = r.profile
        if p is None:
            continue
        split = p.split
        row = {
            **{k: getattr(r, k) for k in KEYS},
            "run": r.run,
            "users": r.job.cell.users,
            "status": p.status,
            "error": p.error,
            "device": split.device if split else None,
            "steps": split.steps if split else None,
            "prefill_steps": split.prefill_steps if split else None,
            "step_ms": split.step_ms if split else None,
            **{c: getattr(split, c) if split else None for c in CLASS_MS},
            "kernels": split.kernels if split else None,
            "profile_s": p.seconds,
            "top_kernels": "; ".join(
                f"{cls}: {name[:60]} ({ms:.3g} ms)"
                for cls, named in (split.top if split else {}).items()
                for name, ms in named[:1]
            )
            or None,
        }
        rows.append(row)
    measured = {}
    if runs is not None and runs.height and "engine_steps" in runs.columns:
        for m in runs.iter_rows(named=True):
            if m.get("engine_steps") and m.get("wall_s"):
                measured[tuple(m[k] for k in (*KEYS, "run"))] = 1e3 * m["wall_s"] / m["engine_steps"]
    for row in rows:
        ms = measured.get(tuple(row[k] for k in (*KEYS, "run")))
        row["measured_step_ms"] = ms
        row["profiled_over_measured"] = row["step_ms"] / ms if ms and row["step_ms"] else None
    schema = {
        **dict.fromkeys(KEYS, pl.Utf8),
        "run": pl.Int64,
        "users": pl.Int64,
        "status": pl.Utf8,
        "error": pl.Utf8,
        "device": pl.Utf8,
        "steps": pl.Int64,
        "prefill_steps": pl.Int64,
        "step_ms": pl.Float64,
        **dict.fromkeys(CLASS_MS, pl.Float64),
        "kernels": pl.Int64,
        "profile_s": pl.Float64,
        "top_kernels": pl.Utf8,
        "measured_step_ms": pl.Float64,
        "profiled_over_measured": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def step_time_changes(frame: pl.DataFrame, chains: dict[str, list[str]]) -> pl.DataFrame:
    """Each chain step whose two stacks were profiled at the same cell: the step's ms on each
    side and each class's delta (to - from); the deltas sum to the step's delta exactly."""
    ok = frame.filter(pl.col("status") == "ok")
    by = {(r["model"], r["stack"], r["topology"], r["cell"]): r for r in ok.iter_rows(named=True)}
    rows = []
    for chain, members in chains.items():
        for pos, (a, b) in enumerate(zip(members, members[1:]), start=1):
            for (model, stack, topology, cell), fr in by.items():
                to = by.get((model, b, topology, cell))
                if stack != a or to is None:
                    continue
                delta = to["step_ms"] - fr["step_ms"]
                rows.append(
                    {
                        "chain": chain,
                        "position": pos,
                        "step": f"{a} → {b}",
                        "model": model,
                        "topology": topology,
                        "cell": cell,
                        "users": fr["users"],
                        "device": fr["device"],
                        "from_step_ms": fr["step_ms"],
                        "to_step_ms": to["step_ms"],
                        "step_speedup": fr["step_ms"] / to["step_ms"] if to["step_ms"] else None,
                        "from_measured_step_ms": fr["measured_step_ms"],
                        "to_measured_step_ms": to["measured_step_ms"],
                        "from_profiled_over_measured": fr["profiled_over_measured"],
                        "to_profiled_over_measured": to["profiled_over_measured"],
                        "delta_ms": delta,
                        **{f"{c}_delta_ms": to[f"{c}_ms"] - fr[f"{c}_ms"] for c in CLASSES},
                    }
                )
    schema = {
        "chain": pl.Utf8,
        "position": pl.Int64,
        "step": pl.Utf8,
        "model": pl.Utf8,
        "topology": pl.Utf8,
        "cell": pl.Utf8,
        "users": pl.Int64,
        "device": pl.Utf8,
        "from_step_ms": pl.Float64,
        "to_step_ms": pl.Float64,
        "step_speedup": pl.Float64,
        "from_measured_step_ms": pl.Float64,
        "to_measured_step_ms": pl.Float64,
        "from_profiled_over_measured": pl.Float64,
        "to_profiled_over_measured": pl.Float64,
        "delta_ms": pl.Float64,
        **{f"{c}_delta_ms": pl.Float64 for c in CLASSES},
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def sentence(row: dict) -> str:
    """A chain step's change of decode step in words, never more than the split shows: e.g.
    'decode step 9.2 -> 10.8 ms (18% slower): quantized GEMM +1.6 ms, dense GEMM -0.2 ms;
    attention unchanged'."""
    a, b = row["from_step_ms"], row["to_step_ms"]
    change = (b - a) / a if a else 0.0
    how = f"{abs(change):.0%} {'slower' if change > 0 else 'faster'}" if abs(change) >= 0.005 else "unchanged"
    unit = "op" if row["device"] == "cpu" else "kernel"
    moved, still = [], []
    scale = max(abs(row[f"{c}_delta_ms"]) for c in CLASSES) or 1.0
    for c in sorted(CLASSES, key=lambda c: -abs(row[f"{c}_delta_ms"])):
        d = row[f"{c}_delta_ms"]
        if abs(d) >= UNCHANGED_SHARE * max(scale, abs(b - a)):
            name = "outside any op" if (c == "idle" and row["device"] == "cpu") else NAMES[c]
            moved.append(f"{name} {d:+.3g} ms")
        elif c in ("attention", "quantized_gemm", "dense_gemm"):
            still.append(NAMES[c])
    where = "on the CPU, by op" if row["device"] == "cpu" else f"by {unit} class"
    text = f"decode step {a:.3g} → {b:.3g} ms ({how}; {where}): " + ", ".join(moved[:4])
    text += f"; {', '.join(still)} unchanged" if still else ""
    ma, mb = row.get("from_measured_step_ms"), row.get("to_measured_step_ms")
    if ma and mb:  # the measured phase's steps, prefill included: what the profile leaves out
        text += f"; the measured phase's steps (prefill in them) {ma:.3g} → {mb:.3g} ms"
        slowed = [
            (side, r)
            for side, r in (
                ("from", row.get("from_profiled_over_measured")),
                ("to", row.get("to_profiled_over_measured")),
            )
            if r and r > 1 + PROFILER_SLOWED
        ]
        if slowed:
            said = ", ".join(
                f"{row['step'].split(' → ')[0 if side == 'from' else 1]}'s {r - 1:.0%}" for side, r in slowed
            )
            text += f" (the profiler slowed {said} beyond them: idle there is partly the profiler's)"
    return text


def by_chain(changes: pl.DataFrame) -> dict[tuple, str]:
    """Each chain's kernel-level why per (chain, model, topology, cell), its steps joined in
    order: 'vllm-fp16 → vllm-marlin: decode step ...' (answer.beside puts it in the answer)."""
    said: dict[tuple, list[str]] = {}
    for r in changes.sort("position").iter_rows(named=True):
        said.setdefault((r["chain"], r["model"], r["topology"], r["cell"]), []).append(f"{r['step']}: {sentence(r)}")
    return {k: " | ".join(v) for k, v in said.items()}
