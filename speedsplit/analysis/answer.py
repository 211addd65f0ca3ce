"""The answer first: for each chain at its headline cells, the decomposition in one sentence
with intervals, the waterfall that draws it (bars that add on a log axis to the total), and the
flags that qualify it. Pure functions over the attribution and runs frames.
"""

from __future__ import annotations

import math

import polars as pl

from speedsplit.analysis.frames import clean_runs, OPEN_LOOP
from speedsplit.analysis.traffic import NO_DIFFERENCE
from speedsplit.core.formats import value_text
from speedsplit.core.record import CLIENT_STALL_S

GROUP = ["chain", "model", "topology", "cell"]
SENTENCE_SCHEMA = {
    **{k: pl.Utf8 for k in GROUP},
    "users": pl.Int64,
    "sentence": pl.Utf8,
    "why": pl.Utf8,
    "quality": pl.Utf8,
}


def with_steps(attribution: pl.DataFrame, steps: dict[str, list[str]]) -> pl.DataFrame:
    """Adds `step`: what the factor's step changes, in words (grid.chain_steps); 'total'
    for the total row."""

    def label(chain: str, position: int) -> str:
        if position == 0:
            return "total"
        named = steps.get(chain) or []
        return named[position - 1] if position <= len(named) else ""

    labels = [label(c, p) for c, p in zip(attribution["chain"].to_list(), attribution["position"].to_list())]
    return attribution.with_columns(pl.Series("step", labels, dtype=pl.Utf8))


def with_headline(attribution: pl.DataFrame, headline: list[dict]) -> pl.DataFrame:
    """Adds `headline`: whether the row's cell is one the first screen answers for. The
    configured cells ({users, workload[, sampling]}), else for each (chain, model, topology,
    workload, sampling) of the closed loop the cell with the most users (an open-loop cell's
    throughput follows its offered rate: the traffic block answers for those)."""
    if not attribution.height:
        return attribution.with_columns(pl.lit(False).alias("headline"))
    if headline:
        hit = pl.lit(False)
        for h in headline:
            one = (pl.col("users") == h["users"]) & (pl.col("workload") == h["workload"])
            if "sampling" in h:
                one = one & (pl.col("sampling") == h["sampling"])
            hit = hit | one
        return attribution.with_columns(hit.alias("headline"))
    most = pl.col("users").max().over(["chain", "model", "topology", "workload", "sampling"])
    closed = ~OPEN_LOOP  # open-loop cells answer under traffic (analysis/traffic.py)
    return attribution.with_columns(((pl.col("users") == most) & closed).alias("headline"))


def _x(v: float | None) -> str:
    return f"{value_text(v, 3)}×"


def interval_words(lo: float | None, hi: float | None) -> str:
    """The interval, and where it holds 1 that it shows no difference (a factor of 1.11x
    [0.81, 1.42] is not an answer that the step speeds anything up)."""
    if lo is None or hi is None:
        return "[no interval: one run]"
    return f"[{value_text(lo, 3)}, {value_text(hi, 3)}]" + (f" ({NO_DIFFERENCE})" if lo <= 1 <= hi else "")


def _over(counts: list[int], said: str) -> str:
    """What the sentence's intervals rest on (each stack's clean runs, in chain order), and
    what its words mean, in a closing bracket."""
    if not any(counts):
        return ""
    if max(counts) <= 1:  # one run a stack: no spread to make an interval of
        return " (one run a stack: no interval; set grid.runs to 2 or more for one)"
    each = f"{counts[0]} runs a stack" if len(set(counts)) == 1 else f"{', '.join(map(str, counts))} runs of its stacks"
    meaning = f"; {NO_DIFFERENCE}: the interval holds 1" if NO_DIFFERENCE in said else ""
    if "[no interval" in said:  # a stack of one run gives the factors beside it none
        return f" (over {each}: a factor with one run on a side has no interval{meaning})"
    return f" (95% intervals over {each}{meaning})"


# A stack's clean runs at a headline cell further apart than this (max / min) are said on the
# first screen: two runs 2.3x apart make an interval as wide as that, whatever the factor.
SPREAD = 1.25
# How far the host's own speed may move across a run's load (measuring/hostspeed.py) before the
# spread line says the machine changed under the runs
HOST_MOVED = 1.10


def unmeasured(note: str | None) -> list[str]:
    """The stacks an undefined factor's note says were not measured, if that is all it says
    (else empty: a stack was measured but no run of it counted)."""
    missing = [c.split(": ", 1) for c in (note or "").split("; ") if ": " in c]
    if not missing or any(why != "not measured" for _, why in missing):
        return []
    return [stack for stack, _ in missing]


def _on_cpu(cells: pl.DataFrame | None) -> dict[tuple, str]:
    """' (on the CPU: CPUWNA16LinearKernel)' by (model, stack, topology, cell), for the stacks that
    ran on a CPU and reported their linear kernel: a step named for a GPU kernel (Marlin) ran
    another there."""
    if cells is None or not cells.height:
        return {}
    return {
        (r["model"], r["stack"], r["topology"], r["cell"]): f" (on the CPU: {', '.join(r['linear_kernel'])})"
        for r in cells.iter_rows(named=True)
        if r["platform"] == "cpu" and r["linear_kernel"]
    }


def _runs_ok(cells: pl.DataFrame | None) -> dict[tuple, int]:
    """Each stack's clean runs at each cell (the cells table's runs_ok), by (model, stack, topology, cell)."""
    if cells is None or not cells.height or "runs_ok" not in cells.columns:
        return {}
    return {(r["model"], r["stack"], r["topology"], r["cell"]): r["runs_ok"] for r in cells.iter_rows(named=True)}


def _runs_each(total: dict, chain: list[str], used: dict[tuple, int]) -> list[int]:
    """The clean runs of each stack of the chain behind a sentence; without the cells table, the
    total's runs spread evenly (what the attribution alone can say)."""
    keys = [(total["model"], s, total["topology"], total["cell"]) for s in chain]
    if all(k in used for k in keys):
        return [used[k] for k in keys]
    n = total["runs_used"] or 0
    return [n // len(chain)] * len(chain)


def sentences(
    attribution: pl.DataFrame, chains: dict[str, list[str]], cells: pl.DataFrame | None = None
) -> pl.DataFrame:
    """One sentence per (chain, model, topology, headline cell), e.g. 'study (hf-fp16 -> vllm-
    fp16 -> vllm-marlin) at 64 users x 512 in / 256 out tokens, greedy (llama-3.1-8b, tp1):
    runtime 11.4x [11.2, 11.5] x INT4 weights + kernel 0.844x [0.839, 0.849] = 9.61x [9.49,
    9.73] (95% intervals over 2 runs a stack).' (with the arrow and multiplication signs). cells:
    where a step's stack ran on a CPU, its name says which kernel ran there."""
    rows = []
    kernel = _on_cpu(cells)
    used = _runs_ok(cells)

    def named(r: dict) -> str:
        to = r["factor"].split("/")[0]
        return (r["step"] or r["factor"]) + kernel.get((r["model"], to, r["topology"], r["cell"]), "")

    if not attribution.height:
        return pl.DataFrame(schema=SENTENCE_SCHEMA)
    order = {name: i for i, name in enumerate(chains)}
    head = attribution.filter(pl.col("headline")).sort(
        pl.col("chain").replace_strict(order, default=len(order)), maintain_order=True
    )
    for key, df in head.group_by(GROUP, maintain_order=True):
        chain, model, topology, cell = key
        first = df.row(0, named=True)
        where = (
            f"{chain} ({' → '.join(chains[chain])}) at {first['users']} users × "
            f"{first['prompt_tokens']} in / {first['output_tokens']} out tokens, {first['sampling']} ({model}, {topology})"
        )
        factors = df.filter(pl.col("position") > 0).sort("position")
        total = df.filter(pl.col("position") == 0).row(0, named=True)
        if total["value"] is None:
            if unmeasured(total["note"]):
                continue  # a chain these results do not cover: one line among the qualifiers
            known = [
                f"{named(r)} {_x(r['value'])} {interval_words(r['lo'], r['hi'])}"
                for r in factors.iter_rows(named=True)
                if r["value"] is not None
            ]
            why = total["note"] or "a stack has no clean run"
            text = (
                f"{where}: partial, {'; '.join(known)} measured; no total ({why})."
                if known
                else f"{where}: not decomposable, {why}."
            )
        else:
            parts = [
                f"{named(r)} {_x(r['value'])} {interval_words(r['lo'], r['hi'])}" for r in factors.iter_rows(named=True)
            ]
            text = f"{where}: {' × '.join(parts)} = {_x(total['value'])} {interval_words(total['lo'], total['hi'])}"
            text += _over(_runs_each(total, chains[chain], used), text) + "."
        rows.append(
            {
                "chain": chain,
                "model": model,
                "topology": topology,
                "cell": cell,
                "users": first["users"],
                "sentence": text,
            }
        )
    return pl.DataFrame(rows, schema=SENTENCE_SCHEMA)


def with_why(sentences: pl.DataFrame, mechanism: pl.DataFrame, attribution: pl.DataFrame) -> pl.DataFrame:
    """The answer's sentences with each step's client-level mechanism beside them (analysis/
    mechanism.why_words: how much quicker its requests were, which part of their latency moved,
    how many were in flight), e.g. 'runtime: requests 11.8× quicker end to end (...) | ...';
    null where no step has one."""
    from speedsplit.analysis.mechanism import why_words

    keys = ["chain", "model", "topology", "cell"]
    named = {
        (*(r[k] for k in keys), r["position"]): r["step"] or r["factor"]
        for r in attribution.filter(pl.col("position") > 0).iter_rows(named=True)
    }
    said: dict[tuple, list[str]] = {}
    for r in mechanism.sort("position").iter_rows(named=True):
        words = why_words(r)
        if words:
            key = tuple(r[k] for k in keys)
            said.setdefault(key, []).append(f"{named.get((*key, r['position']), r['factor'])}: {words}")
    why = [" | ".join(said.get(tuple(r[k] for k in keys), [])) or None for r in sentences.iter_rows(named=True)]
    return sentences.with_columns(pl.Series("why", why, dtype=pl.Utf8))


def beside(sentences: pl.DataFrame, column: str, said: dict[tuple, str], keys: list[str]) -> pl.DataFrame:
    """The answer's sentences with another analysis's line beside each, looked up by `keys`
    (quality by model, topology and chain: output/analyses/quality.by_chain; cost by chain,
    model, topology and cell: analysis/cost.by_chain); null where it has none."""
    line = [said.get(tuple(r[k] for k in keys)) for r in sentences.iter_rows(named=True)]
    return sentences.with_columns(pl.Series(column, line, dtype=pl.Utf8))


def waterfall_frame(attribution: pl.DataFrame) -> pl.DataFrame:
    """The bars of each headline decomposition on a log axis: factor i runs from the product of
    the factors before it to the product including it; the total bar runs from 1 to the total.
    So the factor bars' log lengths add up to the total bar's (exactly: the factors multiply to
    the total). Only decompositions with every factor defined."""
    rows = []
    if not attribution.height:
        return pl.DataFrame()
    head = attribution.filter(pl.col("headline"))
    for key, df in head.group_by(GROUP, maintain_order=True):
        factors = df.filter(pl.col("position") > 0).sort("position")
        total = df.filter(pl.col("position") == 0).row(0, named=True)
        if total["value"] is None or factors["value"].null_count():
            continue
        base = dict(zip(GROUP, key)) | {"workload": total["workload"], "users": total["users"]}
        level = 1.0
        for r in factors.iter_rows(named=True):
            rows.append(
                base
                | {
                    "order": r["position"],
                    "bar": f"{r['position']}. {r['step'] or r['factor']}",
                    "factor": r["factor"],
                    "start": level,
                    "end": level * r["value"],
                    "value": r["value"],
                    "lo": r["lo"],
                    "hi": r["hi"],
                    "direction": "speeds up" if r["value"] >= 1 else "slows down",
                }
            )
            level *= r["value"]
        rows.append(
            base
            | {
                "order": len(factors) + 1,
                "bar": "= total",
                "factor": "total",
                "start": 1.0,
                "end": total["value"],
                "value": total["value"],
                "lo": total["lo"],
                "hi": total["hi"],
                "direction": "total",
            }
        )
    return pl.DataFrame(rows)


def log_lengths(waterfall: pl.DataFrame) -> pl.DataFrame:
    """Per decomposition: the factor bars' summed log length and the total bar's (equal)."""
    return (
        waterfall.with_columns((pl.col("end").log() - pl.col("start").log()).alias("log_len"))
        .group_by(GROUP, maintain_order=True)
        .agg(
            pl.col("log_len").filter(pl.col("factor") != "total").sum().alias("factors"),
            pl.col("log_len").filter(pl.col("factor") == "total").sum().alias("total"),
        )
    )


def spread_line(runs: pl.DataFrame, head: pl.DataFrame) -> str | None:
    """The stacks whose clean runs at a headline cell disagree by more than SPREAD, with their
    range: what an interval from so few runs rests on."""
    cells = set(head["cell"].to_list())
    wide, moved = [], []
    keys = ["model", "topology", "stack", "cell"]  # one stack's runs of one cell (never pooled across models)
    for (_, _, stack, cell), df in runs.filter(pl.col("cell").is_in(cells)).group_by(keys, maintain_order=True):
        ok, _ = clean_runs(df)
        tok_s = [v for v in ok["output_tok_s"].to_list() if v]
        if len(tok_s) > 1 and max(tok_s) > SPREAD * min(tok_s):
            wide.append(
                f"{stack} at {cell} {value_text(min(tok_s), 4)}-{value_text(max(tok_s), 4)} tok/s "
                f"({value_text(max(tok_s) / min(tok_s), 3)}×)"
            )
            moved += [m for m in ok["host_speed_moved"].to_list() if m is not None]
    if not wide:
        return None
    line = (
        f"Runs of {len(wide)} stack(s) disagree by more than {SPREAD - 1:.0%} (run-to-run spread; "
        f"their factors' intervals are as wide as that): {'; '.join(sorted(wide))}"
    )
    return line + host_speed_text(moved)


def host_speed_text(moved: list[float]) -> str:
    """What the host's own speed did across the loads of runs that disagree (empty: not timed)."""
    if not moved:
        return ""
    most = max(moved)
    if most >= HOST_MOVED:
        return (
            f". The host's own speed moved up to {value_text(most, 3)}× across their loads (a fixed piece of "
            "work timed on the client's core before and after each): the machine changed under them"
        )
    return (
        f". The host's own speed was within {HOST_MOVED - 1:.0%} before and after each of their loads (a fixed "
        "piece of work timed on the client's core; a change within a load is not seen)"
    )


def qualifiers(runs: pl.DataFrame, attribution: pl.DataFrame) -> list[str]:
    """The flags that qualify the headline numbers, one line each: runs left out of them,
    kernels other than the one asked for, measured phases shorter than the minimum, failed
    requests, servers that never served. Empty when nothing qualifies them."""
    out = []
    head = attribution.filter(pl.col("headline")) if attribution.height else attribution
    if head.height:
        excluded = sorted({w for ws in head["excluded"].to_list() for w in ws})
        if excluded:
            out.append(f"Left out of the headline numbers ({len(excluded)}): " + "; ".join(excluded))
        if spread := spread_line(runs, head):
            out.append(spread)
        undefined = head.filter(pl.col("value").is_null() & (pl.col("position") == 0))
        not_covered: dict[str, tuple[set, int]] = {}
        for r in undefined.iter_rows(named=True):
            if stacks := unmeasured(r["note"]):
                seen, n = not_covered.get(r["chain"], (set(), 0))
                not_covered[r["chain"]] = (seen | set(stacks), n + 1)
            else:
                out.append(
                    f"Not decomposable: chain {r['chain']} at {r['cell']} ({r['model']}, {r['topology']}): {r['note']}"
                )
        for chain, (stacks, n) in not_covered.items():
            out.append(
                f"Chain {chain} is not decomposed at {n} headline cell(s): {', '.join(sorted(stacks))} not measured here"
            )
    if runs.height:
        for flag, what in (
            ("kernel_mismatch", "ran another kernel than the one asked for"),
            ("short_measurement", "measured for less than benchmark.min_measured_s"),
            ("request_failures", "had failed requests"),
            ("usage_mismatch", "had requests whose usage reported other tokens than the stream carried"),
            (
                "latency_outlier",
                "had a request far slower than its length predicts (a stall below stall_timeout_s: "
                "benchmark.outlier_factor)",
            ),
            ("client_lag", "fell behind their arrival schedule (the client, not the server)"),
            (
                "client_stalled",
                f"had a client whose event loop did not run for over {CLIENT_STALL_S:g} s in the measured phase "
                "(off the CPUs: its timestamps may be that late)",
            ),
            (
                "implausible",
                "hold numbers no measurement makes (a negative one, a rate its tokens and wall time do not give, "
                "more than the client's calibrated ceiling), left out of every factor (`speedsplit failed` gives "
                "each reason)",
            ),
            (
                "over_memory_cap",
                "held more than the memory cap (a KV cache above the engine's fit, or the card's peak above the cap: stacks.*.kv_cache_gib)",
            ),
        ):
            hit = runs.filter(pl.col("flags").list.contains(flag))
            if hit.height:
                names = sorted({f"{r['stack']} {r['cell']} run{r['run']}" for r in hit.iter_rows(named=True)})
                kernels = ""
                if flag == "kernel_mismatch":
                    got = sorted({f"{r['stack']}: {r['linear_kernel']}" for r in hit.iter_rows(named=True)})
                    kernels = f" (reported: {', '.join(got)})"
                out.append(
                    f"{hit.height} run(s) {what}{kernels}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
                )
        skipped = runs.filter(pl.col("status") == "skipped")
        if skipped.height:
            per_stack = skipped.group_by("stack", maintain_order=True).agg(
                pl.col("users").unique().sort(), pl.col("rate_rps").unique().sort()
            )
            levels = "; ".join(
                f"{r['stack']}: {', '.join(f'{x:g}' for x in r['rate_rps'] if x is not None)} req/s"
                if any(x is not None for x in r["rate_rps"])
                else f"{r['stack']}: {', '.join(map(str, r['users']))} users"
                for r in per_stack.to_dicts()
            )
            out.append(f"{skipped.height} capacity level(s) not measured, past the cliff (skipped): {levels}")
        failed = runs.filter(~pl.col("status").is_in(["ok", "skipped"]))
        if failed.height:
            names = sorted(
                {f"{r['stack']} {r['cell']} run{r['run']} ({r['status']})" for r in failed.iter_rows(named=True)}
            )
            out.append(
                f"{failed.height} run(s) did not complete: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
            )
    return out


def check_adds_up(waterfall: pl.DataFrame, rel: float = 1e-9) -> None:
    """Raises if a waterfall's factor bars do not add up (log axis) to its total bar."""
    for r in log_lengths(waterfall).iter_rows(named=True):
        if not math.isclose(r["factors"], r["total"], rel_tol=rel, abs_tol=1e-12):
            raise AssertionError(
                f"waterfall of {r['chain']} at {r['cell']}: factors {r['factors']} != total {r['total']}"
            )
