"""The analysis as typed polars frames, computed from result records (never from a running
server): one row per run, one per cell with 95% t intervals over runs, and the chain attribution,
crossover and cross-model stability. Numbers and lists only: how they are shown (CSV,
markdown, HTML, "none in range") is speedsplit/core/formats.py.
"""

from __future__ import annotations

from collections.abc import Collection

import json

import numpy as np
import polars as pl

from speedsplit.analysis import run_estimates as est
from speedsplit.core import plausible
from speedsplit.core.errors import UserError
from speedsplit.core.record import RunResult
from speedsplit.planning import roofline

# a cell's load (core/loads.py): closed (users in a loop), open (arrivals at a rate), trace or
# sessions; every load but a closed loop sends its requests when due (open_loop)
CELL_KEYS = ["model", "topology", "cell", "users", "workload", "sampling", "prompt_tokens", "output_tokens", "load"]
LATENCY = ["ttft_s", "tpot_s", "itl_s", "e2e_s"]


def open_loop(load: str) -> bool:
    """Whether a cell's requests leave when due (arrivals, a trace, sessions), not when a user is free."""
    return load != "closed"


OPEN_LOOP = pl.col("load") != "closed"  # the same, over a frame's rows


def _gpu_name(res: RunResult) -> str:
    hw = res.provenance.hardware
    devices = res.server.devices if res.server and res.server.devices else []
    if hw.gpus:
        names = sorted({g.name for g in hw.gpus if not devices or g.index in devices} or {hw.gpus[0].name})
        return ", ".join(names)
    return f"CPU: {hw.host_cpu}"


LATENCY_Q = ("median", "p90", "p99", "mean")
RUNS_SCHEMA = {
    "model": pl.Utf8,
    "stack": pl.Utf8,
    "topology": pl.Utf8,
    "cell": pl.Utf8,
    "users": pl.Int64,
    "workload": pl.Utf8,
    "sampling": pl.Utf8,
    "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "load": pl.Utf8,
    "run": pl.Int64,
    "status": pl.Utf8,
    "flags": pl.List(pl.Utf8),
    "output_tok_s": pl.Float64,
    "request_s": pl.Float64,
    "rate_rps": pl.Float64,  # open loop: the cell's arrival rate (null: closed loop)
    "offered_rps": pl.Float64,  # open loop: the rate the run's schedule asked for
    "lag_s_p99": pl.Float64,  # open loop: p99 of how late the client sent what was due
    # sessions: the TTFT of first and of returning turns, and a session's time (null: other loads)
    "ttft_first_s_median": pl.Float64,
    "ttft_return_s_median": pl.Float64,
    "session_s_median": pl.Float64,
    "session_turns": pl.Int64,
    "completed": pl.Int64,
    "failed": pl.Int64,
    "failures": pl.Utf8,  # JSON object: failed requests by cause
    "wall_s": pl.Float64,
    "linear_kernel": pl.Utf8,
    "kernel_ok": pl.Boolean,
    "missing_extension": pl.Utf8,  # a compiled extension the engine ran without, on its fallback
    "host_speed_moved": pl.Float64,  # how far the host's own speed moved across the load (1.0: not at all)
    "attention_backend": pl.Utf8,
    "weight_memory_gib": pl.Float64,
    "card_memory_gib": pl.Float64,  # the memory cap the server ran under (null: none applied)
    "kv_cache_gib": pl.Float64,  # what the engine gave its KV cache, as it reported
    "kv_cache_fit_gib": pl.Float64,  # what would have kept it inside its memory share (vLLM)
    "kv_cache_tokens": pl.Int64,
    "startup_s": pl.Float64,
    # where a vLLM start-up went, as its log says (null: another engine, or results from before)
    "startup_load_s": pl.Float64,
    "startup_compile_s": pl.Float64,
    "startup_graphs_s": pl.Float64,
    "startup_engine_s": pl.Float64,
    "startup_config_s": pl.Float64,
    "startup_spawn_s": pl.Float64,
    "startup_warmup_s": pl.Float64,
    "compile_cache": pl.Utf8,  # warm: compiled graphs read back from the cache; cold: compiled
    "reused": pl.Boolean,
    "platform": pl.Utf8,
    "hardware": pl.Utf8,
    "error": pl.Utf8,
    "variant": pl.Utf8,
    "tensor_parallel": pl.Int64,
    "instances": pl.Int64,
    "model_shape": pl.Utf8,  # JSON object: the served model's shape (for the roofline)
    "devices": pl.List(pl.Utf8),
    "lease_wait_s": pl.Float64,
    "job_start": pl.Float64,  # Unix seconds (null in results written before timing was recorded)
    "load_start": pl.Float64,
    "load_end": pl.Float64,
    "job_end": pl.Float64,
    **{f"{m}_{q}": pl.Float64 for m in LATENCY for q in LATENCY_Q},
    # the latency objectives (null: not judged, results older than the objectives)
    "slo_met": pl.Boolean,
    "slo_violations": pl.List(pl.Utf8),
    "goodput_rps": pl.Float64,
    # telemetry over the measured phase (null with the reason in telemetry_absent)
    "kv_cache_peak": pl.Float64,
    "kv_cache_mean": pl.Float64,
    "waiting_mean": pl.Float64,
    "running_mean": pl.Float64,  # requests the engine was running, mean over readings
    "engine_steps": pl.Float64,  # the engine's steps in the measured phase (vLLM's iteration counter)
    "engine_tokens": pl.Float64,  # the tokens they carried, prefill and decode
    "spec_acceptance": pl.Float64,  # a speculative decoder's accepted / drafted tokens (null: not speculative)
    "spec_accepted_per_draft": pl.Float64,  # its accepted tokens a draft
    "preemptions": pl.Float64,
    "prefix_cache_hit_rate": pl.Float64,
    "prefix_cache_hits": pl.Float64,
    "prefix_cache_queries": pl.Float64,
    "offload_hit_rate": pl.Float64,  # the share of tokens looked up past the card an offloaded tier held
    "energy_j": pl.Float64,
    "energy_per_token_j": pl.Float64,
    "tokens_per_joule": pl.Float64,
    "power_mean_w": pl.Float64,
    "sm_util_mean_pct": pl.Float64,
    "gpu_memory_peak_gib": pl.Float64,
    "telemetry_absent": pl.List(pl.Utf8),
    # the client's calibrated offsets on the host that measured: the largest level's (they bound
    # the interval), then the fewest users' (an uncontended client's: the value takes them out;
    # core/facts.Calibration.uncontended), and the wall the run's own records show the client held
    # (Summary.client_wall_s); null: no calibration, or results from before them
    "client_ttft_s": pl.Float64,
    "client_itl_s": pl.Float64,
    "client_tpot_s": pl.Float64,
    "client_e2e_s": pl.Float64,
    "client_cycle_s": pl.Float64,  # a closed-loop request's (null: calibrated before it was measured)
    "client_ttft_p99_s": pl.Float64,  # the client's tail: a p99's far side (null: calibrated before it was)
    "client_tpot_p99_s": pl.Float64,
    "client_least_ttft_s": pl.Float64,
    "client_least_itl_s": pl.Float64,
    "client_least_tpot_s": pl.Float64,
    "client_least_e2e_s": pl.Float64,
    "client_least_cycle_s": pl.Float64,
    "client_wall_s": pl.Float64,
    "think_s": pl.Float64,  # a closed-loop user's wait between an answer and its next request
    "usage_mismatch": pl.Int64,  # completed requests whose usage disagreed with the stream
    "tokens_per_chunk": pl.Float64,  # output tokens a chunk carried: above 1, the ITL is a chunk's gap
    "latency_outliers": pl.Int64,  # completed requests far slower than their length predicts
}


def _session_turns(res: RunResult) -> int | None:
    """A sessions cell's turns a session (a trace's: its sessions' mean; null: another load)."""
    load, s = res.job.cell.load, res.summary
    if load.kind != "sessions":
        return None
    if load.sessions.turns is not None:
        return load.sessions.turns
    return round(s.requests / load.sessions.count) if s and s.requests else None


def _memory_cap(res: RunResult) -> float | None:
    cap = res.server.memory_cap if res.server else None
    return cap.card_memory_gib if cap and cap.applied else None


def runs_frame(results: list[RunResult]) -> pl.DataFrame:
    """One row per run, in (model, stack, topology, users, workload, sampling, run) order whatever the order of
    the results given (so every table built from it is too)."""
    rows = []
    for res in results:
        p, s, ok = res.job.cell, res.summary, res.status == "ok"
        row = {
            "model": res.model,
            "stack": res.stack,
            "topology": res.topology,
            "cell": res.cell,
            "users": p.users,
            "workload": p.workload,
            "sampling": p.sampling,
            "prompt_tokens": p.prompt_tokens,
            "output_tokens": p.output_tokens,
            "load": p.load.kind,
            "run": res.run,
            "status": res.status,
            # whoever wrote the record: numbers no measurement makes count in no factor
            "flags": list(res.flags)
            + (["implausible"] if "implausible" not in res.flags and plausible.reasons(res) else []),
            "output_tok_s": s.output_tok_s if ok and s else None,
            "request_s": s.request_s if ok and s else None,
            "rate_rps": p.load.rate_rps,
            "offered_rps": s.offered_rps if s else None,
            "lag_s_p99": s.lag_s.p99 if s and s.lag_s else None,
            **{
                f"{m}_median": getattr(s, m).median if ok and s and getattr(s, m) else None
                for m in ("ttft_first_s", "ttft_return_s", "session_s")
            },
            "session_turns": _session_turns(res),
            "completed": s.completed if s else 0,
            "failed": s.failed if s else 0,
            "failures": json.dumps(s.failures if s else {}, sort_keys=True),
            "wall_s": s.wall_s if s else None,
            "linear_kernel": res.engine.linear_kernel,
            "kernel_ok": res.kernel_ok,
            "missing_extension": res.engine.missing_extension,
            "host_speed_moved": res.host_speed.moved if res.host_speed else None,
            "attention_backend": res.engine.attention_backend,
            "weight_memory_gib": res.engine.weight_memory_gib,
            "card_memory_gib": _memory_cap(res),
            "kv_cache_gib": res.engine.kv_cache_gib,
            "kv_cache_fit_gib": res.engine.kv_cache_fit_gib,
            "kv_cache_tokens": res.engine.kv_cache_tokens,
            "startup_s": res.server.startup_s if res.server else None,
            "startup_load_s": res.engine.load_s,
            "startup_compile_s": res.engine.compile_s,
            "startup_graphs_s": res.engine.graphs_s,
            "startup_engine_s": res.engine.engine_init_s,
            "startup_config_s": res.engine.config_s,
            "startup_spawn_s": res.engine.spawn_s,
            "startup_warmup_s": res.engine.warmup_s,
            "compile_cache": res.engine.compile_cache,
            "reused": bool(res.server and res.server.reused),
            "platform": res.job.stack.platform,
            "hardware": _gpu_name(res),
            "error": res.cause,
            "variant": res.job.stack.variant,
            "tensor_parallel": res.job.stack.tensor_parallel,
            "instances": res.job.stack.instances,
            "model_shape": res.model_shape.model_dump_json(exclude_none=True),
            "devices": (res.server.devices if res.server else None) or [],
            "lease_wait_s": res.server.lease_wait_s if res.server else None,
            **{
                k: getattr(res.timing, k) if res.timing else None
                for k in ("job_start", "load_start", "load_end", "job_end")
            },
        }
        for metric in LATENCY:
            dist = getattr(s, metric) if ok and s else None
            for q in LATENCY_Q:
                row[f"{metric}_{q}"] = getattr(dist, q) if dist else None
        row.update(_slo_and_telemetry(res, ok))
        cal = res.calibration
        least = cal.uncontended(s.ttft_s.median if ok and s and s.ttft_s else None) if cal else {}
        row.update(
            client_ttft_s=cal.ttft_s if cal else None,
            client_itl_s=cal.itl_s if cal else None,
            client_tpot_s=cal.tpot_s if cal else None,
            client_e2e_s=cal.e2e_s if cal else None,
            client_cycle_s=cal.cycle_s if cal else None,
            client_ttft_p99_s=cal.ttft_p99_s if cal else None,
            client_tpot_p99_s=cal.tpot_p99_s if cal else None,
            **{f"client_least_{k}": least.get(k) for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s", "cycle_s")},
            client_wall_s=s.client_wall_s if ok and s else None,
            think_s=float(p.closed.think_s),
            usage_mismatch=s.usage_mismatch if s else None,
            tokens_per_chunk=s.tokens_per_chunk if s else None,
            latency_outliers=s.latency_outliers if s else None,
        )
        rows.append(row)
    return pl.DataFrame(rows, schema=RUNS_SCHEMA).sort(
        ["model", "stack", "topology", "users", "workload", "sampling", "run"], maintain_order=True
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _slo_and_telemetry(res: RunResult, ok: bool) -> dict:
    """The run's objectives verdict and its telemetry summaries as flat columns."""
    slo, tel = res.slo, res.telemetry
    server = tel.server if tel and ok else None
    gpu = tel.gpu if tel and ok else None
    energy = gpu.energy_per_output_token_j if gpu else None
    absent = [x for x in ((tel.server_absent, tel.gpu_absent) if tel else ("not sampled",)) if x]
    return {
        "slo_met": slo.met if slo else None,
        "slo_violations": list(slo.violations) if slo else [],
        "goodput_rps": slo.goodput_rps if slo and ok else None,
        "kv_cache_peak": server.kv_cache_usage_peak if server else None,
        "kv_cache_mean": server.kv_cache_usage_mean if server else None,
        "waiting_mean": server.waiting_mean if server else None,
        "running_mean": server.running_mean if server else None,
        "engine_steps": server.engine_steps if server else None,
        "engine_tokens": server.engine_tokens if server else None,
        "spec_acceptance": _ratio(server.spec_accepted_tokens, server.spec_draft_tokens) if server else None,
        "spec_accepted_per_draft": _ratio(server.spec_accepted_tokens, server.spec_drafts) if server else None,
        "preemptions": server.preemptions if server else None,
        "prefix_cache_hit_rate": server.prefix_cache_hit_rate if server else None,
        "prefix_cache_hits": server.prefix_cache_hits if server else None,
        "prefix_cache_queries": server.prefix_cache_queries if server else None,
        "offload_hit_rate": server.offload_hit_rate if server else None,
        "energy_j": gpu.energy_j if gpu else None,
        "energy_per_token_j": energy,
        "tokens_per_joule": 1.0 / energy if energy else None,
        "power_mean_w": gpu.power_mean_w if gpu else None,
        "sm_util_mean_pct": gpu.sm_util_mean_pct if gpu else None,
        "gpu_memory_peak_gib": gpu.memory_peak_gib if gpu else None,
        "telemetry_absent": absent,
    }


class MixedHardware(UserError, ValueError):
    """Measurements from more than one kind of machine: no table pools them into one median."""


def check_one_machine(runs: pl.DataFrame) -> None:
    """Refuse runs measured on different hardware (GPU names, or the CPU where there is none):
    keep each cluster's or GPU type's results in a folder of its own and aggregate each apart."""
    machines = sorted(set(runs.filter(pl.col("status") == "ok")["hardware"].to_list()))
    if len(machines) > 1:
        raise MixedHardware(
            f"results measured on {len(machines)} kinds of hardware ({'; '.join(machines)}) would pool into "
            "one median: aggregate each apart (speedsplit aggregate --results DIR per machine)"
        )


_INTERVALS = ["output_tok_s", "ttft_s_p99", "tpot_s_p99", "e2e_s_p99"] + [f"{m}_median" for m in LATENCY]
_INTERVALS += ["goodput_rps", "energy_per_token_j", "offered_rps"]
_INTERVALS += ["ttft_first_s_median", "ttft_return_s_median", "session_s_median"]
CELLS_TYPES = {
    "rate_rps": pl.Float64,
    "slo_met": pl.Boolean,
    "slo_violations": pl.List(pl.Utf8),
    "kv_cache_peak": pl.Float64,
    "waiting_mean": pl.Float64,
    "preemptions": pl.Float64,
    "prefix_cache_hit_rate": pl.Float64,
    "prefix_cache_hits": pl.Float64,
    "prefix_cache_queries": pl.Float64,
    "offload_hit_rate": pl.Float64,
    "power_mean_w": pl.Float64,
    "sm_util_mean_pct": pl.Float64,
    "tokens_per_chunk": pl.Float64,
    "telemetry_absent": pl.List(pl.Utf8),
    "statuses": pl.List(pl.Utf8),
    "flags": pl.List(pl.Utf8),
    "linear_kernel": pl.List(pl.Utf8),
    "kernel_ok": pl.Boolean,
    "startup_s": pl.Float64,
    "weight_memory_gib": pl.Float64,
    "card_memory_gib": pl.Float64,
    "kv_cache_gib": pl.Float64,
    "kv_cache_tokens": pl.Int64,
    **{f"{m}{end}": pl.Float64 for m in _INTERVALS for end in ("", "_lo", "_hi")},
}


def clean_runs(df: pl.DataFrame, tolerate_flags: Collection[str] = ()) -> tuple[pl.DataFrame, list[str]]:
    """The runs that may make a factor (status ok, a throughput, no flag beyond the tolerated
    ones) and, for each other run, why it was left out ("vllm-marlin run1: kernel_mismatch")."""
    keep, why = [], []
    for row in df.iter_rows(named=True):
        flags = [f for f in row["flags"] if f not in tolerate_flags]
        if row["status"] != "ok" or row["output_tok_s"] is None:
            why.append(f"{row['stack']} run{row['run']}: {row['status']}")
        elif flags:
            why.append(f"{row['stack']} run{row['run']}: {'+'.join(flags)}")
        else:
            keep.append(True)
            continue
        keep.append(False)
    return df.filter(pl.Series(keep, dtype=pl.Boolean)), why


def cells_frame(runs: pl.DataFrame, tolerate_flags: Collection[str] = ()) -> pl.DataFrame:
    """One row per (model, stack, topology, cell): each measured value over runs (the geometric
    mean, with its 95% t interval: speedsplit/analysis/run_estimates.py) from the runs a factor may
    use (clean_runs), else, where none is clean, from the flagged ones (values_from says which);
    telemetry as medians over those runs."""
    rows = []
    keys = CELL_KEYS[:3] + ["stack"] + CELL_KEYS[3:]
    for group, df in runs.group_by(keys, maintain_order=True):
        row = dict(zip(keys, group))
        ok, _ = clean_runs(df, tolerate_flags)
        row["values_from"] = "clean runs" if ok.height else "flagged runs (none clean)"
        if not ok.height:
            ok = df.filter(pl.col("status") == "ok")
        for metric in _INTERVALS:
            e = est.over_runs(ok[metric].to_list())
            row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = e.value, e.lo, e.hi
        judged = df["slo_met"].drop_nulls()
        row.update(
            slo_met=None if judged.is_empty() else bool(judged.all() and judged.len() == df.height),
            slo_violations=sorted({v for vs in df["slo_violations"].to_list() for v in vs}),
            kv_cache_peak=ok["kv_cache_peak"].max(),
            waiting_mean=_median_or_none(ok["waiting_mean"].drop_nulls().to_list()),
            preemptions=ok["preemptions"].sum() if ok["preemptions"].null_count() < ok.height else None,
            prefix_cache_hit_rate=_median_or_none(ok["prefix_cache_hit_rate"].drop_nulls().to_list()),
            # the counts behind the rate, summed over the runs (null: not read, or results from before)
            prefix_cache_hits=_sum_or_none(ok["prefix_cache_hits"]),
            prefix_cache_queries=_sum_or_none(ok["prefix_cache_queries"]),
            offload_hit_rate=_median_or_none(ok["offload_hit_rate"].drop_nulls().to_list()),
            power_mean_w=_median_or_none(ok["power_mean_w"].drop_nulls().to_list()),
            sm_util_mean_pct=_median_or_none(ok["sm_util_mean_pct"].drop_nulls().to_list()),
            telemetry_absent=sorted({a for xs in df["telemetry_absent"].to_list() for a in xs}),
            # above 1 the ITL is a chunk's gap, not a token's (a speculative decoder, a proxy)
            tokens_per_chunk=_median_or_none(ok["tokens_per_chunk"].drop_nulls().to_list()),
        )
        row.update(
            rate_rps=df["rate_rps"][0],  # open loop: the cell's arrival rate (null: closed loop or a trace)
            runs=df.height,
            runs_ok=ok.height,
            interval="95% t over runs",
            statuses=sorted(set(df["status"].to_list())),
            failed_requests=int(df["failed"].sum()),
            failures=_merge_counts(df["failures"].to_list()),
            flags=sorted({f for fl in df["flags"].to_list() for f in fl}),
            linear_kernel=sorted({k for k in df["linear_kernel"].to_list() if k}),
            kernel_ok=None if df["kernel_ok"].null_count() == df.height else bool(df["kernel_ok"].drop_nulls().all()),
            startup_s=_median_or_none(df["startup_s"].drop_nulls().to_list()),
            hardware=df["hardware"][0],
            platform=df["platform"][0],
            weight_memory_gib=_median_or_none(df["weight_memory_gib"].drop_nulls().to_list()),
            card_memory_gib=_median_or_none(df["card_memory_gib"].drop_nulls().to_list()),
            kv_cache_gib=_median_or_none(df["kv_cache_gib"].drop_nulls().to_list()),
            kv_cache_tokens=df["kv_cache_tokens"].drop_nulls().min(),  # the smallest cache a run had
            variant=df["variant"][0],
            tensor_parallel=df["tensor_parallel"][0],
            instances=df["instances"][0],
            model_shape=df["model_shape"][0],
        )
        rows.append(row)
    return pl.DataFrame(rows, schema_overrides=CELLS_TYPES, infer_schema_length=None)


def with_mbu(cells: pl.DataFrame, bandwidth_gb_s: float | None) -> pl.DataFrame:
    """Add each cell's model-bandwidth utilisation during decode (median inter-token latency
    as the step time) on the measured bandwidth; null where a number is missing."""
    values = []
    for row in cells.iter_rows(named=True):
        cfg = json.loads(row["model_shape"] or "{}")
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


def _sum_or_none(column: pl.Series) -> float | None:
    return float(column.sum()) if column.null_count() < column.len() else None


def _median_or_none(v: list[float]) -> float | None:
    return float(np.median(v)) if v else None


def _merge_counts(items: list[str]) -> str:
    total: dict[str, int] = {}
    for item in items:
        for k, n in json.loads(item).items():
            total[k] = total.get(k, 0) + n
    return json.dumps(total, sort_keys=True)
