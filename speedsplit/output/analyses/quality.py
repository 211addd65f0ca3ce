"""Quality beside speed (config `quality`): each chain step's agreement, next-token agreement and
perplexity change beside its throughput factor, the gate, the speed-against-quality chart, the
report section and the first screen's lines."""

from __future__ import annotations

import altair as alt
import polars as pl

from speedsplit.analysis.answer import interval_words
from speedsplit.core.formats import difference_text, html_table
from speedsplit.output.analyses import Analysis, Basis, answer_block, html_section


def build(b: Basis) -> dict[str, pl.DataFrame]:
    from speedsplit.analysis.quality import quality_frames

    if b.spec is None:
        return {}
    return quality_frames(b.results, b.chains, b.steps, b.attribution, b.spec["gate"])


def chart_rows(steps: pl.DataFrame, stacks: pl.DataFrame) -> pl.DataFrame:
    """One point per (chain, stack): its throughput and its perplexity, each relative to the
    chain's first stack with a value (the steps' factors multiplied along the chain)."""
    rows = []
    for (model, topology, chain), df in steps.sort("position").group_by(
        ["model", "topology", "chain"], maintain_order=True
    ):
        ppl = {
            r["stack"]: r["perplexity"]
            for r in stacks.filter((pl.col("model") == model) & (pl.col("topology") == topology)).iter_rows(named=True)
        }
        first = df.row(0, named=True)
        speed = 1.0 if first["position"] == 1 else None  # relative to the chain's first stack
        members = [(first["from_stack"], speed, None)]
        for r in df.iter_rows(named=True):
            joined = r["from_stack"] == members[-1][0]  # a step left out breaks the product
            ok = speed is not None and joined and r["speed_factor"] is not None
            speed = speed * r["speed_factor"] if ok else None
            members.append((r["to_stack"], speed, r["step"]))
        base = next((ppl[s] for s, _, _ in members if ppl.get(s)), None)
        for i, (stack, speed, step) in enumerate(members):
            if speed is None or base is None or not ppl.get(stack):
                continue
            rows.append(
                {
                    "chain": f"{chain} ({model}, {topology})",
                    "order": i,
                    "stack": stack,
                    "step": step or "",
                    "throughput": speed,
                    "perplexity": ppl[stack] / base,
                }
            )
    return pl.DataFrame(
        rows,
        schema={
            "chain": pl.String,
            "order": pl.Int64,
            "stack": pl.String,
            "step": pl.String,
            "throughput": pl.Float64,
            "perplexity": pl.Float64,
        },
    )


def tradeoff_chart(points: pl.DataFrame, unscored: list[str]) -> alt.FacetChart:
    """Speed against quality per chain: one point per stack, joined in chain order (the steps);
    `unscored`: the stacks that serve no perplexity (no point), named under the title."""
    df = points.to_pandas()
    lo, hi = min(points["perplexity"].min(), 1.0), max(points["perplexity"].max(), 1.0)
    pad = max(0.01, (hi - lo) * 0.15)
    x_lo, x_hi = points["throughput"].min(), points["throughput"].max()
    base = alt.Chart().encode(
        x=alt.X(
            "throughput:Q",
            scale=alt.Scale(type="log", domain=[x_lo / 1.25, x_hi * 1.25]),
            title="throughput, × the chain's first stack",
        ),
        y=alt.Y(
            "perplexity:Q",
            scale=alt.Scale(domain=[lo - pad, hi + pad], zero=False),
            title="perplexity, × the chain's reference (lower is better)",
        ),
        order="order:Q",
    )
    path = base.mark_line(color="#888", strokeDash=[4, 2])
    points_ = base.mark_point(filled=True, size=90).encode(
        color=alt.Color("stack:N", legend=None),
        tooltip=["stack", "step", alt.Tooltip("throughput:Q", format=".3f"), alt.Tooltip("perplexity:Q", format=".4f")],
    )
    labels = base.mark_text(align="left", dx=7, dy=-7, fontSize=11).encode(text="stack:N")
    return (
        alt.layer(path, points_, labels, data=df)
        .properties(width=320, height=220)
        .facet(facet=alt.Facet("chain:N", title=None), columns=2)
        .properties(
            title=alt.TitleParams(
                "Speed against quality: each stack of a chain, the steps in order",
                subtitle=["perplexity on held-out text through the servers' own prompt logprobs"]
                + ([f"no perplexity served (no point): {', '.join(unscored)}"] if unscored else []),
                anchor="start",
            )
        )
    )


def charts(frames: dict[str, pl.DataFrame]) -> dict:
    steps, stacks = frames.get("quality"), frames.get("quality_stacks")
    if steps is None or stacks is None or not steps.height:
        return {}
    points = chart_rows(steps, stacks)
    unscored = sorted(set(stacks.filter(pl.col("perplexity").is_null())["stack"].to_list()))
    return {"quality": tradeoff_chart(points, unscored)} if points.height else {}


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{(v - 1) * 100:+.1f}%"


def step_line(r: dict) -> str:
    """A step's speed and quality in one phrase, e.g. 'INT4 weights + kernel: 1.36× faster;
    agreement 9/16, perplexity +2.1% [+1.8%, +2.4%]; passes the 99% gate'."""
    name = r["step"] or f"{r['from_stack']} → {r['to_stack']}"
    parts = []
    if r["speed_factor"] is not None:
        # in the answer's words: an interval holding 1 shows no difference (analysis/answer.py)
        ci = interval_words(r["speed_factor_lo"], r["speed_factor_hi"])
        parts.append(f"{r['speed_factor']:.3g}× throughput {ci}")
    q = []
    if r["prompts"] and r["same_weights"] and r["agree"] < r["prompts"]:
        # the same weights served another way should say the same: say by how much they do not
        q.append(
            f"the same weights, yet {r['prompts'] - r['agree']}/{r['prompts']} continuations differ "
            f"(the first difference at token {r['first_divergence']:.1f} of {r['output_tokens']} on average, {r['output_tokens']} where none; {r['compared_by']})"
        )
    elif r["prompts"]:
        q.append(f"agreement {r['agree']}/{r['prompts']} ({r['compared_by']})")
    if r["perplexity_ratio"] is not None:
        ci = (
            f" [{_pct(r['perplexity_ratio_lo'])}, {_pct(r['perplexity_ratio_hi'])}]"
            if r["perplexity_ratio_lo"] is not None
            else ""
        )
        q.append(f"perplexity {_pct(r['perplexity_ratio'])}{ci}")
    if q:
        parts.append(", ".join(q))
    if r["passes"] is not None:
        verdict = "passes" if r["passes"] else "FAILS"
        basis = (
            f"lossless: its greedy answers are {r['from_stack']}'s"
            if r["gate_basis"] == "lossless"
            else f"{r['gate_basis']} against {r['reference']}"
        )
        parts.append(f"{verdict} the {r['gate'] * 100:.0f}% gate ({basis})")
    elif r["gate_basis"] == "the reference":
        parts.append("the quality gate's reference")
    return f"{name}: {'; '.join(parts) or 'no quality measured'}"


def by_chain(frames: dict[str, pl.DataFrame]) -> dict[tuple[str, str, str], str]:
    """Per (model, topology, chain): its steps' speed and quality in one line (step_line's,
    ' | ' between steps), in the order the quality table holds them."""
    steps = frames.get("quality")
    if steps is None or not steps.height:
        return {}
    out = {}
    tasks = frames.get("quality_tasks")
    for (model, topology, chain), df in steps.sort("position").group_by(
        ["model", "topology", "chain"], maintain_order=True
    ):
        lines = [step_line(r) + _task_words(tasks, r) for r in df.iter_rows(named=True)]
        note = df["note"].drop_nulls().to_list()
        out[(model, topology, chain)] = " | ".join(lines) + (f" ({note[0]})" if note and note[0] else "")
    return out


def answer_lines(frames: dict[str, pl.DataFrame]) -> list[str]:
    """Per chain, its steps' speed and quality in one line."""
    return [f"{chain} ({model}, {topology}): {line}" for (model, topology, chain), line in by_chain(frames).items()]


def _task_words(tasks: pl.DataFrame | None, step: dict) -> str:
    """The step's lm-evaluation-harness metrics: '; python_next_line acc 0.3 → 0.35 (+0.05 [-0.24, +0.34])'."""
    if tasks is None or not tasks.height:
        return ""
    mine = tasks.filter(
        (pl.col("model") == step["model"])
        & (pl.col("topology") == step["topology"])
        & (pl.col("chain") == step["chain"])
        & (pl.col("position") == step["position"])
        & pl.col("difference").is_not_null()
    )
    said = []
    for t in mine.iter_rows(named=True):
        diff = difference_text(t["difference"], t["difference_lo"], t["difference_hi"])
        said.append(f"{t['task']} {t['metric'].split(',')[0]} {t['from_value']:.3g} → {t['to_value']:.3g} ({diff})")
    return "".join(f"; {w}" for w in said)


def answer(frames: dict[str, pl.DataFrame]) -> str:
    return answer_block("Quality beside speed", answer_lines(frames))


def section(frames: dict[str, pl.DataFrame], context: dict) -> str:
    steps, stacks = frames.get("quality"), frames.get("quality_stacks")
    if stacks is None:
        return ""
    return html_section(
        "Quality beside speed",
        "Each chain step's stack against the one before it on the same held-out text: agreement (the "
        "share of greedy continuations that match in full, Wilson 95% interval, and where they first "
        "differ), next-token agreement (the same top token at each held-out position) and the "
        "perplexity ratio (paired by window, 95% t interval), beside the step's throughput factor at "
        "the headline cell. The gate compares each stack with its chain's reference. Per stack: what "
        "it serves, and its perplexity. On random weights these figures say nothing.",
        html_table(steps) if steps.height else "<p>No chain step with both stacks probed.</p>",
        html_table(stacks.drop("text")),
        *(
            ["<h3>Task accuracy (lm-evaluation-harness)</h3>", html_table(frames["quality_tasks"])]
            if frames.get("quality_tasks") is not None and frames["quality_tasks"].height
            else []
        ),
    )


ANALYSIS = Analysis(
    "quality",
    order=15,
    tables=("quality", "quality_stacks", "quality_tasks"),
    enabled=lambda config: config.quality.enabled,
    build=build,
    spec=lambda config: {"gate": float(config.quality.gate)},
    charts=charts,
    section=section,
    answer=answer,
)
