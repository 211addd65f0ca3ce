"""After a cell's load: did its servers hold up, and can its numbers be taken at face value?
The run's status with its cause in words (the failing answer, the server's exit, the failure
its log names), the engine facts logged late, and the honesty flags."""

from __future__ import annotations

import urllib.error
import urllib.request

from speedsplit.core import plausible
from speedsplit.core.record import CLIENT_STALL_S, EngineFacts, ErrorInfo, RunResult
from speedsplit.core.specs import CellParams, StackSpec
from speedsplit.core.requestlog import RequestRecord
from speedsplit.serving import serverlog
from speedsplit.serving import session as sessions
from speedsplit.serving.session_state import READY, SessionState, daemon_alive


def health(url: str, path: str = "/health") -> int | None:
    """The HTTP status a server's health path answers, None when it answers nothing."""
    try:
        with urllib.request.urlopen(url + path, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except Exception:  # no answer at all
        return None


def unhealthy(state: SessionState, stack: StackSpec) -> str | None:
    """Why a session's servers can no longer be handed to another cell (None: they can): one
    that no longer answers its health check, or whose process is gone, with what its log names."""
    answers = [health(u, stack.ready_path) for u in state.urls]
    if all(a == 200 for a in answers) and all(p.alive() for p in state.servers):
        return None
    said = next((f"its health check gave HTTP {a}" for a in answers if a not in (None, 200)), None)
    if said is None:
        said = "its health check gave no answer" if None in answers else "a server process is gone"
    cause = server_log_cause(state)
    return said + (f"; its log: {cause}" if cause else "")


def late_facts(result: RunResult, state: SessionState) -> None:
    """Engine facts logged after the server was ready fill the gaps of those read at ready
    (transformers' continuous batching sizes its KV cache at its first request)."""
    known = result.engine.model_dump()
    if None not in known.values():
        return
    logs = zip(state.server_logs, state.log_offsets)
    late = serverlog.engine_facts("\n".join(serverlog.launch_output(path, offset) for path, offset in logs))
    result.engine = EngineFacts(**{k: known[k] if known[k] is not None else late.get(k) for k in known})


def check_servers(
    result: RunResult, records: list[RequestRecord], sess, generation: str, state: SessionState, stack: StackSpec
) -> None:
    """Set the run's status from the load's outcome and what its servers do now; every status
    but ok comes with its cause in result.error (the failing answer, the server's exit, the
    failure its log names)."""
    answers = [health(u, stack.ready_path) for u in state.urls]
    s = result.summary
    if all(a == 200 for a in answers) and s.completed:
        result.status = "ok"
        return
    running = all(p.alive() for p in state.servers)
    cause = server_log_cause(state)
    server_side = {k: n for k, n in s.failures.items() if k.startswith("http_5") or k == "server_error"}
    now = sess.state()
    # the daemon records a server's death (DIED) before it ends; one that vanished without a
    # word was killed from outside, and its servers went with it
    lost = not daemon_alive(now) and now.generation == generation and now.state == READY
    if server_side:
        first = next((f"{r.error}: {r.detail}" for r in records if r.error in server_side and r.detail), "no detail")
        after = "" if running or lost else f"; then the server {_exit_of(sess, generation, result)}"
        result.status = "server_error"
        kind, message = "ServerError", f"{_counts(server_side)} ({first}){after}"
    elif lost:
        result.status = "server_died"
        daemon = state.daemon.pid if state.daemon else None
        kind = "SessionLost"
        message = f"the session's daemon (pid {daemon}) ended mid-cell, killed from outside; its servers went with it"
    elif not running:
        result.status = "server_died"
        kind, message = "ServerExit", f"the server {_exit_of(sess, generation, result)} during the run"
    elif all(a == 200 for a in answers):
        result.status = "failed"
        kind, message = "RequestsFailed", f"no request completed: {_counts(s.failures) or 'none sent'}"
    else:
        result.status = "server_hung"
        said = [a for a in answers if a not in (None, 200)]  # the hung instance's own answer
        kind = "ServerHung"
        message = f"its health check answered HTTP {said[0]}" if said else "it no longer answers its health check"
        message += f" after {_counts(s.failures) or 'the load'}"
    result.error = ErrorInfo(type=kind, message=message + (f"; its log: {cause}" if cause else ""))


def _counts(failures: dict[str, int]) -> str:
    return ", ".join(f"{n} x {k}" for k, n in sorted(failures.items()))


def _exit_of(sess, generation: str, result: RunResult) -> str:
    """How the session's dead server ended (the daemon, its parent, records it), also kept in
    result.server."""
    died = sessions.wait_final(sess, generation, 10.0)
    result.server.log_tail = died.log_tail or ""
    result.server.exit_code = died.exit_code
    return serverlog.exit_cause(result.server.exit_code) if result.server.exit_code is not None else "ended"


def server_log_cause(state: SessionState) -> str:
    """The failure the session's server logs name since its launch (empty if none)."""
    logs = zip(state.server_logs, state.log_offsets)
    return serverlog.log_cause("\n".join(serverlog.launch_output(path, offset) for path, offset in logs))


# How far above a memory cap NVML may see a card before the run did not measure the small
# card (the band: a capped card's peak within 0.5 GiB of the cap).
MEMORY_CAP_SLACK_GIB = 0.5


def over_memory_cap(result: RunResult) -> bool:
    """Whether a capped run held more than the emulated card has: the engine gave its KV cache
    more than it said would fit the cap (vLLM: its CUDA graphs sit outside
    --gpu-memory-utilization), or NVML saw a card of the session above the cap by more than
    MEMORY_CAP_SLACK_GIB. Either way the run did not measure the small card."""
    cap = result.server.memory_cap if result.server else None
    if not (cap and cap.applied):
        return False
    kv, fit = result.engine.kv_cache_gib, result.engine.kv_cache_fit_gib
    if kv is not None and fit is not None and kv > fit * 1.01:
        return True
    gpu = result.telemetry.gpu if result.telemetry else None
    if gpu and gpu.devices:
        return gpu.memory_peak_gib / len(gpu.devices) > cap.card_memory_gib + MEMORY_CAP_SLACK_GIB
    return False


def honesty_flags(result: RunResult, stack: StackSpec, cell: CellParams) -> list[str]:
    """Reasons not to take a run's numbers at face value; also sets result.kernel_ok."""
    s, flags = result.summary, []
    if s.failed:
        flags.append("request_failures")
    if s.wrong_output_length:
        flags.append("output_length_mismatch")
    if s.wrong_prompt_length:
        flags.append("prompt_length_mismatch")
    if s.usage_mismatch:
        flags.append("usage_mismatch")  # the server's usage is not what it streamed
    if s.latency_outliers:
        flags.append("latency_outlier")  # a request held far longer than its length predicts
    if s.wall_s < cell.min_measured_s:
        flags.append("short_measurement")
    lag = s.lag_s.p99 if s.lag_s else None
    if lag is not None and cell.load.client_lag_limit_s is not None and lag > cell.load.client_lag_limit_s:
        flags.append("client_lag")  # the server was not offered the schedule's rate
    if s.client_stall_s is not None and s.client_stall_s > CLIENT_STALL_S:
        flags.append("client_stalled")  # the client's loop did not run: its timestamps are late
    if over_memory_cap(result):
        flags.append("over_memory_cap")  # the engine held more than the emulated card has
    if plausible.reasons(result):
        flags.append("implausible")  # numbers no measurement makes: a bug wrote them
    ok = serverlog.kernel_matches(stack.expect_kernel, result.engine.linear_kernel)
    result.kernel_ok = ok
    if ok is False:
        flags.append("kernel_mismatch")
    return flags
