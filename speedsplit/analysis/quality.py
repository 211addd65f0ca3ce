"""Quality beside speed: what each step of a chain costs in what the model says, set beside what
it gains in throughput, from the quality records of the stacks' results (core/quality.py).

Per stack (`quality_stacks`): what it serves (token ids, logprobs, prompt logprobs) and its
perplexity on the held-out windows, with a 95% t interval over windows. Per chain step
(`quality`), the step's stack against the one before it on the same prompts:
- agreement: the share of greedy continuations that match in full (Wilson interval) and the
  mean position of the first difference (t interval over prompts; the length where none),
  compared by the servers' token ids where both serve them, else by the texts re-tokenized;
- next-token agreement: the share of held-out positions whose top token is the same (t over
  windows), where both serve top logprobs;
- the perplexity ratio: exp of the mean difference in negative log-likelihood per token,
  paired window by window (t interval over windows, on the log scale);
- the step's throughput factor at the chain's headline cell, and the gate: the step's stack's
  quality as a share of the chain's reference (its first stack that serves perplexity):
  reference perplexity / its perplexity, or where there is none, its agreement in full with
  the reference; at least `quality.gate` passes.
On random or dummy weights every row says that its figures say nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import polars as pl

from speedsplit.analysis.run_estimates import LEVEL, t_quantile
from speedsplit.core.quality import QualityRecord

STACK_SCHEMA = {
    "model": pl.String,
    "topology": pl.String,
    "stack": pl.String,
    "weights": pl.String,
    "status": pl.String,
    "serves_token_ids": pl.String,
    "serves_logprobs": pl.String,
    "serves_prompt_logprobs": pl.String,
    "continuations": pl.Int64,
    "windows": pl.Int64,
    "tokens_scored": pl.Int64,
    "perplexity": pl.Float64,
    "perplexity_lo": pl.Float64,
    "perplexity_hi": pl.Float64,
    "probe_s": pl.Float64,
    "text": pl.String,
    "note": pl.String,
}

# what names a chain step, first in every per-step table (quality, quality_tasks)
STEP_KEYS = {
    "model": pl.String,
    "topology": pl.String,
    "chain": pl.String,
    "position": pl.Int64,
    "step": pl.String,
    "from_stack": pl.String,
    "to_stack": pl.String,
}

STEP_SCHEMA = STEP_KEYS | {
    "speed_factor": pl.Float64,
    "speed_factor_lo": pl.Float64,
    "speed_factor_hi": pl.Float64,
    "same_weights": pl.Boolean,
    "compared_by": pl.String,
    "prompts": pl.Int64,
    "agree": pl.Int64,
    "agreement": pl.Float64,
    "agreement_lo": pl.Float64,
    "agreement_hi": pl.Float64,
    "first_divergence": pl.Float64,
    "first_divergence_lo": pl.Float64,
    "first_divergence_hi": pl.Float64,
    "output_tokens": pl.Int64,
    "next_token_agreement": pl.Float64,
    "next_token_agreement_lo": pl.Float64,
    "next_token_agreement_hi": pl.Float64,
    "perplexity_ratio": pl.Float64,
    "perplexity_ratio_lo": pl.Float64,
    "perplexity_ratio_hi": pl.Float64,
    "reference": pl.String,
    "gate_basis": pl.String,
    "quality_share": pl.Float64,
    "gate": pl.Float64,
    "passes": pl.Boolean,
    "lossless": pl.Boolean,
    "note": pl.String,
}

RANDOM_NOTE = "random weights: these quality figures say nothing about a trained model"
Z95 = 1.959963984540054


def mean_t(values: list[float], low: float = -math.inf, high: float = math.inf):
    """The mean and its 95% Student t interval (none from one value), the interval clamped to
    [low, high] (a share's to [0, 1])."""
    if not values:
        return None, None, None
    n, m = len(values), math.fsum(values) / len(values)
    if n < 2:
        return m, None, None
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + LEVEL / 2, n - 1) * sd / math.sqrt(n)
    return m, max(low, m - half), min(high, m + half)


def wilson(k: int, n: int) -> tuple[float | None, float | None, float | None]:
    """A share k/n and its 95% Wilson score interval."""
    if not n:
        return None, None, None
    p = k / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def _exp(t: tuple) -> tuple:
    return tuple(None if v is None else math.exp(v) for v in t)


def _nll_windows(rec: QualityRecord) -> dict[int, tuple[list[int] | None, list[float]]]:
    """Each scored window's token ids and per-token negative log-likelihoods."""
    return {w.window: (w.ids, [-x for x in w.logprobs]) for w in rec.windows if w.logprobs}


def perplexity(rec: QualityRecord) -> tuple[float | None, float | None, float | None, int, int]:
    """Perplexity over every scored token, its interval (t over windows' mean NLL), windows, tokens."""
    wins = _nll_windows(rec)
    nll = [x for _, v in wins.values() for x in v]
    if not nll:
        return None, None, None, 0, 0
    _, lo, hi = mean_t([math.fsum(v) / len(v) for _, v in wins.values() if v])
    value = math.exp(math.fsum(nll) / len(nll))
    return value, *_exp((lo, hi)), len(wins), len(nll)


def unlike(a: QualityRecord, b: QualityRecord) -> str | None:
    """Why two records cannot be set side by side (another text or probe), or None."""
    if a.text_sha256 != b.text_sha256:
        return f"not comparable: another held-out text ({a.text_sha256 or 'none'} against {b.text_sha256 or 'none'})"
    if a.probe != b.probe:
        return "not comparable: another quality probe (config quality)"
    return None


def compare_outputs(a: QualityRecord, b: QualityRecord) -> dict:
    """Greedy continuations of the same prompts, compared token by token."""
    if unlike(a, b):
        return {"prompts": 0}
    by_prompt = {o.prompt: o for o in b.outputs if not o.error}
    pairs = [(o, by_prompt[o.prompt]) for o in a.outputs if not o.error and o.prompt in by_prompt]
    if not pairs:
        return {"prompts": 0}
    ids = all(x.ids is not None and y.ids is not None for x, y in pairs)
    firsts, lengths = [], []
    for x, y in pairs:
        sx, sy = (x.ids, y.ids) if ids else (x.text_ids, y.text_ids)
        firsts.append(next((i for i, (p, q) in enumerate(zip(sx, sy)) if p != q), min(len(sx), len(sy))))
        lengths.append(max(len(sx), len(sy)))
    agree = sum(f >= length for f, length in zip(firsts, lengths))
    share, lo, hi = wilson(agree, len(pairs))
    div, dlo, dhi = mean_t([float(f) for f in firsts], 0.0, float(max(lengths)))
    return {
        "compared_by": "token ids" if ids else "texts re-tokenized",
        "prompts": len(pairs),
        "agree": agree,
        "agreement": share,
        "agreement_lo": lo,
        "agreement_hi": hi,
        "first_divergence": div,
        "first_divergence_lo": dlo,
        "first_divergence_hi": dhi,
        "output_tokens": max(lengths),
    }


def next_token_agreement(a: QualityRecord, b: QualityRecord) -> tuple[float | None, float | None, float | None]:
    """The share of held-out positions whose top token both stacks name alike: the mean of the
    windows' shares, with its t interval over windows (clamped to [0, 1])."""
    if unlike(a, b):
        return None, None, None
    tops_b = {w.window: w for w in b.windows if w.top}
    shares = []
    for w in a.windows:
        v = tops_b.get(w.window)
        if not w.top or v is None or w.ids != v.ids:
            continue
        same = [max(x, key=x.get) == max(y, key=y.get) for x, y in zip(w.top, v.top) if x and y]
        if same:
            shares.append(sum(same) / len(same))
    return mean_t(shares, 0.0, 1.0)


def perplexity_ratio(a: QualityRecord, b: QualityRecord) -> tuple[float | None, float | None, float | None]:
    """b's perplexity over a's on the windows both scored alike (the same tokens): exp of the
    mean NLL difference per token, its interval paired window by window."""
    if unlike(a, b):
        return None, None, None
    wa, wb = _nll_windows(a), _nll_windows(b)
    diffs, per_window = [], []
    for k, (ids, na) in wa.items():
        if k not in wb or wb[k][0] != ids or len(wb[k][1]) != len(na):
            continue
        d = [y - x for x, y in zip(na, wb[k][1])]
        diffs += d
        per_window.append(math.fsum(d) / len(d))
    if not diffs:
        return None, None, None
    _, lo, hi = mean_t(per_window)
    return math.exp(math.fsum(diffs) / len(diffs)), *_exp((lo, hi))


def _weights_note(weights: str | None) -> str:
    return RANDOM_NOTE if weights in ("random", "dummy") else ""


def stacks_frame(records: dict[tuple[str, str, str], tuple[QualityRecord, str | None]]) -> pl.DataFrame:
    rows = []
    for (model, topology, stack), (rec, weights) in sorted(records.items()):
        ppl, lo, hi, wins, tokens = perplexity(rec)
        rows.append(
            {
                "model": model,
                "topology": topology,
                "stack": stack,
                "weights": weights,
                "status": rec.status,
                "serves_token_ids": rec.serves.get("token_ids"),
                "serves_logprobs": rec.serves.get("logprobs"),
                "serves_prompt_logprobs": rec.serves.get("prompt_logprobs"),
                "continuations": sum(1 for o in rec.outputs if not o.error),
                "windows": wins,
                "tokens_scored": tokens,
                "perplexity": ppl,
                "perplexity_lo": lo,
                "perplexity_hi": hi,
                "probe_s": rec.seconds,
                "text": rec.text,
                "note": "; ".join(n for n in (rec.error or "", _weights_note(weights)) if n),
            }
        )
    return pl.DataFrame(rows, schema=STACK_SCHEMA)


def _speed(attribution: pl.DataFrame | None, chain: str, model: str, topology: str, position: int) -> dict:
    """The step's throughput factor at its chain's headline cell."""
    if attribution is None or not attribution.height:
        return {}
    row = attribution.filter(
        (pl.col("chain") == chain)
        & (pl.col("model") == model)
        & (pl.col("topology") == topology)
        & (pl.col("position") == position)
        & pl.col("headline")
    )
    if not row.height:
        return {}
    r = row.row(0, named=True)
    return {"step": r["step"], "speed_factor": r["value"], "speed_factor_lo": r["lo"], "speed_factor_hi": r["hi"]}


def steps_frame(
    records: dict[tuple[str, str, str], tuple[QualityRecord, str | None]],
    chains: dict[str, list[str]],
    steps: dict[str, list[str]],
    attribution: pl.DataFrame | None,
    gate: float,
    variants: dict[tuple[str, str, str], str] | None = None,
    lossless: Collection[str] = (),
) -> pl.DataFrame:
    """One row per chain step whose two stacks were probed; `variants` (each stack's weights:
    fp16, gptq ...) tells the steps that keep the weights and change only what serves them; a
    step to a `lossless` stack (speculative decoding) is judged by its greedy continuations
    (_lossless)."""
    variants = variants or {}
    rows = []
    for model, topology in sorted({(m, t) for m, t, _ in records}):
        rec = {s: v for (m, t, s), v in records.items() if (m, t) == (model, topology)}
        for chain, members in chains.items():
            ref = next((s for s in members if s in rec and perplexity(rec[s][0])[0] is not None), None)
            for i in range(1, len(members)):
                a, b = members[i - 1], members[i]
                if a not in rec and b not in rec:
                    continue  # a chain these results do not cover
                row = {
                    "model": model,
                    "topology": topology,
                    "chain": chain,
                    "position": i,
                    "from_stack": a,
                    "to_stack": b,
                    "same_weights": _same(variants, (model, topology, a), (model, topology, b)),
                    **_speed(attribution, chain, model, topology, i),
                    "gate": gate,
                }
                if not row.get("step"):  # no factor for the step (attribution's names it): the chain's own name
                    names = steps.get(chain) or []
                    row["step"] = names[i - 1] if i - 1 < len(names) else None
                missing = [s for s in (a, b) if s not in rec or rec[s][0].status != "ok"]
                if missing:
                    why = [rec[s][0].error if s in rec else "no result carried its quality probe" for s in missing]
                    row["note"] = "; ".join(f"no quality of {s}: {w}" for s, w in zip(missing, why))
                    rows.append(row)
                    continue
                (ra, _), (rb, weights) = rec[a], rec[b]
                row |= compare_outputs(ra, rb)
                row["note"] = "; ".join(n for n in (unlike(ra, rb), _weights_note(weights)) if n)
                row["next_token_agreement"], row["next_token_agreement_lo"], row["next_token_agreement_hi"] = (
                    next_token_agreement(ra, rb)
                )
                ratio = perplexity_ratio(ra, rb)
                row["perplexity_ratio"], row["perplexity_ratio_lo"], row["perplexity_ratio_hi"] = ratio
                row |= _gate(rec, ref, members[0], b, gate)
                if b in lossless and row.get("prompts"):  # greedy speculative decoding changes no token
                    row |= _lossless(row, _gate(rec, ref, members[0], a, gate), a, gate)
                rows.append(row)
    return pl.DataFrame(rows, schema=STEP_SCHEMA)


def _lossless(row: dict, before: dict, a: str, gate: float) -> dict:
    """A step to a lossless stack (speculative decoding) judged by what lossless means: every
    greedy continuation token for token the stack before's, so its quality is that stack's
    (`before`, that stack's own gate). Its prompt scores do not judge it: a server whose
    answers are the step before's while its prompt logprobs put the same weights' perplexity
    elsewhere serves wrong prompt logprobs, which the note says (the ratio stays as measured)."""
    differ = row["prompts"] - row["agree"]
    if differ:
        said = f"NOT LOSSLESS: {differ} of {row['prompts']} greedy continuations differ from {a}'s"
        return {"lossless": False, "passes": False, "note": "; ".join(n for n in (said, row["note"]) if n)}
    if before["passes"] is None:  # the stack before is the reference, or nothing judges it: its answers stand
        before = {"reference": a, "quality_share": 1.0, "passes": True}
    out = {
        "lossless": True,
        "gate_basis": "lossless",
        **{k: before[k] for k in ("reference", "quality_share", "passes")},
    }
    ratio = row.get("perplexity_ratio")
    if ratio is not None and not gate <= ratio <= 1 / gate:
        said = (
            f"its prompt scores are wrong, not its answers: perplexity {ratio:.4g}x {a}'s on the same "
            f"weights with all {row['prompts']} greedy continuations the same"
        )
        out["note"] = "; ".join(n for n in (row["note"], said) if n)
    return out


def _same(variants: dict, a: tuple, b: tuple) -> bool | None:
    return variants[a] == variants[b] if a in variants and b in variants else None


def _gate(rec: dict, ref: str | None, first: str, stack: str, gate: float) -> dict:
    """The stack's quality as a share of the chain's reference, and whether it passes (None:
    the stack is the reference, or nothing compares them)."""
    if stack == ref:
        return {"reference": ref, "gate_basis": "the reference", "quality_share": 1.0, "passes": None}
    ratio = perplexity_ratio(rec[ref][0], rec[stack][0])[0] if ref is not None else None
    if ratio is not None:  # paired window by window, as the steps' ratios are
        share = 1 / ratio
        return {"reference": ref, "gate_basis": "perplexity", "quality_share": share, "passes": share >= gate}
    if first in rec and first != stack:
        c = compare_outputs(rec[first][0], rec[stack][0])
        if c.get("prompts"):
            share = c["agreement"]
            return {"reference": first, "gate_basis": "agreement", "quality_share": share, "passes": share >= gate}
    return {"reference": ref or first, "gate_basis": None, "quality_share": None, "passes": None}


def quality_frames(results, chains, steps, attribution, gate: float) -> dict[str, pl.DataFrame]:
    """The quality tables from results (RunResult) that carry a quality record."""
    records: dict[tuple[str, str, str], tuple[QualityRecord, str | None]] = {}
    variants: dict[tuple[str, str, str], str] = {}
    for r in sorted(results, key=lambda r: (r.model, r.topology, r.stack, r.run, r.cell)):
        if r.quality is not None:
            records.setdefault((r.model, r.topology, r.stack), (r.quality, r.weights.weights))
            variants[(r.model, r.topology, r.stack)] = r.job.stack.variant
    from speedsplit.analysis.quality_tasks import tasks_frame

    lossless = {r.stack for r in results if getattr(r.job.stack, "lossless", False)}  # a StackDef (v2) has none
    step_rows = steps_frame(records, chains, steps, attribution, gate, variants, lossless)
    return {
        "quality_stacks": stacks_frame(records),
        "quality": step_rows,
        "quality_tasks": tasks_frame(step_rows, records),
    }
