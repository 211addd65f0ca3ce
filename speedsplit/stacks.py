"""Start and stop a stack's OpenAI-compatible server(s), wait for readiness, and read from the
engine log what the engine actually ran (linear kernel, attention backend, weight memory).

A server runs in its own process group and is always stopped as a group: vLLM leaves child
processes that would otherwise keep holding the GPU.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from speedsplit.models import is_dummy

HOST = "127.0.0.1"  # servers never listen beyond loopback


class StartupFailed(RuntimeError):
    """The server exited or did not become ready in time; carries the log tail."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class Server:
    """One running server instance."""

    proc: subprocess.Popen
    url: str
    port: int
    log_path: Path
    devices: list[str]
    launched_at: float
    ready_s: float | None = None
    model_id: str = ""
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None


def _die_with_parent() -> None:
    """In the child before exec: own process group, and SIGTERM if the job dies (Linux)."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def render_args(args: list[str], values: dict) -> list[str]:
    out = []
    for a in args:
        try:
            out.append(a.format(**values))
        except KeyError as exc:
            raise ValueError(f"stack argument {a!r} uses unknown placeholder {exc}") from None
    return out


def launch(
    stack: dict,
    model_dir: Path,
    served_name: str,
    port: int,
    devices: list[str],
    log_path: Path,
    cache_dir: Path | None = None,
) -> Server:
    """Start one server instance in its own process group; returns at once."""
    values = {
        "python": sys.executable,
        "model_dir": str(model_dir),
        "served_name": served_name,
        "host": HOST,
        "port": port,
        "tp": stack["tensor_parallel"],
        "max_model_len": stack["max_model_len"],
        "dtype": stack["dtype"],
    }
    argv = render_args(stack["args"], values)
    if is_dummy(model_dir):
        if stack["dialect"] != "vllm":
            raise ValueError(
                f"stack {stack['stack']} cannot serve {model_dir}: it has dummy weights, "
                "which only vLLM initialises itself"
            )
        if "--load-format" not in argv:
            argv += ["--load-format", "dummy"]
    env = dict(os.environ)
    env.update({k: v.format(**values) for k, v in stack["env"].items()})
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if cache_dir is not None:
        # Servers started at once must not share compile caches or vLLM's internal port.
        cache_dir.mkdir(parents=True, exist_ok=True)
        env.setdefault("VLLM_CACHE_ROOT", str(cache_dir / "vllm"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
        env.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    env["VLLM_HOST_IP"] = HOST
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    log.write(f"[speedsplit] launching: {' '.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
    )
    log.close()
    return Server(
        proc=proc,
        url=f"http://{HOST}:{port}",
        port=port,
        log_path=log_path,
        devices=devices,
        launched_at=time.monotonic(),
        model_id=stack.get("request_model", "{served_name}").format(**values),
        argv=argv,
    )


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(server: Server, ready_path: str, timeout_s: float) -> float:
    """Poll the readiness path until 200; returns seconds from launch to ready."""
    deadline = server.launched_at + timeout_s
    while True:
        if not server.alive():
            raise StartupFailed(
                f"server exited with code {server.proc.returncode} before it was ready", log_tail(server.log_path)
            )
        try:
            with urllib.request.urlopen(server.url + ready_path, timeout=5) as resp:
                if resp.status == 200:
                    server.ready_s = time.monotonic() - server.launched_at
                    server.model_id = _served_model(server) or server.model_id
                    return server.ready_s
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise StartupFailed(f"server not ready within {timeout_s:.0f} s", log_tail(server.log_path))
        time.sleep(0.5)


def _served_model(server: Server) -> str:
    import json

    try:
        with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
            data = json.loads(resp.read())
        ids = [m["id"] for m in data.get("data", [])]
        return server.model_id if server.model_id in ids else (ids[0] if ids else "")
    except Exception:  # the listing is optional; requests name the served model anyway
        return ""


def stop(server: Server, grace_s: float = 20.0) -> None:
    """SIGTERM the server's whole process group, then SIGKILL what is left; wait until gone."""
    pgid = server.proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
            os.killpg(pgid, signal.SIGCONT)  # a stopped (hung) process acts on SIGTERM only once continued
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            server.proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.2)
        else:
            continue
        break
    server.proc.poll()
    if server.proc.returncode is None:
        server.proc.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own child excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


# --- what the engine says it ran -------------------------------------------------------------

_FACTS = {
    "linear_kernel": [r"Using (\w+LinearKernel) for", r"Using (\w*[Mm]arlin\w*) kernel", r"(\w+LinearKernel)"],
    "attention_backend": [
        r"Using (?:AttentionBackendEnum\.)?(\w+) (?:attention )?backend",
        r"attn_implementation[=: ]+['\"]?(\w+)",
    ],
    "weight_memory_gib": [r"Model loading took ([\d.]+) ?GiB", r"model weights take ([\d.]+) ?GiB"],
    "kv_cache_tokens": [r"KV cache size: ([\d,]+) tokens"],
    "max_concurrency": [r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"],
    "quantization": [r"quantization=(\w+)"],
    "dtype": [r"dtype=(torch\.\w+|\w+)"],
}


def engine_facts(log_text: str) -> dict:
    """Facts the engine reported about itself (first match of each), None where silent."""
    facts: dict = {}
    for key, patterns in _FACTS.items():
        facts[key] = None
        for pat in patterns:
            m = re.search(pat, log_text)
            if m:
                value = m.group(1).replace(",", "")
                facts[key] = (
                    float(value)
                    if key in ("weight_memory_gib", "max_concurrency")
                    else (int(value) if key == "kv_cache_tokens" else value)
                )
                break
    return facts


def kernel_matches(expect: str, facts: dict) -> bool | None:
    """None when nothing is expected; else whether the reported kernel matches the regex."""
    if not expect:
        return None
    kernel = facts.get("linear_kernel") or ""
    return bool(re.search(expect, kernel))
