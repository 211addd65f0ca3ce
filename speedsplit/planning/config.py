"""Load and validate the workflow config, and expand it into benchmark cells and sessions.

Every error is one line naming the key path and what was expected (ConfigError).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

from speedsplit.core.results import looks_secret, redact_secrets

SCHEMA_PATH = Path(__file__).resolve().parent / "schema.yaml"
# The embedded default experiment (a tiny synthesised model on CPU), beside the Snakefile.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"


class ConfigError(ValueError):
    """A config value is wrong; the message is one line naming the key."""


def _with_defaults(validator_class):
    """A validator that fills `default` values into the instance while validating."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    def fill_additional(validator, additional, instance, schema):
        # Defaults inside dict-of-objects entries (models.X, stacks.X, ...).
        if isinstance(instance, dict) and isinstance(additional, dict):
            extras = set(instance) - set(schema.get("properties", {}))
            for key in extras:
                yield from validator.descend(instance[key], additional, path=key)
        elif additional is False and isinstance(instance, dict):
            extras = sorted(set(instance) - set(schema.get("properties", {})))
            if extras:
                from jsonschema.exceptions import ValidationError

                allowed = ", ".join(sorted(schema.get("properties", {})))
                yield ValidationError(f"unknown key {extras[0]!r} (expected one of: {allowed})")

    return validators.extend(
        validator_class,
        {"properties": set_defaults, "additionalProperties": fill_additional},
    )


_Validator = _with_defaults(Draft202012Validator)


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _key_path(error) -> str:
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def validate(config: dict) -> dict:
    """Fill defaults, check the schema and cross-references; return the filled config."""
    config = copy.deepcopy(config) if config else {}
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        raise ConfigError(f"config error at {_key_path(e)}: {e.message}")
    _check_references(config)
    return config


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None


def load(*paths: str | Path, base: str | Path | None = DEFAULT_CONFIG) -> dict:
    """Read config files merged in order over the default config, as Snakemake merges
    `--configfile` over the Snakefile's `configfile:`; validate the result."""
    data: dict = read_yaml(base) if base else {}
    for path in paths:
        if base and Path(path).resolve() == Path(base).resolve():
            continue
        data = merge(data, read_yaml(path))
    return validate(data)


def merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_references(config: dict) -> None:
    stacks, workloads = config["stacks"], config["workloads"]
    for stack, entry in stacks.items():
        # Secrets reach servers through the environment only: anything written in the config
        # is copied into job files, results, the report and the server's own log.
        for prefix, part in (("", entry), ("on_cpu.", entry["on_cpu"]), ("on_gpu.", entry["on_gpu"])):
            for key, value in part.get("env", {}).items():
                if looks_secret(key) or redact_secrets(str(value)) != str(value):
                    raise ConfigError(
                        f"config error at stacks.{stack}.{prefix}env.{key}: a secret never goes into the config "
                        f"(a token, a password in a URL); export {key} instead: servers inherit it"
                    )
            for n, arg in enumerate(part.get("args", [])):
                if redact_secrets(str(arg)) != str(arg) and not arg.startswith("-"):
                    raise ConfigError(
                        f"config error at stacks.{stack}.{prefix}args[{n}]: a secret never goes into the config "
                        "(a token, a password in a URL); give it to the server through the environment"
                    )
                if arg.startswith("-") and looks_secret(arg.lstrip("-").split("=")[0]):
                    raise ConfigError(
                        f"config error at stacks.{stack}.{prefix}args[{n}]: {arg.split('=')[0]} would put a secret "
                        "into the config; give it to the server through the environment"
                    )
    for chain, members in config["chains"].items():
        for i, stack in enumerate(members):
            if stack not in stacks:
                raise ConfigError(
                    f"config error at chains.{chain}[{i}]: unknown stack {stack!r} (stacks: {', '.join(stacks)})"
                )
    for key, known in (("workloads", workloads), ("sampling", config["sampling"])):
        for i, name in enumerate(config["grid"][key]):
            if name not in known:
                raise ConfigError(
                    f"config error at grid.{key}[{i}]: unknown {key} entry {name!r} (known: {', '.join(known)})"
                )
    for i, c in enumerate(config["grid"]["cells"]):
        for key, known in (("workload", workloads), ("sampling", config["sampling"])):
            if c[key] not in known:
                raise ConfigError(f"config error at grid.cells[{i}].{key}: unknown {key} {c[key]!r}")
        for j, stack in enumerate(c.get("stacks", [])):
            if stack not in stacks:
                raise ConfigError(f"config error at grid.cells[{i}].stacks[{j}]: unknown stack {stack!r}")
    if not config["grid"]["workloads"]:
        config["grid"]["workloads"] = list(workloads)
    if not config["grid"]["sampling"]:
        config["grid"]["sampling"] = list(config["sampling"])
    for i, stack in enumerate(config["benchmark"]["stacks"]):
        if stack not in stacks:
            raise ConfigError(f"config error at benchmark.stacks[{i}]: unknown stack {stack!r}")
    for i, model in enumerate(config["benchmark"]["models"]):
        if model not in config["models"]:
            raise ConfigError(f"config error at benchmark.models[{i}]: unknown model {model!r}")
    for topo, entry in config["topologies"].items():
        for i, stack in enumerate(entry.get("stacks", [])):
            if stack not in stacks:
                raise ConfigError(f"config error at topologies.{topo}.stacks[{i}]: unknown stack {stack!r}")
    if not config["topologies"]:
        config["topologies"] = {"tp1": {"tensor_parallel": 1, "instances": 1}}
    for i, topo in enumerate(config["benchmark"]["topologies"]):
        if topo not in config["topologies"]:
            raise ConfigError(f"config error at benchmark.topologies[{i}]: unknown topology {topo!r}")
        need = topology_gpus(config, topo)
        if platform_of(config) == "cuda" and need > config["gpus_available"]:
            raise ConfigError(
                f"config error at topologies.{topo}: needs {need} GPUs but gpus_available is {config['gpus_available']}"
            )
    for model in bench_models(config):
        entry = config["models"][model]
        if entry["source"] == "hub" and not entry["repo"]:
            raise ConfigError(f"config error at models.{model}.repo: a hub model needs a repo id")
        for wname in {c.workload for c in cells(config)}:
            w = workloads[wname]
            if w["prompt_tokens"] + w["output_tokens"] > entry["max_model_len"]:
                raise ConfigError(
                    f"config error at workloads.{wname}: prompt_tokens + output_tokens = "
                    f"{w['prompt_tokens'] + w['output_tokens']} exceeds models.{model}.max_model_len "
                    f"({entry['max_model_len']})"
                )
    _check_coordination(config)
    _check_factorial(config)
    _check_report(config)
    _check_capacity(config)


def _check_coordination(config: dict) -> None:
    co = config["coordination"]
    if not co["enabled"]:
        return
    if co["stack"] not in config["stacks"] or config["stacks"][co["stack"]]["dialect"] != "vllm":
        raise ConfigError(f"config error at coordination.stack: {co['stack']!r} is not a vLLM stack of this config")
    for i, topo in enumerate(co["topologies"]):
        if topo not in config["topologies"] or config["topologies"][topo]["instances"] != 1:
            raise ConfigError(
                f"config error at coordination.topologies[{i}]: {topo!r} is not a single-instance topology"
            )
        if platform_of(config) == "cuda" and topology_gpus(config, topo) > config["gpus_available"]:
            raise ConfigError(
                f"config error at coordination.topologies[{i}]: {topo!r} needs more GPUs than gpus_available"
            )
    if co["cell"] is not None and co["cell"] not in {c.name for c in cells(config)}:
        raise ConfigError(f"config error at coordination.cell: unknown cell {co['cell']!r}")


def _check_factorial(config: dict) -> None:
    fa = config["factorial"]
    if not fa["enabled"]:
        return
    for key in ("fast", "low", "high"):
        if fa[key] not in config["stacks"]:
            raise ConfigError(f"config error at factorial.{key}: unknown stack {fa[key]!r}")
    for i, name in enumerate(fa["sampling"]):
        if name not in config["sampling"]:
            raise ConfigError(f"config error at factorial.sampling[{i}]: unknown sampling {name!r}")
    if fa["workload"] is not None and fa["workload"] not in config["workloads"]:
        raise ConfigError(f"config error at factorial.workload: unknown workload {fa['workload']!r}")


def _check_report(config: dict) -> None:
    rep = config["report"]
    for i, h in enumerate(rep["headline"]):
        if h["workload"] not in config["workloads"]:
            raise ConfigError(f"config error at report.headline[{i}].workload: unknown workload {h['workload']!r}")
        if "sampling" in h and h["sampling"] not in config["sampling"]:
            raise ConfigError(f"config error at report.headline[{i}].sampling: unknown sampling {h['sampling']!r}")
    if rep["kernel_reference"] is not None and rep["kernel_reference"] not in config["stacks"]:
        raise ConfigError(f"config error at report.kernel_reference: unknown stack {rep['kernel_reference']!r}")


def kernel_reference(config: dict) -> str | None:
    """The FP16 stack the kernel plot compares INT4 kernels against (report.kernel_reference,
    else the stack before the first gptq stack of the first chain that has one)."""
    if config["report"]["kernel_reference"]:
        return config["report"]["kernel_reference"]
    for chain in config["chains"].values():
        for before, stack in zip(chain, chain[1:]):
            if config["stacks"][stack]["variant"] == "gptq":
                return before
    return None


def _check_capacity(config: dict) -> None:
    cap = config["capacity"]
    if not cap["enabled"]:
        return
    for i, stack in enumerate(cap["stacks"]):
        if stack not in config["stacks"]:
            raise ConfigError(f"config error at capacity.stacks[{i}]: unknown stack {stack!r}")
    if cap["workload"] is not None and cap["workload"] not in config["workloads"]:
        raise ConfigError(f"config error at capacity.workload: unknown workload {cap['workload']!r}")
    if cap["sampling"] not in config["sampling"]:
        raise ConfigError(f"config error at capacity.sampling: unknown sampling {cap['sampling']!r}")
    if cap["reference"] is not None and cap["reference"] not in config["stacks"]:
        raise ConfigError(f"config error at capacity.reference: unknown stack {cap['reference']!r}")


def _family(entry: dict) -> str:
    """'vllm' for a stack that runs vLLM, else 'hf' (transformers serve, stock generate())."""
    return "vllm" if any("vllm" in arg for arg in entry["args"]) else "hf"


def chain_steps(config: dict) -> dict[str, list[str]]:
    """What each step of each chain changes, in words, from the two stacks' definitions:
    'runtime' (HF to vLLM, same weights), 'INT4 weights + kernel' (FP16 to GPTQ, when the chain
    has no later kernel step), 'INT4 format' and 'kernel' (when it has: GPTQ to GPTQ is a
    kernel change), 'scheduler' (HF to HF), 'configuration' (vLLM to vLLM, same weights)."""
    out = {}
    for name, chain in config["chains"].items():
        entries = [config["stacks"][s] for s in chain]
        pairs = list(zip(entries, entries[1:]))
        kernel_split = any(a["variant"] == b["variant"] == "gptq" for a, b in pairs)
        steps = []
        for a, b in pairs:
            if a["variant"] != b["variant"]:
                steps.append(
                    ("INT4 format" if kernel_split else "INT4 weights + kernel")
                    if b["variant"] == "gptq"
                    else "FP16 weights"
                )
            elif b["variant"] == "gptq":
                steps.append("kernel")
            elif _family(a) != _family(b):
                steps.append("runtime")
            else:
                steps.append("scheduler" if _family(b) == "hf" else "configuration")
        out[name] = steps
    return out


def factorial_spec(config: dict) -> dict | None:
    """The factorial section with its workload resolved, or None when it is off."""
    fa = config["factorial"]
    if not fa["enabled"]:
        return None
    return {**fa, "workload": fa["workload"] or cells(config)[0].workload}


def headline(config: dict) -> list[dict]:
    """The cells the report's first screen answers for: report.headline; with a capacity
    sweep and none given, each workload and sampling's grid cell with the most users (the
    ladder's top levels are past the cliff, often skipped); else empty (the answer's own
    default: the most users measured)."""
    if config["report"]["headline"] or not config["capacity"]["enabled"]:
        return list(config["report"]["headline"])
    top: dict[tuple[str, str], int] = {}
    for c in grid_cells(config):
        if c.users > top.get((c.workload, c.sampling), 0):
            top[(c.workload, c.sampling)] = c.users
    return [{"users": u, "workload": w, "sampling": s} for (w, s), u in top.items()]


def coordination_cell(config: dict) -> Cell:
    """The cell the coordination profile runs (coordination.cell, else the grid's first)."""
    name = config["coordination"]["cell"]
    return cell_by_name(config, name) if name else cells(config)[0]


def check_cluster_platform(config: dict) -> None:
    """For a run whose jobs go to other machines (a cluster executor): the machine that builds
    the DAG cannot resolve `platform: auto` for them."""
    if config.get("platform", "auto") == "auto":
        raise ConfigError(
            "config key platform: 'auto' cannot be resolved for a cluster run (the submitting host "
            "decides nothing about the nodes): set platform to cuda or cpu (profiles/slurm sets cuda)"
        )


def platform_of(config: dict) -> str:
    """'cpu' or 'cuda'; 'auto' is cuda where nvidia-smi exists on the machine that asks."""
    if config.get("platform", "auto") != "auto":
        return config["platform"]
    import shutil

    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def topology_gpus(config: dict, topology: str) -> int:
    topo = config["topologies"][topology]
    return topo.get("tensor_parallel", 1) * topo.get("instances", 1)


def bench_models(config: dict) -> list[str]:
    return list(config["benchmark"]["models"]) or list(config["models"])


def has_int4_stack(config: dict) -> bool:
    """Whether any benchmarked stack serves GPTQ INT4 weights."""
    return any(config["stacks"][s]["variant"] == "gptq" for s in bench_stacks(config))


def bench_stacks(config: dict, topology: str | None = None) -> list[str]:
    """Stacks to benchmark (in a topology): the explicit list, else every stack named by a
    chain, in order."""
    if config["benchmark"]["stacks"]:
        chosen = list(config["benchmark"]["stacks"])
    else:
        chosen = []
        for members in config["chains"].values():
            chosen += [s for s in members if s not in chosen]
        chosen = chosen or list(config["stacks"])
    only = config["topologies"][topology].get("stacks") if topology else None
    return [s for s in chosen if s in only] if only else chosen


@dataclass(frozen=True)
class Cell:
    """One benchmark cell: concurrency x workload x sampling."""

    users: int
    workload: str
    sampling: str
    stacks: tuple[str, ...] = ()  # only these stacks measure it (empty: every one)
    runs: int | None = None  # fewer runs than grid.runs (capacity levels)
    below: tuple[str, ...] = ()  # capacity levels under it, ascending (empty: not a level)

    @property
    def name(self) -> str:
        return f"u{self.users}-{self.workload}-{self.sampling}"

    def measured_by(self, stack: str) -> bool:
        return not self.stacks or stack in self.stacks


def grid_cells(config: dict) -> list[Cell]:
    """The grid's cells (its list, else its product), without the capacity sweep's levels."""
    g = config["grid"]
    if g["cells"]:
        return [Cell(c["users"], c["workload"], c["sampling"], tuple(c.get("stacks", ()))) for c in g["cells"]]
    return [Cell(u, w, s) for w in g["workloads"] for s in g["sampling"] for u in g["users"]]


def cells(config: dict) -> list[Cell]:
    """The grid's cells, then the capacity sweep's levels (ascending users) not already in it."""
    g = config["grid"]
    out = grid_cells(config)
    cap = config.get("capacity") or {}
    if cap.get("enabled"):
        workload = cap["workload"] or out[0].workload
        levels = sorted(set(cap["users"]))
        names = [Cell(u, workload, cap["sampling"]).name for u in levels]
        taken = {c.name for c in out}
        for i, users in enumerate(levels):
            if names[i] not in taken:
                runs = min(cap["runs"], g["runs"])
                out.append(Cell(users, workload, cap["sampling"], tuple(cap["stacks"]), runs, tuple(names[:i])))
    return out


def capacity_spec(config: dict) -> dict | None:
    """The capacity section resolved (workload, reference stack), or None when it is off."""
    cap = config["capacity"]
    if not cap["enabled"]:
        return None
    return {
        **cap,
        "workload": cap["workload"] or cells(config)[0].workload,
        "reference": cap["reference"] or kernel_reference(config),
    }


def cell_by_name(config: dict, name: str) -> Cell:
    for cell in cells(config):
        if cell.name == name:
            return cell
    raise ConfigError(f"unknown cell {name!r}")


def cell_params(config: dict, cell: Cell) -> dict[str, Any]:
    """Everything that defines one cell's measurement, as plain builtins (Snakemake params):
    its job file. Timeouts change no measurement: they come from the plan (SessionPlan)."""
    w = config["workloads"][cell.workload]
    s = config["sampling"][cell.sampling]
    b = config["benchmark"]
    return {
        "cell": cell.name,
        "users": cell.users,
        "workload": cell.workload,
        "prompt_tokens": w["prompt_tokens"],
        "output_tokens": w["output_tokens"],
        "requests_per_user": w["requests_per_user"],
        "warmup_requests": w["warmup_requests"],
        # only when set: a cell without a ramp keeps the params (and the results) it had
        **({"ramp_s": float(w["ramp_s"])} if w["ramp_s"] else {}),
        "warmup": b["warmup"],
        "sampling": cell.sampling,
        "temperature": float(s["temperature"]),
        "top_p": float(s["top_p"]),
        "seed": s["seed"],
        "min_measured_s": float(b["min_measured_s"]),
        "telemetry_s": float(b["telemetry_s"]),
        # a capacity level: the levels under it, and after how many failing ones it is skipped
        "capacity_below": list(cell.below),
        "capacity_stop_after": int(config["capacity"]["stop_after"]),
        "slo_ttft_p99_s": float(config["slo"]["ttft_p99_s"]),
        "slo_tpot_p99_s": float(config["slo"]["tpot_p99_s"]),
    }


def stack_params(config: dict, model: str, stack: str, topology: str) -> dict[str, Any]:
    """The resolved server definition for one (model, stack, topology) on this platform."""
    entry = config["stacks"][stack]
    plat = platform_of(config)
    overlay = entry["on_gpu"] if plat == "cuda" else entry["on_cpu"]
    topo = config["topologies"][topology]
    env = {**entry["env"], **overlay.get("env", {})}
    args = list(entry["args"]) + list(overlay.get("args", []))
    return {
        "stack": stack,
        "model": model,
        "topology": topology,
        "platform": plat,
        "variant": entry["variant"],
        "args": args,
        "env": env,
        "dtype": overlay.get("dtype") or ("float16" if plat == "cuda" else "bfloat16"),
        "dialect": entry["dialect"],
        "ready_path": entry["ready_path"],
        "request_model": entry["request_model"],
        "expect_kernel": overlay.get("expect_kernel") or entry["expect_kernel"],
        "tensor_parallel": topo["tensor_parallel"],
        "instances": topo["instances"],
        "max_model_len": config["models"][model]["max_model_len"],
        "cpu_isolation": plat == "cuda" and config["benchmark"]["cpu_isolation"],
        "card_memory_gib": entry["card_memory_gib"] or config["card_memory_gib"],
        "memory_cap_args": list(entry["memory_cap_args"]),
        "host_cache_cap": plat == "cpu" and entry["on_cpu"]["host_cache_cap"],
    }
