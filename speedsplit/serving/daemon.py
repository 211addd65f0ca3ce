"""A session's daemon: spawned by the first cell job of a session (speedsplit/serving/session.py),
it leases the cards, starts the servers, checks each with one request (preflight), publishes
the session's state and holds the servers until the session's last cell, its idle timeout or
a stop.

    python -m speedsplit.serving.daemon RESULTS/.../{session}.launch.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from speedsplit.core import procs
from speedsplit.core.procs import Stop, signals_held, stop_on_signals
from speedsplit.core.results import redact
from speedsplit.core.specs import StackSpec
from speedsplit.models.checkpoint import ModelError, check_model
from speedsplit.probes import loadgen, telemetry
from speedsplit.serving import lease as leases
from speedsplit.serving import caches, serverlog, stacks
from speedsplit.serving.stacks import host_cache_gib
from speedsplit.serving.session import evict_idle, lease_holders
from speedsplit.serving.session_state import (
    DIED,
    READY,
    STARTING,
    STARTUP_FAILED,
    STOPPED,
    STOPPING,
    LaunchFile,
    Session,
    _read_private_json,
    transition,
)


def _daemon(launch_path: Path) -> int:
    told = LaunchFile.model_validate(_read_private_json(launch_path))  # read through no link
    launch, key, generation = told.launch, told.key, told.generation
    sess = Session(key, told.workdir)
    stack = launch.stack
    with sess.locked(sess.spawn_lock):  # the spawning job has finished writing its own state
        st = sess.state()
    if st.generation != generation or st.daemon != procs.me():
        print(f"[session {key}] superseded before it started", flush=True)
        return 0
    servers: list[stacks.Server] = []  # filled as they start, so that a failed start stops them
    held = cache = None
    shared = Path(launch.shared_cache_dir or launch.cache_dir)  # compile caches, bytecode
    pycache = caches.bytecode_prefix(shared)
    with stop_on_signals():
        try:
            check_model(launch.model_dir, stack.variant)
            # a CPU is one "card" (its servers never overlap), or benchmark.cpu_lanes of them
            slots = launch.cpu_slots
            platform_devices = None if stack.platform == "cuda" else ["cpu"] + [f"cpu{i}" for i in range(1, slots)]
            need = stack.tensor_parallel * stack.instances if platform_devices is None else 1
            t_lease = time.monotonic()
            held = leases.acquire_gpus(
                need,
                timeout_s=told.lease_timeout_s,
                devices=platform_devices,
                on_wait=LeaseWait(sess, generation, platform_devices, told.foreign_idle_s),
            )
            t_start = time.monotonic()
            cache = caches.compile_cache(
                shared,
                Path(launch.cache_dir),
                stack,
                launch.model or {"path": launch.model_dir},  # its identity (bench gives it)
            )
            pinned = _start(sess, generation, told, held, platform_devices is None, cache, pycache, servers)
            required = key_required(servers[0], stack) if stack.api_key else None
            cache.release()
            startup_s = time.monotonic() - t_start
            # the cells' client: on a card's servers' cores, or (no cards) on the core the split left it
            client = leases.cpu_split()[1] if pinned and platform_devices is not None else []
            ready = _ready_facts(
                sess,
                servers,
                cache,
                pinned,
                held,
                api_key_required=required,
                client_cpus=leases.cpu_ranges(client) or None,
            )
            st = transition(
                sess,
                generation,
                READY,
                startup_s=startup_s,
                lease_wait_s=t_start - t_lease,
                **ready,
                cells_measured=0,
                last_used=time.time(),
            )
            if st is None:
                raise Stop("the session was stopped while it started")
            print(f"[session {key}] ready in {st.startup_s:.1f} s at {st.urls}", flush=True)
            _hold(sess, generation, servers, told)
            dead = next((s for s in servers if not s.alive()), None)
            if dead is not None:
                transition(
                    sess,
                    generation,
                    DIED,
                    exit_code=dead.proc.returncode,
                    log_tail=redact(dead.launch_output_tail(), sess.workdir),
                )
                print(f"[session {key}] a server {serverlog.exit_cause(dead.proc.returncode)}", flush=True)
        except Stop as why:
            print(f"[session {key}] stopping ({why})", flush=True)
        except Exception as exc:  # whatever kept the servers from starting is the cells' answer
            _startup_failed(sess, generation, exc, pycache)
        finally:
            if cache is not None:  # a start that failed lets the next session have the cache
                cache.release()
            with signals_held():
                transition(sess, generation, STOPPING)
                for srv in servers:
                    srv.stop()
                if held is not None:  # the cards are free only once their servers are gone
                    held.release()
                transition(sess, generation, STOPPED)
    return 0


def _start(
    sess: Session,
    generation: str,
    told: LaunchFile,
    held: leases.Lease,
    on_cards: bool,
    cache,
    pycache: Path,
    servers: list[stacks.Server],
) -> list[int]:
    """Launch the stack's instances on the lease (each appended to servers as it starts), wait
    until every one is ready, and check each with one request; the host cores pinned."""
    launch, stack = told.launch, told.launch.stack
    log_path = Path(told.log_path)
    pinned: list[int] = []
    for i in range(stack.instances):
        devs = held.devices[i * stack.tensor_parallel : (i + 1) * stack.tensor_parallel] if on_cards else []
        if not stack.cpu_isolation:
            cpus = []
        else:  # a card's share of the cores; without cards, all but the client's
            cpus = leases.cpu_share(devs) if on_cards else leases.cpu_split()[0]
        pinned += cpus
        env_stack = stack.model_copy(update={"env": {**stack.env, "VLLM_PORT": str(held.port())}})
        total = card_total_gib(devs) if stack.card_memory_gib and devs else None
        servers.append(
            stacks.launch(
                env_stack,
                Path(launch.model_dir),
                stack.model,
                held.port(),
                devs,
                Path(str(log_path).removesuffix(".log") + f".server{i}.log"),
                cache.instance(i),
                keep_fds=held.fds(),
                cpus=cpus,
                card_total_gib=total,
                host_cache=host_cache_gib(stack, launch.model_dir, launch.kv_tokens),
                pycache=pycache,
                api_key=told.api_key,
            )
        )
        if transition(sess, generation, STARTING, servers=[s.proc_id for s in servers]) is None:
            raise Stop("the session was stopped while it started")
    for srv in servers:
        srv.ready(stack.ready_path, stack.startup_timeout_s)
    for srv in servers:  # a server that cannot serve fails its start, not every cell's timeout
        preflight(srv, stack)
    return pinned


def _ready_facts(sess: Session, servers: list[stacks.Server], cache, pinned: list[int], held, **more) -> dict:
    """What a ready session's state says of its servers (the cells' results copy it)."""
    return dict(
        urls=[s.url for s in servers],
        model_id=servers[0].model_id,
        devices=held.devices,
        cpus=leases.cpu_ranges(pinned) or None,
        facts=serverlog.engine_facts("\n".join(s.launch_output() for s in servers)),
        argv=redact(" ".join(servers[0].argv), sess.workdir),
        server_logs=[str(s.log_path) for s in servers],
        log_offsets=[s.log_offset for s in servers],
        memory_cap=servers[0].memory_cap,
        host_memory=servers[0].host_memory,
        compile_cache_dir=cache.how,
        wide_listeners=sorted({w for s in servers for w in s.wide_listeners}),
        **more,
    )


def _startup_failed(sess: Session, generation: str, exc: Exception, pycache: Path) -> None:
    """Whatever kept the servers from starting, in the session's state for its cells."""
    expected = isinstance(exc, (stacks.StartupFailed, leases.LeaseError, ModelError, ValueError, OSError))
    error = str(exc) if expected else f"{type(exc).__name__}: {exc}"
    healed = caches.heal_bytecode(pycache, getattr(exc, "log_tail", "") or "")
    transition(
        sess,
        generation,
        STARTUP_FAILED,
        error=redact(error + (f"; {healed}" if healed else ""), sess.workdir),
        log_tail=redact(getattr(exc, "log_tail", ""), sess.workdir),
    )
    print(f"[session {sess.key}] startup failed: {exc}", flush=True)


PREFLIGHT_TOKENS = 2


def preflight(server: stacks.Server, stack: StackSpec) -> float:
    """One short request through the load generator on a server that says it is ready;
    returns its seconds, or raises StartupFailed with the answer and the failure the server's
    log names (e.g. an INT4 kernel this CPU's build lacks answers HTTP 500)."""
    spec = loadgen.LoadSpec(
        urls=[server.url],
        model=server.model_id,
        prompts=["Say hello."],
        users=1,
        prompt_tokens=0,
        output_tokens=PREFLIGHT_TOKENS,
        requests_per_user=1,
        warmup_requests=0,
        dialect=stack.dialect,
        keep_alive=stack.keep_alive,
        request_timeout_s=stack.startup_timeout_s,
        stall_timeout_s=min(120.0, stack.startup_timeout_s),
        api_key=server.api_key,
    )
    t0 = time.monotonic()
    _, records = loadgen.run(spec)
    failed = next((r for r in records if not r.ok), None)
    if failed is not None:
        time.sleep(1.0)  # the server's own account of the failure reaches its log
        cause = serverlog.log_cause(server.launch_output())
        answer = f"{failed.error}{': ' + failed.detail if failed.detail else ''}"
        alive = "" if server.alive() else f"; the server then {serverlog.exit_cause(server.proc.returncode)}"
        raise stacks.StartupFailed(
            f"ready, but its first request failed ({answer}){alive}" + (f"; its log: {cause}" if cause else ""),
            server.launch_output_tail(),
        )
    print(f"[session] {server.url} served a first request in {time.monotonic() - t0:.1f} s", flush=True)
    return time.monotonic() - t0


def key_required(server: stacks.Server, stack: StackSpec) -> bool:
    """With benchmark.api_key: whether the server refuses a request without its key (HTTP 401),
    False where its engine has no key option (api_key_env null). A server handed a key that
    answers without it fails its start: its api_key_env is not the variable it reads."""
    if server.api_key is None:
        print(f"[session] {server.url} runs without an API key: stack {stack.stack} names no api_key_env", flush=True)
        return False
    body = json.dumps({"model": server.model_id, "prompt": "Say hello.", "max_tokens": 1}).encode()
    req = urllib.request.Request(
        server.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    if status != 401:
        raise stacks.StartupFailed(
            f"given an API key through {stack.api_key_env}, the server answered a request without it "
            f"(HTTP {status}): that is not the variable its engine reads a key from (stack api_key_env)"
        )
    return True


def card_total_gib(devices: list[str]) -> float:
    """The memory a cap is taken from; a card NVML cannot read fails the start, naming why."""
    try:
        return telemetry.card_memory_gib(devices)
    except Exception as exc:
        raise ValueError(f"card_memory_gib: cannot read the memory of cards {devices} ({exc})") from None


class LeaseWait:
    """What a session does while its cards are held by others: stops the idle sessions the
    policy allows (session.evict_idle), and publishes who holds them (waiting_for, and every
    holder met in lease_holders, which the results record) for the cells waiting on it to
    print, and its own log says so."""

    def __init__(self, sess: Session, generation: str, devices: list[str] | None, foreign_idle_s: float):
        self.sess, self.generation, self.foreign_idle_s = sess, generation, foreign_idle_s
        self.devices = devices if devices is not None else leases.visible_devices()
        self.since, self.seen, self.last = time.time(), [], None

    def __call__(self) -> bool:
        stopped = evict_idle(except_key=self.sess.key, foreign_idle_s=self.foreign_idle_s)
        for what in stopped:
            print(f"[session {self.sess.key}] stopped an idle session for its cards: {what}", flush=True)
        holders = lease_holders(self.devices)
        if holders != self.last:
            self.last = holders
            self.seen += [h for h in holders if h not in self.seen]
            transition(
                self.sess,
                self.generation,
                STARTING,
                waiting_for=holders,
                waiting_since=self.since,
                lease_holders=self.seen,
            )
            print(f"[session {self.sess.key}] waiting for the cards: {'; '.join(holders) or 'held'}", flush=True)
        return bool(stopped)


def _hold(sess: Session, generation: str, servers: list[stacks.Server], told: LaunchFile) -> None:
    """Return when a server dies, the owner is gone, the session sat idle too long or someone
    moved it to stopping."""
    owner = told.owner
    idle_since = time.monotonic()
    while all(s.alive() for s in servers):
        st = sess.state()
        if st.generation != generation or st.state != READY:
            if st.evicted_by:
                print(f"[session {told.key}] stopped, idle, for {st.evicted_by}", flush=True)
            return
        if not owner.alive():
            print(f"[session {told.key}] workflow process {owner.as_record()} is gone", flush=True)
            transition(sess, generation, STOPPING)
            return
        with sess.locked(sess.cell_lock, blocking=False) as idle:
            if not idle:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > told.idle_timeout_s:
                print(f"[session {told.key}] idle for {told.idle_timeout_s:.0f} s", flush=True)
                transition(sess, generation, STOPPING)  # under the cell lock: no cell is attaching
                return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one server session (spawned by a cell job).")
    p.add_argument("launch", type=Path, help="the session's .launch.json")
    return _daemon(p.parse_args(argv).launch)


if __name__ == "__main__":
    sys.exit(main())
