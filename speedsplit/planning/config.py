"""Load and validate the workflow config: merge the files over the default, check it against
the schema generated from the experiment's types (planning/experiment.py: each key's default,
bound and description is declared once, in its section's type) and fill its defaults, type it
once as an `Experiment`, and check every cross-reference. What the experiment then describes
(cells, stacks, specs) is speedsplit/planning/grid.py; its jobs, speedsplit/planning/plan.py.

Every error is one line naming the key path and what was expected (ConfigError). What serving
the models needs beyond the config (checkpoints, weight formats, llama.cpp's tools) is checked
in speedsplit/planning/model_checks.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator, validators

from speedsplit.core.errors import ConfigError
from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.core.results import looks_secret, redact_secrets
from speedsplit.planning.extends import resolve_stacks
from speedsplit.planning.grid import (
    bench_models,
    bench_stacks,
    cells,
    family,
    declared_cells,
    draft_models,
    kv_offload,
    platform_of,
    topology_gpus,
    trace_window,
)
from speedsplit.planning import experiment, model_config, quality_config, workload_config
from speedsplit.planning.experiment import Experiment
from speedsplit.planning.model_checks import check_formats, check_own_weights

# The embedded default experiment (a tiny synthesised model on CPU), beside the Snakefile.
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"


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
    """The config's JSON Schema, generated from the experiment's types (planning/experiment.py)."""
    return experiment.json_schema()


def _key_path(error) -> str:
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def check_paths(folder: str, python: str) -> None:
    """Refuse, in one line, paths that a tool below cannot take: a space in the Python that runs
    the jobs (Snakemake's script: jobs run it unquoted: exit 127) or in the working folder
    (vLLM's compile cache under results/cache: Inductor's g++ command splits the path)."""
    if " " in python:
        raise ConfigError(
            f"the Python that runs the jobs ({python}) has a space in its path: Snakemake's script: jobs run it "
            "unquoted; make the virtual environment in a folder without one"
        )
    if " " in folder:
        raise ConfigError(
            f"the working folder ({folder}) has a space in its path: vLLM's compile cache under results/cache "
            "breaks there (Inductor's g++ splits the path); run from a folder without one"
        )


def validate(config: dict) -> Experiment:
    """Resolve stacks that extend stacks, check the schema (a one-line error naming the key path)
    and fill its defaults, type the whole once and check every cross-reference."""
    config = resolve_stacks(copy.deepcopy(config)) if config else {}
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        raise ConfigError(f"config error at {_key_path(e)}: {e.message}")
    _fill_derived(config)
    typed = Experiment.model_validate(config)
    typed._filled = config
    _check_references(typed)
    return typed


def _fill_derived(config: dict) -> None:
    """The defaults that depend on other keys: the grid's workloads and sampling (every one of
    the config's), one single-card topology where none is named, and lm-evaluation-harness's task
    folder beside the workflow (config/tasks/...) where the working folder has none of its name."""
    grid = config["grid"]
    grid["workloads"] = grid["workloads"] or list(config["workloads"])
    grid["sampling"] = grid["sampling"] or list(config["sampling"])
    if not config["topologies"]:
        config["topologies"] = {"tp1": {"tensor_parallel": 1, "instances": 1}}
    q, lm = config["quality"], config["quality"]["lm_eval"]
    here = Path(lm["include_path"])
    shipped = DEFAULT_CONFIG.parents[1] / here
    if q["enabled"] and lm["tasks"] and lm["include_path"] and not here.is_dir() and not here.is_absolute():
        if shipped.is_dir():
            lm["include_path"] = str(shipped)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path}{where} is not valid YAML: {what}") from None


def load(*paths: str | Path, base: str | Path | None = DEFAULT_CONFIG) -> Experiment:
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


def _tokenizer_of(model: model_config.ModelConfig) -> tuple:
    """What makes a synthetic model's tokenizer: its kind and vocabulary size and, learnt, the
    text it was learnt from."""
    from speedsplit.models.checkpoint import shape_config

    trained = model.weights == "trained"
    vocab = None if model.tokenizer == "gpt2" and not trained else shape_config(model.shape)["vocab_size"]
    return (model.tokenizer, vocab, trained and (model.training.corpus, model.training.corpus_bytes))


def _check_draft(config: Experiment, stack: str, entry) -> None:
    """A benchmarked stack's draft model is a model of the config whose tokenizer is the served
    models' (synthetic models: the same tokenizer kind and, trained, the same learnt one)."""
    if not entry.draft_model:
        return
    where = f"config error at stacks.{stack}.draft_model"
    if entry.draft_model not in config.models:
        raise ConfigError(f"{where}: unknown model {entry.draft_model!r} (known: {', '.join(config.models)})")
    if "{draft_dir}" not in " ".join(entry.args + entry.on_gpu.args + entry.on_cpu.args):
        raise ConfigError(f"{where}: the stack's args never name {{draft_dir}}, so its server would not use the draft")
    draft = config.models[entry.draft_model]
    for name in bench_models(config):
        served = config.models[name]
        if draft.source == served.source == "synthetic" and _tokenizer_of(draft) != _tokenizer_of(served):
            raise ConfigError(
                f"{where}: {entry.draft_model} and models.{name} have different tokenizers (a draft must share the "
                "served model's)"
            )


def _check_references(config: Experiment) -> None:
    stacks, workloads = config.stacks, config.workloads
    for stack, entry in config.stacks.items():
        # Secrets reach servers through the environment only: anything written in the config
        # is copied into job files, results, the report and the server's own log.
        for prefix, part in (("", entry), ("on_cpu.", entry.on_cpu), ("on_gpu.", entry.on_gpu)):
            for key, value in part.env.items():
                if looks_secret(key) or redact_secrets(str(value)) != str(value):
                    raise ConfigError(
                        f"config error at stacks.{stack}.{prefix}env.{key}: a secret never goes into the config "
                        f"(a token, a password in a URL); export {key} instead: servers inherit it"
                    )
            for n, arg in enumerate(part.args):
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
        if entry.kv_cache_gib is not None and family(entry) != "vllm":
            raise ConfigError(
                f"config error at stacks.{stack}.kv_cache_gib: only a vLLM stack sizes its KV cache by a flag"
            )
    for chain, members in config.chains.items():
        for i, stack in enumerate(members):
            if stack not in stacks:
                raise ConfigError(
                    f"config error at chains.{chain}[{i}]: unknown stack {stack!r} (stacks: {', '.join(stacks)})"
                )
    for name in workloads:  # a closed loop's settings mean nothing to arrivals on a schedule
        w = config.workloads[name]
        if w.text != "random" and (w.kind in ("trace", "sessions") or (w.lengths and w.lengths.shared_prefix_tokens)):
            raise ConfigError(
                f"config error at workloads.{name}.text: {w.text} prompts are for a closed or open loop without a "
                f"shared prefix, and this workload {'has a shared prefix' if w.kind == 'open' else 'is ' + w.kind}"
            )
        for key in ClosedLoopSettings.of(w).job_form() if w.kind != "closed" else ():
            raise ConfigError(
                f"config error at workloads.{name}.{key}: a closed loop's setting, and this workload is "
                f"{'a trace replay' if w.kind == 'trace' else 'open loop (arrival)'}"
            )
    for key, known in (("workloads", workloads), ("sampling", config.sampling)):
        for i, name in enumerate(getattr(config.grid, key)):
            if name not in known:
                raise ConfigError(
                    f"config error at grid.{key}[{i}]: unknown {key} entry {name!r} (known: {', '.join(known)})"
                )
    for i, c in enumerate(config.grid.cells):
        for key, known in (("workload", workloads), ("sampling", config.sampling)):
            if getattr(c, key) not in known:
                raise ConfigError(f"config error at grid.cells[{i}].{key}: unknown {key} {getattr(c, key)!r}")
        for j, stack in enumerate(c.stacks):
            if stack not in stacks:
                raise ConfigError(f"config error at grid.cells[{i}].stacks[{j}]: unknown stack {stack!r}")
    bench = config.benchmark
    for i, stack in enumerate(bench.stacks):
        if stack not in stacks:
            raise ConfigError(f"config error at benchmark.stacks[{i}]: unknown stack {stack!r}")
    for i, model in enumerate(bench.models):
        if model not in config.models:
            raise ConfigError(f"config error at benchmark.models[{i}]: unknown model {model!r}")
    for stack in bench_stacks(config):
        _check_draft(config, stack, config.stacks[stack])
    if platform_of(config) == "cpu":
        for stack in bench_stacks(config):
            backend = kv_offload(config.stacks[stack])
            if backend:
                why = (
                    "LMCache's kernels are built for CUDA (its wheel links libcudart)"
                    if backend.startswith("LMCache")
                    else "vLLM offloads its KV cache on CUDA and XPU GPUs only (its CPU build refuses: 'CPU "
                    "Offloading is currently only supported on CUDA-alike and XPU GPUs')"
                )
                raise ConfigError(
                    f"config error at stacks.{stack}: {why}; measure this stack on a GPU (the reference server's "
                    "--offload-cache-tokens rehearses the step)"
                )
    for topo, entry in config.topologies.items():
        for i, stack in enumerate(entry.stacks):
            if stack not in stacks:
                raise ConfigError(f"config error at topologies.{topo}.stacks[{i}]: unknown stack {stack!r}")
    for i, topo in enumerate(bench.topologies):
        if topo not in config.topologies:
            raise ConfigError(f"config error at benchmark.topologies[{i}]: unknown topology {topo!r}")
        need = topology_gpus(config, topo)
        if platform_of(config) == "cuda" and need > config.gpus_available:
            raise ConfigError(
                f"config error at topologies.{topo}: needs {need} GPUs but gpus_available is {config.gpus_available}"
            )
    link = config.link_control
    if link.enabled and platform_of(config) == "cuda" and link.gpus > config.gpus_available:
        raise ConfigError(
            f"config error at link_control.gpus: the control leases {link.gpus} GPUs but gpus_available is "
            f"{config.gpus_available}"
        )
    _check_capacity(config)  # before cells(config) below reads the capacity sweep's workload
    # the benchmarked models, and those a benchmarked stack drafts with (the model rule makes both)
    benched = bench_models(config)
    drafts = draft_models(config, bench_stacks(config)) - set(benched)
    for model in [*benched, *sorted(drafts)]:
        entry = config.models[model]
        if entry.source == "hub" and not entry.repo:
            raise ConfigError(f"config error at models.{model}.repo: a hub model needs a repo id")
        check_own_weights(config, model, entry)
        if model in drafts:
            continue  # a draft serves no workload of its own
        for wname in {c.workload for c in cells(config) if c.kind != "trace"}:
            w = config.workloads[wname]
            held = _session_context(w, wname)
            if held > entry.max_model_len:
                how = (
                    "its turns' new tokens and answers, the trace's times length_scale"
                    if w.sessions.trace
                    else "prompt_tokens + (turns - 1) x (output_tokens + turn_tokens) + output_tokens"
                )
                raise ConfigError(
                    f"config error at workloads.{wname}.sessions: a session's last turn holds {held} tokens ({how}), "
                    f"beyond models.{model}.max_model_len ({entry.max_model_len})"
                )
            if w.prompt_tokens + w.output_tokens > entry.max_model_len:
                raise ConfigError(
                    f"config error at workloads.{wname}: prompt_tokens + output_tokens = "
                    f"{w.prompt_tokens + w.output_tokens} exceeds models.{model}.max_model_len "
                    f"({entry.max_model_len})"
                )
    check_formats(config)
    _check_quality(config.quality)
    _check_traffic(config)
    _check_coordination(config)
    _check_mechanism(config)
    _check_factorial(config)
    _check_report(config)


def _check_quality(q: quality_config.QualityConfig) -> None:
    if not q.enabled:
        return
    if q.prompt_tokens > q.window_tokens:
        raise ConfigError(
            f"config error at quality.prompt_tokens: {q.prompt_tokens} is more than quality.window_tokens "
            f"({q.window_tokens}): a continuation's prompt is the start of a window"
        )
    lm = q.lm_eval
    if lm.tasks:
        from speedsplit.core.quality import LM_EVAL_INSTALL, lm_eval_installed

        if not lm_eval_installed():
            raise ConfigError(
                f"config error at quality.lm_eval.tasks: lm-evaluation-harness is not installed ({LM_EVAL_INSTALL})"
            )
        # a relative folder: in the working directory, else beside the workflow (_fill_derived)
        if lm.include_path and not Path(lm.include_path).is_dir():
            raise ConfigError(f"config error at quality.lm_eval.include_path: {lm.include_path} is not a folder")


def _check_coordination(config: Experiment) -> None:
    co = config.coordination
    if not co.enabled:
        return
    if co.stack not in config.stacks or family(config.stacks[co.stack]) != "vllm":
        raise ConfigError(f"config error at coordination.stack: {co.stack!r} is not a vLLM stack of this config")
    for i, topo in enumerate(co.topologies):
        if topo not in config.topologies or config.topologies[topo].instances != 1:
            raise ConfigError(
                f"config error at coordination.topologies[{i}]: {topo!r} is not a single-instance topology"
            )
        if platform_of(config) == "cuda" and topology_gpus(config, topo) > config.gpus_available:
            raise ConfigError(
                f"config error at coordination.topologies[{i}]: {topo!r} needs more GPUs than gpus_available"
            )
    if co.cell is not None and co.cell not in {c.name for c in cells(config)}:
        raise ConfigError(f"config error at coordination.cell: unknown cell {co.cell!r}")


def _check_mechanism(config: Experiment) -> None:
    pr = config.mechanism.profile
    known = {c.name: c for c in cells(config)}
    for i, name in enumerate(pr.cells):
        if name not in known:
            raise ConfigError(f"config error at mechanism.profile.cells[{i}]: unknown cell {name!r}")
        if not known[name].users:  # the window is one request per user, all decoding together
            raise ConfigError(
                f"config error at mechanism.profile.cells[{i}]: {name!r} is an open-loop or trace cell "
                "(a profiled window is one request per user of a closed-loop cell)"
            )
    for i, name in enumerate(pr.stacks or []):
        if name not in config.stacks or family(config.stacks[name]) != "vllm":
            raise ConfigError(
                f"config error at mechanism.profile.stacks[{i}]: {name!r} is not a vLLM stack of this config "
                "(the profiler is vLLM's)"
            )


def _check_factorial(config: Experiment) -> None:
    fa = config.factorial
    if not fa.enabled:
        return
    for key in ("fast", "low", "high"):
        if getattr(fa, key) not in config.stacks:
            raise ConfigError(f"config error at factorial.{key}: unknown stack {getattr(fa, key)!r}")
    for i, name in enumerate(fa.sampling):
        if name not in config.sampling:
            raise ConfigError(f"config error at factorial.sampling[{i}]: unknown sampling {name!r}")
    if fa.workload is not None and fa.workload not in config.workloads:
        raise ConfigError(f"config error at factorial.workload: unknown workload {fa.workload!r}")


def _check_report(config: Experiment) -> None:
    rep = config.report
    for i, h in enumerate(rep.headline):
        if h.workload not in config.workloads:
            raise ConfigError(f"config error at report.headline[{i}].workload: unknown workload {h.workload!r}")
        if h.sampling is not None and h.sampling not in config.sampling:
            raise ConfigError(f"config error at report.headline[{i}].sampling: unknown sampling {h.sampling!r}")
    if rep.kernel_reference is not None and rep.kernel_reference not in config.stacks:
        raise ConfigError(f"config error at report.kernel_reference: unknown stack {rep.kernel_reference!r}")


def _check_capacity(config: Experiment) -> None:
    cap = config.capacity
    if not cap.enabled:
        return
    for i, stack in enumerate(cap.stacks):
        if stack not in config.stacks:
            raise ConfigError(f"config error at capacity.stacks[{i}]: unknown stack {stack!r}")
    if cap.workload is not None and cap.workload not in config.workloads:
        raise ConfigError(f"config error at capacity.workload: unknown workload {cap.workload!r}")
    workload = config.workloads[cap.workload or declared_cells(config)[0].workload]
    if workload.trace or workload.sessions:
        raise ConfigError(
            f"config error at capacity.workload: a {workload.kind} workload sets its own load; sweep users or an "
            "arrival workload"
        )
    if workload.arrival and not cap.rates:
        raise ConfigError("config error at capacity.rates: an open-loop capacity workload needs its ladder of rates")
    if cap.sampling not in config.sampling:
        raise ConfigError(f"config error at capacity.sampling: unknown sampling {cap.sampling!r}")
    if cap.reference is not None and cap.reference not in config.stacks:
        raise ConfigError(f"config error at capacity.reference: unknown stack {cap.reference!r}")


def _session_context(w: workload_config.WorkloadConfig, name: str) -> int:
    """The tokens the longest session's last turn holds (0: not a sessions workload); a session
    trace that cannot be read is a one-line error naming it."""
    from speedsplit.core import traffic

    if not w.sessions:
        return 0
    s = w.sessions
    if s.trace is not None and (s.turns is not None or s.turn_tokens is not None):
        raise ConfigError(
            f"config error at workloads.{name}.sessions: turns and turn_tokens come from the trace: give one"
        )
    if s.trace is None and None in (s.count, s.turns, s.turn_tokens):
        raise ConfigError(
            f"config error at workloads.{name}.sessions: count, turns and turn_tokens are needed without a trace"
        )
    try:
        return s.schedule(1.0).context_tokens(w.prompt_tokens, w.output_tokens)
    except traffic.TrafficError as exc:
        raise ConfigError(f"config error at workloads.{name}.sessions.trace: {exc}") from None


def _check_traffic(config: Experiment) -> None:
    """Each open-loop workload's schedule can be built for every model it is measured on: a
    length file that exists and parses, lengths within each model's context."""
    from speedsplit.core import traffic

    for name in {c.workload for c in cells(config)}:
        w = config.workloads[name]
        given = [k for k in ("arrival", "trace", "sessions") if getattr(w, k) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"config error at workloads.{name}: {' and '.join(given)} are two kinds of load; give one"
            )
        if w.sessions and w.sessions.shared_prefix_tokens > w.prompt_tokens:
            raise ConfigError(
                f"config error at workloads.{name}.sessions.shared_prefix_tokens: {w.sessions.shared_prefix_tokens} "
                f"is more than the first prompt's prompt_tokens ({w.prompt_tokens})"
            )
    for name in {c.workload for c in cells(config) if c.kind == "trace"}:
        t = config.workloads[name].trace
        for model in bench_models(config):
            try:
                window = traffic.TraceWindow(**trace_window(t, t.speedups[0]))
                traffic.read_trace(window, config.models[model].max_model_len)
            except traffic.TrafficError as exc:
                raise ConfigError(f"config error at workloads.{name}.trace: {exc} (models.{model})") from None
    for name in {c.workload for c in cells(config) if c.kind == "open"}:
        w = config.workloads[name]
        mix = w.lengths.model_dump(exclude_unset=True) if w.lengths else {}
        if w.lengths and w.lengths.kind == "file" and not w.lengths.path:
            raise ConfigError(f"config error at workloads.{name}.lengths.path: a length file is needed for kind file")
        for model in bench_models(config):
            for rate in w.arrival.rates:
                arrival = {**w.arrival.model_dump(exclude_unset=True), "rate_rps": rate}
                try:
                    traffic.schedule(
                        arrival,
                        mix,
                        w.prompt_tokens,
                        w.output_tokens,
                        0,
                        config.models[model].max_model_len,
                    )
                except traffic.TrafficError as exc:
                    raise ConfigError(f"config error at workloads.{name}: {exc} (models.{model})") from None
