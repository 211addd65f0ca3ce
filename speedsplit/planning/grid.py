"""The grid a validated config describes: its cells (users x workload x sampling, and the
capacity sweep's levels), the stacks and models it benchmarks, each cell's and each stack's
measurement definition (what a job file holds), the platform, and the optional analyses'
resolved sections. Every function takes the validated config (speedsplit/planning/config.py).
"""

from __future__ import annotations

import json

from dataclasses import dataclass
from typing import Any

from speedsplit.core.errors import ConfigError
from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.core.specs import OUTLIER_FACTOR, OUTLIER_MIN_S, CellSettings, StackSettings
from speedsplit.models.checkpoint import INT4_FORMATS
from speedsplit.planning.stack_config import StackConfig
from speedsplit.planning.workload_config import Trace
from speedsplit.planning.experiment import Experiment


INT4 = INT4_FORMATS  # the variants that serve 4-bit weights of a checkpoint
OUTLIER_DEFAULTS = {"outlier_factor": OUTLIER_FACTOR, "outlier_min_s": OUTLIER_MIN_S}


def kernel_reference(config: Experiment) -> str | None:
    """The FP16 stack the kernel plot compares INT4 kernels against (report.kernel_reference,
    else the stack before the first gptq stack of the first chain that has one)."""
    if config.report.kernel_reference:
        return config.report.kernel_reference
    for chain in config.chains.values():
        for before, stack in zip(chain, chain[1:]):
            if config.stacks[stack].variant in INT4:
                return before
    return None


def family(entry: StackConfig) -> str:
    """'vllm' for a stack that runs vLLM, 'llama.cpp' for llama.cpp's server, 'reference' for
    the server of known speed (speedsplit/serving/reference.py), else 'hf' (transformers serve,
    stock generate())."""
    if any("llama_server" in arg or "llama-server" in arg for arg in entry.args):
        return "llama.cpp"
    if "speedsplit.serving.reference" in entry.args:
        return "reference"
    return "vllm" if any("vllm" in arg for arg in entry.args) else "hf"


def weights(entry: StackConfig) -> str:
    """The weights a stack computes with: a 16-bit GGUF file holds the FP16 weights."""
    if entry.variant == "gguf":
        return "fp16" if entry.gguf_type in ("f16", "bf16") else f"gguf-{entry.gguf_type}"
    return entry.variant


def chain_steps(config: Experiment) -> dict[str, list[str]]:
    """What each step of each chain changes, in words, from the two stacks' definitions:
        'runtime' (HF to vLLM, same weights), 'INT4 weights + kernel' (FP16 to GPTQ or AWQ, when
        the chain has no later kernel step), 'INT4 format' and 'kernel' (when it has: GPTQ to GPTQ
        is a kernel change; GPTQ to AWQ is a format change), 'FP8 weights + activations' (to vLLM's
        FP8), 'GGUF Q8_0 weights' (to a llama.cpp quantized file), 'batch ceiling' (HF to HF, stock
        generate() at another --max-batch), 'scheduler' (HF to HF otherwise), 'prefix caching' (vLLM
        to vLLM, its prefix-caching switch alone), 'speculative decoding (ngram)' (to a vLLM stack
    with a --speculative-config, its method named), 'KV-cache offload (native)' (to a vLLM stack
    with --kv-offloading-size, its backend named), 'configuration' (one engine otherwise, same
        weights); 'runtime' also names a change of engine on the same 16-bit weights (vLLM FP16 to
        llama.cpp F16). Two steps of one chain that would read alike each name their stacks."""
    out = {}
    for name, chain in config.chains.items():
        entries = [config.stacks[s] for s in chain]  # a stack may come twice
        pairs = list(zip(entries, entries[1:]))
        kernel_split = any(a.variant == b.variant and a.variant in INT4 for a, b in pairs)
        steps = []
        for a, b in pairs:
            if weights(a) != weights(b):
                if b.variant in INT4:
                    steps.append("INT4 format" if kernel_split or a.variant in INT4 else "INT4 weights + kernel")
                elif b.variant == "gguf":
                    steps.append(f"GGUF {b.gguf_type.upper()} weights")
                else:
                    steps.append("FP8 weights + activations" if b.variant == "fp8" else "FP16 weights")
            elif b.variant in INT4:
                steps.append("kernel")
            elif family(a) != family(b):
                steps.append("runtime")
            elif family(b) == "hf":
                steps.append("batch ceiling" if _only(a, b, "--max-batch") else "scheduler")
            elif _speculative(b) and not _speculative(a):
                steps.append(f"speculative decoding ({_speculative(b)})")
            elif kv_offload(b) and not kv_offload(a):
                steps.append(f"KV-cache offload ({kv_offload(b)})")
            else:
                steps.append("prefix caching" if _only_prefix_caching(a, b) else "configuration")
        # one name, one step: where two steps of a chain would read alike, each names its stacks
        twice = {x for x in steps if steps.count(x) > 1}
        out[name] = [f"{x} ({c} → {d})" if x in twice else x for x, c, d in zip(steps, chain, chain[1:])]
    return out


def _only(a: StackConfig, b: StackConfig, flag: str) -> bool:
    """Whether two stacks' arguments differ only in one flag's value."""

    def without(args: list[str]) -> list[str]:
        return [x for i, x in enumerate(args) if x != flag and (i == 0 or args[i - 1] != flag)]

    return a.args != b.args and without(a.args) == without(b.args)


def _flag_json(args: list[str], flag: str) -> dict | None:
    """The JSON object after a flag in a stack's arguments (its braces, doubled for the
    placeholders, read single): {} where it is not one, None where the flag is absent."""
    if flag not in args[:-1]:
        return None
    try:
        value = json.loads(args[args.index(flag) + 1].replace("{{", "{").replace("}}", "}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _speculative(s: StackConfig) -> str | None:
    """The speculative method a stack's vLLM server is given (--speculative-config's method,
    else its draft model's), or None."""
    spec = _flag_json(s.args, "--speculative-config")
    if spec is None:
        return None
    return str(spec.get("method") or ("draft model" if spec.get("model") else "speculative"))


# vLLM's KV connectors that keep what the card evicts beyond it, by the backend they are
KV_OFFLOAD_CONNECTORS = {
    "OffloadingConnector": "native",
    "SimpleCPUOffloadConnector": "native",
    "LMCacheConnectorV1": "LMCache",  # LMCache in the engine's process (its CPU tier: LMCACHE_* env)
    "LMCacheMPConnector": "LMCache server",  # a standalone LMCache server's (vLLM 0.26's --kv-offloading-backend lmcache)
}


def kv_offload(s: StackConfig) -> str | None:
    """The KV-cache offload backend a stack's vLLM server is given, or None:
    --kv-offloading-size set (--kv-offloading-backend, native by default), or a
    --kv-transfer-config naming one of KV_OFFLOAD_CONNECTORS."""
    args = s.args + s.on_gpu.args + s.on_cpu.args
    if "--kv-offloading-size" in args:
        at = args.index("--kv-offloading-backend") if "--kv-offloading-backend" in args[:-1] else None
        backend = args[at + 1] if at is not None else "native"
        return "LMCache server" if backend == "lmcache" else backend
    told = _flag_json(args, "--kv-transfer-config")
    return KV_OFFLOAD_CONNECTORS.get(told.get("kv_connector")) if told is not None else None


def _only_prefix_caching(a: StackConfig, b: StackConfig) -> bool:
    """Whether two stacks' arguments differ in their prefix-caching switch alone
    (--no-enable-prefix-caching / --enable-prefix-caching)."""
    differ = set(a.args) ^ set(b.args)
    return bool(differ) and all("prefix-caching" in arg for arg in differ)


def factorial_spec(config: Experiment) -> dict | None:
    """The factorial section with its workload resolved, or None when it is off."""
    fa = config.factorial
    if not fa.enabled:
        return None
    return {**fa.model_dump(exclude_unset=True), "workload": fa.workload or cells(config)[0].workload}


def headline(config: Experiment) -> list[dict]:
    """The cells the report's first screen answers for: report.headline; with a capacity
    sweep and none given, each workload and sampling's grid cell with the most users (the
    ladder's top levels are past the cliff, often skipped); else empty (the answer's own
    default: the most users measured)."""
    given = config.report.headline
    if given or not config.capacity.enabled:
        return [h.model_dump(exclude_none=True) for h in given]
    top: dict[tuple[str, str], int] = {}
    for c in declared_cells(config):
        if c.users > top.get((c.workload, c.sampling), 0):
            top[(c.workload, c.sampling)] = c.users
    return [{"users": u, "workload": w, "sampling": s} for (w, s), u in top.items()]


def coordination_cell(config: Experiment) -> Cell:
    """The cell the coordination profile runs (coordination.cell, else the grid's first)."""
    name = config.coordination.cell
    return cell_by_name(config, name) if name else cells(config)[0]


def check_cluster_platform(config: Experiment) -> None:
    """For a run whose jobs go to other machines (a cluster executor): the machine that builds
    the DAG cannot resolve `platform: auto` for them."""
    if config.platform == "auto":
        raise ConfigError(
            "config key platform: 'auto' cannot be resolved for a cluster run (the submitting host "
            "decides nothing about the nodes): set platform to cuda or cpu (profiles/slurm sets cuda)"
        )


def platform_of(config: Experiment) -> str:
    """'cpu' or 'cuda'; 'auto' is cuda where nvidia-smi exists on the machine that asks."""
    if config.platform != "auto":
        return config.platform
    import shutil

    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def topology_gpus(config: Experiment, topology: str) -> int:
    topo = config.topologies[topology]
    return topo.tensor_parallel * topo.instances


def bench_models(config: Experiment) -> list[str]:
    """The models benchmarked: the list, else every model but those that only draft for a stack."""
    drafts = draft_models(config)
    return list(config.benchmark.models) or [m for m in config.models if m not in drafts]


def draft_models(config: Experiment, stacks: list[str] | None = None) -> set[str]:
    """The models some stack's speculative decoding drafts with (stacks.*.draft_model; of
    those stacks where named)."""
    names = config.stacks if stacks is None else stacks
    return {config.stacks[s].draft_model for s in names if config.stacks[s].draft_model}


def has_int4_stack(config: Experiment) -> bool:
    """Whether any benchmarked stack serves INT4 weights (GPTQ, AWQ)."""
    return any(config.stacks[s].variant in INT4 for s in bench_stacks(config))


def bench_stacks(config: Experiment, topology: str | None = None) -> list[str]:
    """Stacks to benchmark (in a topology): the explicit list, else every stack named by a
    chain, in order."""
    if config.benchmark.stacks:
        chosen = list(config.benchmark.stacks)
    else:
        chosen = []
        for members in config.chains.values():
            chosen += [s for s in members if s not in chosen]
        chosen = chosen or list(config.stacks)
    only = config.topologies[topology].stacks if topology else None
    return [s for s in chosen if s in only] if only else chosen


@dataclass(frozen=True)
class Cell:
    """One benchmark cell: concurrency (closed loop) or a request rate (open loop) x workload x
    sampling."""

    users: int  # closed loop; 0 for an open-loop cell
    workload: str
    sampling: str
    stacks: tuple[str, ...] = ()  # only these stacks measure it (empty: every one)
    runs: int | None = None  # fewer runs than grid.runs (capacity levels)
    below: tuple[str, ...] = ()  # capacity levels under it, ascending (empty: not a level)
    rate: float | None = None  # open loop: requests per second, a trace's speedup, or sessions a second
    kind: str = "closed"  # its workload's kind of load (closed, open, trace, sessions: core/loads.py)

    @property
    def name(self) -> str:
        if self.rate is not None:
            return f"{_RATE_PREFIX[self.kind]}{self.rate:g}-{self.workload}-{self.sampling}"
        return f"u{self.users}-{self.workload}-{self.sampling}"

    def measured_by(self, stack: str) -> bool:
        return not self.stacks or stack in self.stacks


# A workload's cells by its kind of load (core/loads.py), as (users, rate) pairs: closed loop a
# cell per grid.users; open loop a cell per rate, whatever the users; a trace a cell per speedup;
# sessions a cell per rate of sessions. A rate's cell is named by its kind's letter (the analysis
# reads the kind from each record's load, not from the name).
_LEVELS = {
    "closed": lambda w, users: [(u, None) for u in users],
    "open": lambda w, users: [(0, float(r)) for r in w.arrival.rates],
    "trace": lambda w, users: [(0, float(r)) for r in w.trace.speedups],
    "sessions": lambda w, users: [(0, float(r)) for r in w.sessions.rates],
}
_RATE_PREFIX = {"open": "r", "trace": "x", "sessions": "s"}


def declared_cells(config: Experiment) -> list[Cell]:
    """The cells the grid declares (its list, else its product): `cells` less the capacity
    sweep's levels."""
    g = config.grid

    def of(users: list[int], workload: str, sampling: str, stacks: tuple[str, ...] = ()) -> list[Cell]:
        w = config.workloads[workload]
        return [Cell(u, workload, sampling, stacks, rate=rate, kind=w.kind) for u, rate in _LEVELS[w.kind](w, users)]

    if g.cells:
        out = [cell for c in g.cells for cell in of([c.users], c.workload, c.sampling, tuple(c.stacks))]
        return list(dict.fromkeys(out))
    return [cell for w in g.workloads for s in g.sampling for cell in of(g.users, w, s)]


def cells(config: Experiment) -> list[Cell]:
    """Every cell measured: the grid's declared cells, then the capacity sweep's levels
    (ascending users, or rates for an open-loop workload) not already among them."""
    runs_at_most = config.grid.runs
    out = declared_cells(config)
    cap = config.capacity
    if cap.enabled:
        workload = cap.workload or out[0].workload
        if config.workloads[workload].arrival:
            levels = [Cell(0, workload, cap.sampling, rate=float(r), kind="open") for r in sorted(set(cap.rates or []))]
        else:
            levels = [Cell(u, workload, cap.sampling) for u in sorted(set(cap.users))]
        names = [c.name for c in levels]
        taken = {c.name for c in out}
        for i, level in enumerate(levels):
            if names[i] not in taken:
                runs = min(cap.runs, runs_at_most)
                out.append(
                    Cell(
                        level.users,
                        workload,
                        cap.sampling,
                        tuple(cap.stacks),
                        runs,
                        tuple(names[:i]),
                        level.rate,
                        level.kind,
                    )
                )
    return out


def capacity_spec(config: Experiment) -> dict | None:
    """The capacity section resolved (workload, reference stack), or None when it is off."""
    cap = config.capacity
    if not cap.enabled:
        return None
    return {
        **cap.model_dump(exclude_unset=True),
        "workload": cap.workload or cells(config)[0].workload,
        "reference": cap.reference or kernel_reference(config),
    }


def cell_by_name(config: Experiment, name: str) -> Cell:
    for cell in cells(config):
        if cell.name == name:
            return cell
    raise ConfigError(f"unknown cell {name!r}")


def cell_params(config: Experiment, cell: Cell) -> dict[str, Any]:
    """Everything that defines one cell's measurement, as plain builtins (Snakemake params):
    its job file. Timeouts change no measurement: they come from the plan (SessionPlan)."""
    w = config.workloads[cell.workload]
    s = config.sampling[cell.sampling]
    b = config.benchmark
    return {
        "cell": cell.name,
        "users": cell.users,
        "workload": cell.workload,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
        "requests_per_user": w.requests_per_user,
        "warmup_requests": w.warmup_requests,
        # each only where it is not its default: cells measured before a setting keep their params
        **CellSettings.job_form(w),
        # only those set: a cell without them keeps the params (and the results) it had
        **ClosedLoopSettings.of(w).job_form(),
        "warmup": b.warmup,
        "sampling": cell.sampling,
        "temperature": float(s.temperature),
        "top_p": float(s.top_p),
        "seed": s.seed,
        "min_measured_s": float(b.min_measured_s),
        # only where not the default: cells measured before the rule keep their params
        **{
            k: float(getattr(b, k)) for k in ("outlier_factor", "outlier_min_s") if getattr(b, k) != OUTLIER_DEFAULTS[k]
        },
        "telemetry_s": float(b.telemetry_s),
        # open loop: the arrivals and the length mix (closed-loop cells hold none of these)
        **(_open_loop(config, cell) if cell.rate is not None else {}),
        # a capacity level: the levels under it, and after how many failing ones it is skipped
        "capacity_below": list(cell.below),
        "capacity_stop_after": int(config.capacity.stop_after),
        "slo_ttft_p99_s": float(config.slo.ttft_p99_s),
        "slo_tpot_p99_s": float(config.slo.tpot_p99_s),
    }


def stack_params(config: Experiment, model: str, stack: str, topology: str) -> dict[str, Any]:
    """The resolved server definition for one (model, stack, topology) on this platform."""
    entry = config.stacks[stack]
    plat = platform_of(config)
    overlay = entry.on_gpu if plat == "cuda" else entry.on_cpu
    topo = config.topologies[topology]
    env = {**entry.env, **overlay.env}
    args = entry.args + overlay.args
    return {
        "stack": stack,
        "model": model,
        "topology": topology,
        "platform": plat,
        "variant": entry.variant,
        "args": args,
        "env": env,
        "dtype": overlay.dtype or ("float16" if plat == "cuda" else "bfloat16"),
        "dialect": entry.dialect,
        "ready_path": entry.ready_path,
        "request_model": entry.request_model,
        "expect_kernel": overlay.expect_kernel or entry.expect_kernel,
        "tensor_parallel": topo.tensor_parallel,
        "instances": topo.instances,
        "max_model_len": config.models[model].max_model_len,
        "cpu_isolation": config.benchmark.cpu_isolation,
        "card_memory_gib": entry.card_memory_gib or config.card_memory_gib,
        "memory_cap_args": entry.memory_cap_args,
        "kv_cache_gib": entry.kv_cache_gib,
        "host_cache_cap": plat == "cpu" and entry.on_cpu.host_cache_cap,
        # each only where it is not its default: every other stack's params (and finished cells) stay
        **StackSettings.job_form(entry),
    }


def _open_loop(config: Experiment, cell: Cell) -> dict[str, Any]:
    """An open-loop cell's arrivals (its rate) and length mix, its trace window (its speedup)
    or its sessions (their rate), and the client lag it tolerates."""
    w = config.workloads[cell.workload]
    lag = float(config.benchmark.max_client_lag_s)
    if cell.kind == "trace":
        return {"trace": trace_window(w.trace, cell.rate), "max_client_lag_s": lag}
    if cell.kind == "sessions":
        return {"sessions": w.sessions.schedule(float(cell.rate)).params(), "max_client_lag_s": lag}
    a = w.arrival
    span = {"requests": a.requests} if a.requests is not None else {"duration_s": float(a.duration_s)}
    arrival = {"pattern": a.pattern, "rate_rps": float(cell.rate), "burstiness": float(a.burstiness), **span}
    return {
        "arrival": arrival,
        "lengths": w.lengths.model_dump(exclude_unset=True) if w.lengths else None,
        "max_client_lag_s": lag,
    }


def trace_window(trace: Trace, speedup: float) -> dict:
    """A trace workload's window at one of its speedups (core/traffic.TraceWindow's fields)."""
    return {**trace.model_dump(exclude_unset=True, exclude={"speedups"}), "speedup": float(speedup)}
