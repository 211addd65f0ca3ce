"""Start and stop a stack's OpenAI-compatible server(s), wait for readiness, and read from the
engine log what the engine actually ran (linear kernel, attention backend, weight memory).

A server runs in its own process group and is always stopped as a group: vLLM leaves child
processes that would otherwise keep holding the GPU. How much memory a server may take: a
card's memory cap (the stack's card_memory_gib, through the server's own flag or
speedsplit.serving.memcap) and the host memory a CPU server sizes its caches from
(host_cache_cap), below. The compile caches its servers share are speedsplit/serving/caches.py.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from speedsplit.core import apikey, procs
from speedsplit.core.results import redact, redact_secrets
from speedsplit.core.specs import StackSpec
from speedsplit.models.checkpoint import ModelError, is_dummy, read_model_config
from speedsplit.serving import caches
from speedsplit.serving.lease import cpu_ranges
from speedsplit.serving.serverlog import exit_cause, launch_output, log_cause

# No vLLM server this project launches reports usage to vLLM's authors (sent from any host with
# network unless VLLM_NO_USAGE_STATS, VLLM_DO_NOT_TRACK or DO_NOT_TRACK is set: any one turns
# vLLM's usage_lib off). Set over the inherited environment; a stack's env can still change it.
# The other engines report nothing of their own: the transformers stacks run with
# HF_HUB_OFFLINE=1 (no call to the hub at all), llama.cpp's server and speedsplit's own servers
# have no telemetry. (DO_NOT_TRACK and HF_HUB_DISABLE_TELEMETRY were set as well once, and taken
# out when the cliff test's vLLM CPU server delivered its 4-user streams in bursts; those bursts
# were the scheduler's, found later (core/procs.die_with_parent), so that trial proved nothing.)
NO_USAGE_REPORTS = {"VLLM_NO_USAGE_STATS": "1"}
HOST = "127.0.0.1"  # servers never listen beyond loopback
# CUDA numbers cards fastest first unless told otherwise; NVML and nvidia-smi number them by
# PCI bus. Every process speedsplit starts on cards counts them as NVML does, so a lease's
# index, a server's card and the card whose power is read are one card.
CUDA_DEVICE_ORDER = "PCI_BUS_ID"


class StartupFailed(RuntimeError):
    """The server exited or did not become ready in time; carries the log tail."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class Server:
    """One running server instance, from launch(): ready() waits until it answers as ours,
    stop() stops its whole process tree, and `with launch(...) as server:` stops it on leaving.
    Its log is this launch's part of log_path (launch_output)."""

    proc: subprocess.Popen
    url: str
    port: int
    log_path: Path
    devices: list[str]
    launched_at: float
    ready_s: float | None = None
    model_id: str = ""
    argv: list[str] = field(default_factory=list)
    log_offset: int = 0  # where this launch's output starts in the (appended) log
    wide_listeners: list[str] = field(default_factory=list)  # internal sockets beyond loopback (check_ours)
    memory_cap: dict | None = None  # what memory_cap() did, None without a cap
    host_memory: str | None = None  # the host-memory cap of a CPU server, in words
    api_key: str | None = field(default=None, repr=False)  # what its clients send (core/apikey.py)
    log_copier: threading.Thread | None = field(default=None, repr=False)  # its output into the log

    def log_copied(self, timeout_s: float = 5.0) -> None:
        """Once the server has ended, wait until what it said is in its log (the copier writes
        behind the process: a server that died said why in its last lines)."""
        if self.log_copier is not None and not self.alive():
            self.log_copier.join(timeout_s)

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def proc_id(self) -> procs.Proc:
        return procs.Proc.of(self.proc.pid) or procs.Proc(self.proc.pid, -1)

    def launch_output(self) -> str:
        """What this launch wrote to the log, never an earlier launch's lines (all of it, once
        the server has ended)."""
        self.log_copied()
        return launch_output(self.log_path, self.log_offset)

    def launch_output_tail(self, lines: int = 40) -> str:
        return "\n".join(self.launch_output().splitlines()[-lines:])

    def ready(self, ready_path: str, timeout_s: float) -> float:
        """Poll the readiness path until 200 from our own server; returns seconds from launch to
        ready. Whoever answers must prove it is ours (check_ours) before it counts as ready."""
        deadline = self.launched_at + timeout_s
        while True:
            if not self.alive():
                cause = log_cause(self.launch_output())
                raise StartupFailed(
                    f"server {exit_cause(self.proc.returncode)} before it was ready" + (f": {cause}" if cause else ""),
                    self.launch_output_tail(),
                )
            try:
                req = urllib.request.Request(self.url + ready_path, headers=apikey.headers(self.api_key))
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        self.wide_listeners = check_ours(self)
                        self.ready_s = time.monotonic() - self.launched_at
                        return self.ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StartupFailed(f"server not ready within {timeout_s:.0f} s", self.launch_output_tail())
            time.sleep(0.5)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server (its whole process tree) and reap it."""
        procs.stop_group(self.proc_id, grace_s)
        self.proc.poll()
        if self.proc.returncode is None:
            self.proc.wait(timeout=5)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _child_setup(cpus: tuple[int, ...]) -> None:
    procs.die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)


def launch(
    stack: StackSpec,
    model_dir: Path,
    served_name: str,
    port: int,
    devices: list[str],
    log_path: Path,
    cache_dir: Path | None = None,
    keep_fds: list[int] | tuple[int, ...] = (),
    cpus: list[int] | tuple[int, ...] = (),
    card_total_gib: float | None = None,
    host_cache: float | None = None,
    pycache: Path | None = None,
    api_key: str | None = None,
) -> Server:
    """Start one server instance in its own process group; returns at once (use it `with`, or
    call its ready() and stop()). keep_fds (the
    lease's lock files) stay open in the server so its cards stay locked while it lives;
    cpus, if given, are the only host cores it (and every process it starts) may run on;
    card_total_gib (the smallest of its cards' memory) is what a memory cap is taken from;
    host_cache (GiB, see host_cache_gib) runs a {python} server under speedsplit.serving.memcap so that
    it sizes its caches from that much host memory; pycache is where a server that would
    otherwise compile its modules at every start keeps their bytecode (serving/caches.py);
    api_key, where the stack names the variable its engine reads one from (api_key_env), is
    the key the server demands of every client (core/apikey.py)."""
    values = {
        "python": sys.executable,
        "model_dir": str(model_dir),
        "served_name": served_name,
        "host": HOST,
        "port": port,
        "tp": stack.tensor_parallel,
        "max_model_len": stack.max_model_len,
        "dtype": stack.dtype,
        # the cores it may use: where it is pinned, those; else every core this process may use
        "server_cpus": cpu_ranges(cpus) if cpus else "auto",
        "server_cpu_count": len(cpus) if cpus else len(os.sched_getaffinity(0)),
    }
    if stack.draft_model:  # its draft model's FP16 weights, made by the model rule beside the served model's
        values["draft_dir"] = str(Path(model_dir).resolve().parent.parent / stack.draft_model / "fp16")
    if any("{llama_server}" in a for a in [*stack.args, *stack.env.values()]):  # llama.cpp's stacks alone
        from speedsplit.models import gguf

        values["llama_server"] = gguf.server_binary() or "llama-server"
    argv, cap, host_memory = _command(stack, model_dir, values, card_total_gib, host_cache)
    env = _environment(stack, values, devices, cache_dir, api_key)
    api_key = api_key if stack.api_key_env else None
    why_bytecode = None
    if pycache is not None:
        env, why_bytecode = caches.bytecode_env(argv, env, pycache)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    if why_bytecode:
        log.write(f"[speedsplit] {why_bytecode}\n".encode())
    log.write(f"[speedsplit] launching: {redact(' '.join(argv))}\n".encode())
    log.flush()
    log_offset = log.tell()  # this launch's own output starts here
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=functools.partial(_child_setup, tuple(cpus)),
        pass_fds=tuple(keep_fds),
    )
    # what the server says goes to its log with every known secret taken out, as it is written
    copier = threading.Thread(target=_copy_redacted, args=(proc.stdout, log), daemon=True)
    copier.start()
    return Server(
        proc=proc,
        url=f"http://{HOST}:{port}",
        port=port,
        log_path=log_path,
        devices=devices,
        launched_at=time.monotonic(),
        model_id=stack.request_model.format(**values),
        argv=argv,
        log_offset=log_offset,
        memory_cap=cap,
        host_memory=host_memory,
        api_key=api_key,
        log_copier=copier,
    )


def _copy_redacted(out, log) -> None:
    """A server's output, line by line, into its log with its secrets taken out
    (core/results.redact_secrets: a server that prints the HF_TOKEN it inherited leaves
    <HF_TOKEN> there), until the server closes it."""
    with out, log:
        for line in iter(out.readline, b""):
            log.write(redact_secrets(line.decode(errors="replace")).encode())
            log.flush()


def _command(
    stack: StackSpec, model_dir: Path, values: dict, card_total_gib: float | None, host_cache: float | None
) -> tuple[list[str], dict | None, str | None]:
    """The server's command line (its memory caps applied), what the card memory cap did, and
    the host memory cap in words; refused where it would listen beyond loopback, or where its
    engine cannot serve dummy weights."""
    argv, cap = memory_cap(stack, render_args(stack.args, values), card_total_gib)
    host_memory = None
    if host_cache is None:  # a launch that names no size still gets the cap (one full-length sequence)
        host_cache = host_cache_gib(stack, model_dir, 0)
    if host_cache is not None:
        if argv[0] != sys.executable:
            raise ValueError(f"stack {stack.stack}: host_cache_cap needs a command that starts with {{python}}")
        argv = [argv[0], "-m", "speedsplit.serving.memcap", "--host-cache-gib", f"{host_cache:g}", "--", *argv[1:]]
        host_memory = (
            f"caches sized from {host_cache:g} GiB of host memory (speedsplit.serving.memcap --host-cache-gib)"
        )
    if not any(a == HOST or a.endswith("=" + HOST) for a in argv):
        raise ValueError(
            f"stack {stack.stack}: its command never passes {{host}} ({HOST}); refusing to start a server "
            "that would listen on its default address (add e.g. --host {host} to its args)"
        )
    if is_dummy(model_dir):
        if stack.dialect != "vllm":
            raise ValueError(
                f"stack {stack.stack} cannot serve {model_dir}: it has dummy weights, "
                "which only vLLM initialises itself"
            )
        if "--load-format" not in argv:
            argv += ["--load-format", "dummy"]
    return argv, cap, host_memory


def _environment(
    stack: StackSpec, values: dict, devices: list[str], cache_dir: Path | None, api_key: str | None
) -> dict[str, str]:
    """The server's environment: the inherited one, no usage reports, the stack's own, its
    cards in NVML's order, compile caches of its own, loopback only, its API key, no NVLink
    multicast."""
    env = dict(os.environ)
    env.update(NO_USAGE_REPORTS)  # over the inherited environment; a stack's own env may change them
    env.update({k: v.format(**values) for k, v in stack.env.items()})
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env["CUDA_DEVICE_ORDER"] = CUDA_DEVICE_ORDER
    if cache_dir is not None:
        # Servers started at once must not share compile caches or vLLM's internal port.
        cache_dir.mkdir(parents=True, exist_ok=True)
        env.setdefault("VLLM_CACHE_ROOT", str(cache_dir / "vllm"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
        env.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))
    env["VLLM_HOST_IP"] = HOST
    if stack.api_key_env:  # through the environment (`ps` shows a command line); a key
        env.pop(stack.api_key_env, None)  # the caller's shell holds is not one its clients know
        if api_key:
            env[stack.api_key_env] = api_key
    # NVLink multicast (NVLS) is never used: a program that uses it can take a shared host's
    # GPUs out of service.
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    return env


def check_ours(server: Server) -> list[str]:
    """The answer on our port came from our server, and that port listens on loopback only.

    Proof: a process of the server's own tree listens on 127.0.0.1:port, and where the server
    lists the models it serves, the list holds the name we passed (no fallback to another
    name). `transformers serve` lists its hub cache, not what it serves: an empty list proves
    nothing either way, the socket does.

    Returns the tree's other listeners beyond loopback, to be recorded: on a GPU, vLLM's engine
    opens torch.distributed's TCPStore on every interface (seen on an H200 as :::PORT), which
    no server argument changes.
    """
    listen = procs.listening(procs.tree(server.proc.pid))
    wide = sorted(f"{a}:{p}" for a, p in listen if not procs.is_loopback(a))
    if any(p == server.port for a, p in listen if not procs.is_loopback(a)):
        raise StartupFailed(
            f"server listens beyond loopback on its port {server.port} ({', '.join(wide)}); refusing it",
            server.launch_output_tail(),
        )
    if (HOST, server.port) not in listen:
        raise StartupFailed(
            f"port taken: something else answers on {HOST}:{server.port}, not this server", server.launch_output_tail()
        )
    listed = _listed_models(server)
    if listed and server.model_id not in listed:
        raise StartupFailed(
            f"port taken: the server on {HOST}:{server.port} serves {listed}, not {server.model_id!r}",
            server.launch_output_tail(),
        )
    return wide


def _listed_models(server: Server) -> list[str] | None:
    """Model ids from /v1/models, or None where the server has no usable listing."""
    import json

    try:
        req = urllib.request.Request(server.url + "/v1/models", headers=apikey.headers(server.api_key))
        with urllib.request.urlopen(req, timeout=10) as resp:
            return [m["id"] for m in json.loads(resp.read()).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# How much memory a server may take


def render_args(args: list[str], values: dict) -> list[str]:
    """A stack's arguments with their {placeholders} filled in."""
    out = []
    for a in args:
        try:
            out.append(a.format(**values))
        except KeyError as exc:
            raise ValueError(f"stack argument {a!r} uses unknown placeholder {exc}") from None
    return out


def memory_cap(stack: StackSpec, argv: list[str], card_total_gib: float | None) -> tuple[list[str], dict | None]:
    """The server command under the stack's memory cap (card_memory_gib), and what was done.

    A stack caps itself through its own flag where it has one (memory_cap_args, with
    {memory_fraction} = cap / the card's memory, e.g. vLLM's --gpu-memory-utilization);
    otherwise its Python server runs under speedsplit.serving.memcap. Only a CUDA card is capped.
    A vLLM stack's kv_cache_gib sizes its cache explicitly (--kv-cache-memory-bytes), cap or not."""
    if stack.kv_cache_gib and stack.platform == "cuda":  # the cache sized by hand (vLLM)
        argv = argv + ["--kv-cache-memory-bytes", str(int(stack.kv_cache_gib * GIB))]
    gib = stack.card_memory_gib
    if not gib:
        return argv, None
    record = {"card_memory_gib": gib, "card_total_gib": card_total_gib, "fraction": None, "how": None}
    if stack.platform != "cuda" or card_total_gib is None:
        return argv, {**record, "applied": False, "reason": "not on a CUDA card: nothing to cap"}
    if gib >= card_total_gib:
        raise ValueError(f"stack {stack.stack}: card_memory_gib {gib} is not below the card's {card_total_gib:.1f} GiB")
    fraction = int(gib / card_total_gib * 10_000) / 10_000  # rounded down: never above the cap
    if stack.memory_cap_args:
        extra = render_args(stack.memory_cap_args, {"memory_fraction": f"{fraction:.4f}", "memory_gib": gib})
        argv, how = argv + extra, " ".join(extra)
    elif argv[0] == sys.executable:
        argv = [argv[0], "-m", "speedsplit.serving.memcap", "--gib", f"{gib:g}", "--", *argv[1:]]
        how = "speedsplit.serving.memcap: allocator capped, mem_get_info reports the small card"
    else:
        raise ValueError(
            f"stack {stack.stack}: card_memory_gib needs memory_cap_args (the server's own memory flag) "
            "or a command that starts with {python} (run under speedsplit.serving.memcap)"
        )
    return argv, {**record, "fraction": fraction, "how": how, "applied": True, "reason": None}


GIB = 2**30
HOST_CACHE_FLOOR_GIB = 0.25
# transformers' continuous batching sets aside the LM head's rows (16-bit hidden state, fp32
# logits) for up to 1024 requests of a batch before it sizes its cache
# (PagedAttentionMemoryHandler.fixed_overhead_bytes): 206 MB for a 50k vocabulary.
CB_LOGIT_ROWS = 1024


def host_cache_gib(stack: StackSpec, model_dir: str | Path, kv_tokens: int) -> float | None:
    """Host memory a CPU server with host_cache_cap may size its caches from: twice the KV
    cache of what its session keeps in flight (at least one full-length sequence), the logit
    rows transformers reserves, and 0.25 GiB for its other buffers; None where no such cap
    applies."""
    if not stack.host_cache_cap:
        return None
    try:
        cfg = read_model_config(model_dir)
    except ModelError:
        return None  # the session's own model check says what is wrong
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 2  # K and V, 16-bit
    tokens = max(kv_tokens, stack.max_model_len)
    logit_rows = CB_LOGIT_ROWS * (cfg["hidden_size"] * 2 + cfg["vocab_size"] * 4)
    return round((2 * per_token * tokens + logit_rows) / GIB + HOST_CACHE_FLOOR_GIB, 3)
