"""Tables from result files (never from a running server): one row per run, one per cell
with bootstrap intervals, and the chain attribution, crossover and cross-model stability.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import numpy as np
import polars as pl

from speedsplit.analysis import attribution as attr
from speedsplit.analysis import roofline
from speedsplit.results import read_result, write_bytes_atomic

CELL_KEYS = ["model", "topology", "cell", "users", "workload", "sampling", "prompt_tokens", "output_tokens"]
LATENCY = ["ttft_s", "tpot_s", "itl_s", "e2e_s"]


def _gpu_name(res: dict) -> str:
    hw = res["provenance"].get("hardware", {})
    gpus = hw.get("gpus") or []
    devices = (res.get("server") or {}).get("devices") or []
    if gpus:
        names = sorted({g["name"] for g in gpus if not devices or g["index"] in devices} or {gpus[0]["name"]})
        return ", ".join(names)
    return f"CPU: {hw.get('host_cpu', 'unknown')}"


def runs_frame(paths: list[str | Path]) -> pl.DataFrame:
    """One row per run; refuses (ResultError) any file that is corrupt or truncated."""
    rows = []
    for path in paths:
        res = read_result(path)
        p, s = res["params"], res.get("summary") or {}
        server, engine = res.get("server") or {}, res.get("engine") or {}
        row = {
            "model": res["model"],
            "stack": res["stack"],
            "topology": res["topology"],
            "cell": res["cell"],
            "users": p["users"],
            "workload": p["workload"],
            "sampling": p["sampling"],
            "prompt_tokens": p["prompt_tokens"],
            "output_tokens": p["output_tokens"],
            "run": res["run"],
            "status": res["status"],
            "flags": ",".join(res.get("flags") or []),
            "output_tok_s": s.get("output_tok_s") if res["status"] == "ok" else None,
            "request_s": s.get("request_s") if res["status"] == "ok" else None,
            "completed": s.get("completed", 0),
            "failed": s.get("failed", 0),
            "failures": json.dumps(s.get("failures") or {}, sort_keys=True),
            "wall_s": s.get("wall_s"),
            "linear_kernel": engine.get("linear_kernel"),
            "kernel_ok": res.get("kernel_ok"),
            "attention_backend": engine.get("attention_backend"),
            "weight_memory_gib": engine.get("weight_memory_gib"),
            "startup_s": server.get("startup_s"),
            "reused": bool(server.get("reused")),
            "platform": res["stack_def"]["platform"],
            "hardware": _gpu_name(res),
            "error": server.get("error") or (res.get("error") or {}).get("message"),
            "variant": res["stack_def"].get("variant"),
            "tensor_parallel": res["stack_def"].get("tensor_parallel", 1),
            "instances": res["stack_def"].get("instances", 1),
            "model_config": json.dumps(res.get("model_config") or {}, sort_keys=True),
        }
        for metric in LATENCY:
            dist = s.get(metric) or {}
            for q in ("median", "p90", "p99"):
                row[f"{metric}_{q}"] = dist.get(q) if res["status"] == "ok" else None
        rows.append(row)
    schema_overrides = {
        "kernel_ok": pl.Boolean,
        "output_tok_s": pl.Float64,
        "request_s": pl.Float64,
        "startup_s": pl.Float64,
        "weight_memory_gib": pl.Float64,
        "wall_s": pl.Float64,
        "linear_kernel": pl.Utf8,
        "attention_backend": pl.Utf8,
        "error": pl.Utf8,
    }
    schema_overrides.update({f"{m}_{q}": pl.Float64 for m in LATENCY for q in ("median", "p90", "p99")})
    return pl.DataFrame(rows, schema_overrides=schema_overrides, infer_schema_length=None)


def bootstrap_median(
    values: list[float], n_boot: int = attr.N_BOOT, seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return None, None, None
    rng = np.random.default_rng(seed)
    boots = np.median(v[rng.integers(0, v.size, size=(n_boot, v.size))], axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(np.median(v)), float(lo), float(hi)


def cells_frame(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, stack, topology, cell): medians with 95% bootstrap intervals over runs."""
    rows = []
    keys = CELL_KEYS[:3] + ["stack"] + CELL_KEYS[3:]
    for group, df in runs.group_by(keys, maintain_order=True):
        row = dict(zip(keys, group))
        ok = df.filter(pl.col("status") == "ok")
        for metric in ["output_tok_s"] + [f"{m}_median" for m in LATENCY] + ["ttft_s_p99", "e2e_s_p99"]:
            med, lo, hi = bootstrap_median(ok[metric].to_list())
            row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = med, lo, hi
        row.update(
            runs=df.height,
            runs_ok=ok.height,
            statuses=",".join(sorted(set(df["status"].to_list()))),
            failed_requests=int(df["failed"].sum()),
            failures=_merge_counts(df["failures"].to_list()),
            flags=",".join(sorted({f for fl in df["flags"].to_list() for f in fl.split(",") if f})),
            linear_kernel=",".join(sorted({k for k in df["linear_kernel"].to_list() if k})) or None,
            kernel_ok=None if df["kernel_ok"].null_count() == df.height else bool(df["kernel_ok"].drop_nulls().all()),
            startup_s=_median_or_none(df["startup_s"].drop_nulls().to_list()),
            hardware=df["hardware"][0],
            platform=df["platform"][0],
            weight_memory_gib=_median_or_none(df["weight_memory_gib"].drop_nulls().to_list()),
            variant=df["variant"][0],
            tensor_parallel=df["tensor_parallel"][0],
            instances=df["instances"][0],
            model_config=df["model_config"][0],
        )
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def with_mbu(cells: pl.DataFrame, bandwidth_gb_s: float | None) -> pl.DataFrame:
    """Add each cell's model-bandwidth utilisation during decode (median inter-token latency
    as the step time) on the measured bandwidth; null where a number is missing."""
    values = []
    for row in cells.iter_rows(named=True):
        cfg = json.loads(row["model_config"] or "{}")
        values.append(
            None
            if not cfg
            else roofline.mbu(
                cfg,
                row["variant"],
                row["users"],
                row["prompt_tokens"],
                row["output_tokens"],
                row["itl_s_median"],
                bandwidth_gb_s,
                row["tensor_parallel"],
                row["instances"],
                row["weight_memory_gib"],
            )
        )
    return cells.with_columns(
        pl.Series("mbu", values, dtype=pl.Float64), pl.lit(bandwidth_gb_s, dtype=pl.Float64).alias("bandwidth_gb_s")
    )


def _median_or_none(v: list[float]) -> float | None:
    return float(np.median(v)) if v else None


def _merge_counts(items: list[str]) -> str:
    total: dict[str, int] = {}
    for item in items:
        for k, n in json.loads(item).items():
            total[k] = total.get(k, 0) + n
    return json.dumps(total, sort_keys=True)


def clean_runs(df: pl.DataFrame, tolerate_flags: Collection[str] = ()) -> tuple[pl.DataFrame, list[str]]:
    """The runs that may make a factor (status ok, a throughput, no flag beyond the tolerated
    ones) and, for each other run, why it was left out ("vllm-marlin run1: kernel_mismatch")."""
    keep, why = [], []
    for row in df.iter_rows(named=True):
        flags = [f for f in row["flags"].split(",") if f and f not in tolerate_flags]
        if row["status"] != "ok" or row["output_tok_s"] is None:
            why.append(f"{row['stack']} run{row['run']}: {row['status']}")
        elif flags:
            why.append(f"{row['stack']} run{row['run']}: {'+'.join(flags)}")
        else:
            keep.append(True)
            continue
        keep.append(False)
    return df.filter(pl.Series(keep, dtype=pl.Boolean)), why


def attribution_frame(
    runs: pl.DataFrame, chains: dict[str, list[str]], tolerate_flags: Collection[str] = ()
) -> pl.DataFrame:
    """One row per (chain, model, topology, cell, factor), plus a 'total' row per cell.

    Only clean runs count (see clean_runs); each row says how many runs it used, how many it
    left out and why. A factor without a clean run of both its stacks is undefined, with the
    reason in `note`.
    """
    rows = []
    keys = CELL_KEYS
    for group, df in runs.group_by(keys, maintain_order=True):
        base = dict(zip(keys, group))
        for chain_name, chain in chains.items():
            tp: dict[str, list[float]] = {}
            missing: dict[str, str] = {}
            used: dict[str, int] = {}
            excluded: dict[str, list[str]] = {}
            for stack in chain:
                sdf = df.filter(pl.col("stack") == stack)
                clean, excluded[stack] = clean_runs(sdf, tolerate_flags)
                tp[stack] = clean["output_tok_s"].to_list()
                used[stack] = clean.height
                if sdf.height == 0:
                    missing[stack] = "not measured"
                elif not tp[stack]:
                    reasons = ", ".join(w.removeprefix(f"{stack} ") for w in excluded[stack])
                    missing[stack] = f"no clean run ({reasons})"
            if all(m == "not measured" for m in missing.values()) and len(missing) == len(chain):
                continue
            a = attr.attribute(chain, tp, missing=missing)
            note = (
                a.share_note
                + ("; " if a.share_note and a.missing else "")
                + ("; ".join(f"{s}: {why}" for s, why in a.missing.items()))
            )

            def counts(stacks: list[str]) -> dict:
                out = [w for s in stacks for w in excluded[s]]
                return {
                    "runs_used": sum(used[s] for s in stacks),
                    "runs_excluded": len(out),
                    "excluded": "; ".join(out),
                }

            for i, f in enumerate(a.factors):
                rows.append(
                    {
                        **base,
                        "chain": chain_name,
                        "position": i + 1,
                        "factor": f.name,
                        "value": f.value,
                        "lo": f.ci[0],
                        "hi": f.ci[1],
                        "log_share": f.share,
                        "share_lo": f.share_ci[0],
                        "share_hi": f.share_ci[1],
                        **counts([f.frm, f.to]),
                        "note": note,
                    }
                )
            rows.append(
                {
                    **base,
                    "chain": chain_name,
                    "position": 0,
                    "factor": "total",
                    "value": a.total,
                    "lo": a.total_ci[0],
                    "hi": a.total_ci[1],
                    "log_share": 1.0 if a.total is not None and not a.share_note else None,
                    "share_lo": None,
                    "share_hi": None,
                    **counts(chain),
                    "note": note,
                }
            )
    schema = {
        "value": pl.Float64,
        "lo": pl.Float64,
        "hi": pl.Float64,
        "log_share": pl.Float64,
        "share_lo": pl.Float64,
        "share_hi": pl.Float64,
        "runs_used": pl.Int64,
        "runs_excluded": pl.Int64,
    }
    if not rows:
        return pl.DataFrame(schema={**{k: pl.Utf8 for k in keys + ["chain", "factor", "excluded", "note"]}, **schema})
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def crossover_frame(attribution: pl.DataFrame) -> pl.DataFrame:
    """Per chain, model, topology, workload and sampling: users where factor 1's share crosses 50%."""
    rows = []
    first = attribution.filter(pl.col("position") == 1)
    for group, df in first.group_by(
        ["chain", "model", "topology", "workload", "sampling", "factor"], maintain_order=True
    ):
        df = df.sort("users")
        u = attr.crossover(df["users"].to_list(), df["log_share"].to_list())
        rows.append(
            {
                **dict(zip(["chain", "model", "topology", "workload", "sampling", "factor"], group)),
                "users_range": f"{df['users'].min()}-{df['users'].max()}",
                "crossover_users": u,
                "crossover": f"{u:.1f} users" if u is not None else "none in range",
            }
        )
    return pl.DataFrame(rows, schema_overrides={"crossover_users": pl.Float64}, infer_schema_length=None)


def stability_frame(attribution: pl.DataFrame) -> pl.DataFrame:
    """Spread of each factor across models at the same chain, topology and cell."""
    rows = []
    for group, df in attribution.group_by(["chain", "topology", "cell", "factor"], maintain_order=True):
        s = attr.spread(df["value"].to_list())
        rows.append(
            {
                **dict(zip(["chain", "topology", "cell", "factor"], group)),
                "models": ",".join(df["model"].to_list()),
                **s,
            }
        )
    return pl.DataFrame(
        rows,
        schema_overrides={"min": pl.Float64, "max": pl.Float64, "spread_pct": pl.Float64},
        infer_schema_length=None,
    )


def read_table(path: str | Path) -> pl.DataFrame:
    """Read a table written by write_table (an empty file is an empty table)."""
    path = Path(path)
    if path.stat().st_size == 0:
        return pl.DataFrame()
    df = pl.read_csv(path, infer_schema_length=None)
    return df.with_columns(pl.col(c).fill_null("") for c in ("flags",) if c in df.columns)


def to_markdown(df: pl.DataFrame, digits: int = 3) -> str:
    """A plain markdown table (no extra dependency)."""
    cols = df.columns

    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines) + "\n"


def write_table(
    df: pl.DataFrame, csv: str | Path, parquet: str | Path | None = None, markdown: str | Path | None = None
) -> None:
    """Write a table atomically as CSV (and parquet / markdown)."""
    write_bytes_atomic(csv, df.write_csv().encode())
    if parquet is not None:
        import io

        buf = io.BytesIO()
        df.write_parquet(buf)
        write_bytes_atomic(parquet, buf.getvalue())
    if markdown is not None:
        write_bytes_atomic(markdown, to_markdown(df).encode())
