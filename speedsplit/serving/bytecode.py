"""Bytecode for a server's Python.

Where Python may not write bytecode (`PYTHONDONTWRITEBYTECODE`, set in many container images)
and the engine was installed without any (`pip install --no-compile`, or uv, whose default is
none), every server start compiles every module it imports from source, every time. On one
H200 that was half of a warm vLLM start's first 40 s: importing vLLM's API server took 21-26 s
without bytecode and 11-13 s with it, and the engine process it forks took 20-23 s to its
first line instead of 11-12 s (docs/evidence/h200-2026-12-02-cliff/).

Such a server is given a bytecode folder of its own in the shared cache (PYTHONPYCACHEPREFIX)
and allowed to write there: its first start compiles what it imports into it (the standard
library and every package too: Python reads a prefix's bytecode instead of the source tree's),
every later start of any stack reads it. The user's installation is never written to, and a server whose engine
already has bytecode, or whose Python may write it, is left as it is.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

# What Python says when it imports a bytecode file that was cut short (CPython writes bytecode
# with one write() whose short count it ignores: on a full disk a file can be left truncated,
# and every later import of that module fails until it is removed).
BROKEN_BYTECODE = ("marshal data too short", "bad marshal data", "bad magic number")


def engine_module(argv: list[str]) -> str | None:
    """The module a `{python} -m ...` command runs in the end (the last -m: speedsplit's
    memory-cap wrapper runs the engine's module after its own)."""
    mods = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    return mods[-1] if mods else None


def has_bytecode(module: str) -> bool | None:
    """Whether the top package of module has bytecode next to its source (None: not found,
    or nothing compiled to look for)."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(importlib.util.cache_from_source(spec.origin)).is_file()


def server_env(argv: list[str], env: dict[str, str], prefix: Path) -> tuple[dict[str, str], str | None]:
    """The server's environment, with a bytecode folder where it needs one, and a line saying
    why (None when nothing changed). Only a server run by this Python is looked at: its
    modules are the ones found here."""
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return env, None
    if not argv or argv[0] != sys.executable:
        return env, None
    module = engine_module(argv)
    if module is None or has_bytecode(module) is not False:
        return env, None
    prefix.mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(prefix.resolve())
    why = (
        f"bytecode in {prefix} (PYTHONDONTWRITEBYTECODE is set and {module.split('.')[0]} has none: "
        "without it every start compiles every module it imports)"
    )
    return out, why


def prefix_of(shared_cache_root: Path) -> Path:
    """The one bytecode folder of every session under a shared cache root (Python names its
    files by interpreter and checks them against their source, so every engine and Python
    version shares it)."""
    return Path(shared_cache_root) / "pycache"


def heal(prefix: Path, server_output: str) -> str | None:
    """If a server's output shows it failed on a broken bytecode file and the bytecode folder
    exists, remove the folder (renamed first, so a server starting now sees all of it or none)
    and say so; the next start compiles it again. None: nothing of the kind."""
    said = next((line.strip() for line in server_output.splitlines() if any(b in line for b in BROKEN_BYTECODE)), None)
    prefix = Path(prefix)
    if said is None or not prefix.is_dir():
        return None
    aside = prefix.with_name(f"{prefix.name}.broken-{os.getpid()}")
    try:
        prefix.rename(aside)
    except FileNotFoundError:  # another session cleared it first
        return f"a broken bytecode file ({said}) under {prefix}: cleared by another session; the next start rebuilds it"
    shutil.rmtree(aside, ignore_errors=True)
    return f"a broken bytecode file ({said}) under {prefix}: the folder is cleared, the next start rebuilds it"
