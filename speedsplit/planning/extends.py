"""Stacks that extend stacks: `extends: <base>` names a base whose definition the stack starts
from, and the stack gives only what differs. Resolved once, after the config files are merged
and before the schema fills defaults, so every later reader sees whole stacks.

What a stack gives over its base:
- a scalar (variant, dialect, expect_kernel, ...) replaces the base's;
- `env` merges over the base's env (a key set to null removes the base's);
- `args` replaces the base's command line; `add_args` appends to it; `set_args` sets flags'
  values ({"--max-batch": "64"}: the value after the flag is replaced, or the flag and value
  appended when the base has no such flag);
- `on_cpu` and `on_gpu` merge over the base's by the same rules.
A stack marked `abstract: true` is a base only: it is dropped once its stacks are resolved, so
no chain, grid or benchmark list can name it, and an override of it (in a later config file)
reaches every stack that extends it.

Every error is one line naming the key path (ConfigError).
"""

from __future__ import annotations

import copy

from speedsplit.core.errors import ConfigError

_OVERLAYS = ("on_cpu", "on_gpu")
_ARG_EDITS = ("add_args", "set_args")


def resolve_stacks(config: dict) -> dict:
    """The config with every stack's `extends` resolved and abstract stacks dropped."""
    stacks = config.get("stacks")
    if not isinstance(stacks, dict):
        return config
    resolved: dict[str, dict] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> dict:
        if name in resolved:
            return resolved[name]
        entry = stacks[name]
        if not isinstance(entry, dict):
            return entry  # the schema says what is wrong with it
        base_name = entry.get("extends")
        if base_name is None:
            out = _own(name, entry, {})
        else:
            if not isinstance(base_name, str) or base_name not in stacks:
                raise ConfigError(
                    f"config error at stacks.{name}.extends: unknown stack {base_name!r} (stacks: {', '.join(stacks)})"
                )
            if base_name in seen:
                loop = " -> ".join((*seen[seen.index(base_name) :], base_name))
                raise ConfigError(f"config error at stacks.{name}.extends: stacks extend each other in a loop ({loop})")
            base = {k: v for k, v in resolve(base_name, (*seen, base_name)).items() if k != "abstract"}
            out = _own(name, entry, base)
        resolved[name] = out
        return out

    for name in stacks:
        resolve(name, (name,))
    out = dict(config)
    for name, entry in resolved.items():
        if isinstance(entry, dict) and not isinstance(entry.get("abstract", False), bool):
            raise ConfigError(f"config error at stacks.{name}.abstract: {entry['abstract']!r} is not of type 'boolean'")
    out["stacks"] = {
        name: entry for name, entry in resolved.items() if not (isinstance(entry, dict) and entry.get("abstract"))
    }
    return out


def _own(name: str, entry: dict, base: dict, overlay: bool = False) -> dict:
    """A stack's own keys (or, overlay, an on_cpu/on_gpu overlay's) laid over its (resolved) base."""
    out = copy.deepcopy(base)
    for key, value in entry.items():
        if key in _ARG_EDITS or (key == "extends" and not overlay):  # an overlay's is left for the schema to refuse
            continue
        if key == "env" and isinstance(value, dict):
            out["env"] = _env(out.get("env", {}), value)
        elif key in _OVERLAYS and isinstance(value, dict):
            out[key] = _own(f"{name}.{key}", value, out.get(key) or {}, overlay=True)
        else:
            out[key] = copy.deepcopy(value)
    if any(key in entry for key in _ARG_EDITS):
        out["args"] = _edit_args(name, list(out.get("args", [])), entry)
    return out


def _env(base: dict, top: dict) -> dict:
    merged = {**base, **top}
    return {k: v for k, v in merged.items() if v is not None}


def _edit_args(name: str, args: list, entry: dict) -> list:
    add, flags = entry.get("add_args", []), entry.get("set_args", {})
    if not isinstance(add, list) or not all(isinstance(a, str) for a in add):
        raise ConfigError(f"config error at stacks.{name}.add_args: a list of strings (arguments appended)")
    if not isinstance(flags, dict) or not all(
        isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in flags.values()
    ):
        raise ConfigError(
            f"config error at stacks.{name}.set_args: a mapping of flag to value, e.g. {{--max-batch: '64'}}"
        )
    for flag, value in flags.items():
        if flag in args[:-1]:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
    return args + add
