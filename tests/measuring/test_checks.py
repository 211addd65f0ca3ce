"""The checks after a cell's load (measuring/checks.py): the run's status and its cause from
what its servers answer now, the engine facts logged late, and the honesty flags."""

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from records import cell_spec, fake_result, stack_spec, with_wall

from speedsplit.core import procs
from speedsplit.core.facts import GpuTelemetry, MemoryCap, Telemetry
from speedsplit.core.record import Distribution, EngineFacts
from speedsplit.core.requestlog import RequestRecord
from speedsplit.measuring import checks
from speedsplit.serving.session_state import DIED, READY, Session, SessionState

GEN = "g1"
LOG = "INFO 01-01 00:00:00 [api.py:1] starting\nRuntimeError: boom\n"  # its cause: the second line


@pytest.fixture
def answering():
    """Start a health server on 127.0.0.1 that answers `status` at /health (404 elsewhere)."""
    started = []

    def start(status: int) -> str:
        class Health(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(status if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *args):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
        threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()  # a quick shutdown
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_port}"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def silent() -> str:
    """A URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def dead() -> procs.Proc:
    """A process that has ended (and was reaped)."""
    child = subprocess.Popen(["sleep", "60"])
    proc = procs.Proc.of(child.pid)
    child.kill()
    child.wait()
    return proc


def held(tmp_path, urls, servers=None, log=None, published=None):
    """A session as a cell holds it (its state at ready) and its real Session, whose published
    state is `published` (none: nobody's, so no daemon death is recorded)."""
    sess, logs = Session("tiny/s/tp1/all", tmp_path), [] if log is None else [str(tmp_path / "server.log")]
    for path in logs:
        Path(path).write_text(log)
    servers = servers or [procs.me()]
    state = SessionState(state=READY, generation=GEN, urls=urls, servers=servers, server_logs=logs, log_offsets=[0])
    if published is not None:
        sess.write(published)
    return sess, state


def loaded(completed: int = 0, failures: dict | None = None):
    """An ok-looking result whose load completed this many requests and failed these."""
    res, failures = fake_result("s", 8, 0, 100.0), failures or {}
    res.summary.completed, res.summary.failures, res.summary.failed = completed, failures, sum(failures.values())
    return res


def check(res, sess, state, records=()):
    """The run's status, and its error's kind and message."""
    checks.check_servers(res, list(records), sess, GEN, state, stack_spec())
    return (res.status, *((res.error.type, res.error.message) if res.error else (None, None)))


def test_health_gives_the_status_its_path_answers_and_none_where_nothing_listens(answering):
    url = answering(503)
    assert checks.health(url) == 503
    assert checks.health(url, "/v1/models") == 404  # the stack's ready_path is the one asked
    assert checks.health(silent()) is None


def test_a_load_that_completed_on_servers_that_answer_200_is_ok(tmp_path, answering):
    sess, state = held(tmp_path, [answering(200), answering(200)], log=LOG)
    # a few 5xx answers beside completed requests are the flag request_failures' business
    assert check(loaded(completed=3, failures={"http_500": 1}), sess, state) == ("ok", None, None)


def test_nothing_completed_on_servers_that_answer_200_is_a_failed_run(tmp_path, answering):
    sess, state = held(tmp_path, [answering(200)])
    said = "no request completed: 3 x stall, 1 x timeout"
    assert check(loaded(failures={"stall": 3, "timeout": 1}), sess, state) == ("failed", "RequestsFailed", said)
    assert check(loaded(), sess, state)[2] == "no request completed: none sent"


def test_a_health_check_that_answers_other_than_200_or_nothing_is_a_hung_server(tmp_path, answering):
    sess, state = held(tmp_path, [answering(503)], log=LOG)
    said = "its health check answered HTTP 503 after the load; its log: RuntimeError: boom"
    assert check(loaded(completed=4), sess, state) == ("server_hung", "ServerHung", said)
    sess, state = held(tmp_path, [silent()])
    said = "it no longer answers its health check after 4 x stall"
    assert check(loaded(failures={"stall": 4}), sess, state) == ("server_hung", "ServerHung", said)


def test_a_hung_instance_beside_a_healthy_one_is_named_by_its_own_answer(tmp_path, answering):
    sess, state = held(tmp_path, [answering(200), answering(503)])
    assert check(loaded(completed=4), sess, state)[2] == "its health check answered HTTP 503 after the load"


def test_5xx_answers_are_a_server_error_with_the_first_detail_given_and_the_log_cause(tmp_path, answering):
    def rec(error, detail):
        return RequestRecord(user=0, index=0, phase="measured", url="u", sent=0.0, error=error, detail=detail)

    records = [rec("stall", "no token"), rec("http_500", None), rec("http_503", "overloaded"), rec("http_500", "x")]
    failures = {"http_500": 2, "http_503": 1, "server_error": 1, "stall": 1}  # stall is not the server's
    sess, state = held(tmp_path, [answering(200)], log=LOG)
    said = "2 x http_500, 1 x http_503, 1 x server_error (http_503: overloaded); its log: RuntimeError: boom"
    assert check(loaded(failures=failures), sess, state, records) == ("server_error", "ServerError", said)


def test_a_server_error_whose_server_then_died_says_how_it_ended(tmp_path):
    died = SessionState(state=DIED, generation=GEN, exit_code=-9, log_tail="bye")
    sess, state = held(tmp_path, [silent()], servers=[dead()], published=died)
    res = loaded(failures={"http_502": 2})
    said = "2 x http_502 (no detail); then the server killed by SIGKILL (signal 9) (sent by the kernel's "
    assert check(res, sess, state) == ("server_error", "ServerError", said + "out-of-memory killer, or kill -9)")
    assert (res.server.exit_code, res.server.log_tail) == (-9, "bye")  # what the daemon recorded


def test_a_server_that_ended_without_answering_errors_is_a_server_death(tmp_path):
    died = SessionState(state=DIED, generation=GEN, exit_code=1)
    sess, state = held(tmp_path, [silent()], servers=[dead()], published=died)
    said = "the server exited with code 1 during the run"
    assert check(loaded(failures={"connection": 4}), sess, state) == ("server_died", "ServerExit", said)


def test_a_daemon_gone_while_its_session_still_reads_ready_is_a_lost_session(tmp_path):
    """No DIED recorded: the daemon was killed from outside, and its servers with it."""
    sess, state = held(tmp_path, [silent()], servers=[dead()])
    state.daemon = dead()
    sess.write(state)
    said = (
        f"the session's daemon (pid {state.daemon.pid}) ended mid-cell, killed from outside; its servers went with it"
    )
    assert check(loaded(failures={"connection": 4}), sess, state) == ("server_died", "SessionLost", said)


def test_unhealthy_says_why_servers_cannot_serve_another_cell(tmp_path, answering):
    _, state = held(tmp_path, [answering(200), answering(200)])
    assert checks.unhealthy(state, stack_spec()) is None
    assert checks.unhealthy(state, stack_spec(ready_path="/v1/models")) == "its health check gave HTTP 404"
    _, state = held(tmp_path, [answering(200), answering(503)], log=LOG)
    assert checks.unhealthy(state, stack_spec()) == "its health check gave HTTP 503; its log: RuntimeError: boom"
    _, state = held(tmp_path, [silent()])
    assert checks.unhealthy(state, stack_spec()) == "its health check gave no answer"


def test_unhealthy_says_a_server_process_is_gone_when_every_health_check_answered_200(tmp_path, answering):
    _, state = held(tmp_path, [answering(200)], servers=[dead()])
    assert checks.unhealthy(state, stack_spec()) == "a server process is gone"


def test_late_facts_fill_only_what_was_missing_at_ready_from_each_log_since_its_launch(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    earlier = "KV cache size: 1,000 tokens\n"  # an earlier launch's, before the offset
    a.write_text(earlier + "Using MarlinLinearKernel for GPTQ\nKV cache size: 2,048 tokens\n")
    b.write_text("Memory available for cache allocation: 512 MB\n")
    state = SessionState(server_logs=[str(a), str(b)], log_offsets=[len(earlier), 0])
    res = fake_result("s", 8, 0, 100.0)
    res.engine = EngineFacts(linear_kernel="CPUWNA16LinearKernel")
    checks.late_facts(res, state)
    assert res.engine == EngineFacts(linear_kernel="CPUWNA16LinearKernel", kv_cache_tokens=2048, kv_cache_gib=0.5)


def capped(kv=None, fit=None, peak=None, cards=1, applied=True):
    """A result of a stack capped at an 8 GiB card: the engine's KV cache and NVML's peak."""
    res = fake_result("s", 8, 0, 100.0)
    res.server.memory_cap = MemoryCap(
        card_memory_gib=8.0, applied=applied, card_total_gib=80.0, fraction=0.1, how="x", reason=None
    )
    res.engine = EngineFacts(kv_cache_gib=kv, kv_cache_fit_gib=fit)
    if peak is not None:
        gpu = GpuTelemetry(
            devices=[str(i) for i in range(cards)], samples=1, energy_j=0.0, energy_per_output_token_j=None,
            power_mean_w=0.0, power_peak_w=0.0, sm_util_mean_pct=0.0, memory_peak_gib=peak, series={},
        )  # fmt: skip
        res.telemetry = Telemetry(interval_s=0.5, gpu=gpu)
    return res


def test_over_memory_cap_allows_a_kv_cache_1_percent_over_its_fit_and_a_card_half_a_gib_over():
    assert [checks.over_memory_cap(capped(kv=kv, fit=2.0)) for kv in (2.0 * 1.01, 2.03)] == [False, True]
    # NVML's peak is summed over the session's cards: each card's share is compared
    assert [checks.over_memory_cap(capped(peak=p, cards=2)) for p in (17.0, 17.02)] == [False, True]
    assert checks.over_memory_cap(capped(kv=1.0, fit=2.0, peak=9.0)) is True  # the KV cache fits, the card does not
    assert checks.over_memory_cap(capped(kv=4.0, fit=2.0, peak=80.0, applied=False)) is False  # not capped
    assert checks.over_memory_cap(fake_result("s", 8, 0, 100.0)) is False  # no cap asked


def flags(res, cell=None, expect_kernel=""):
    return checks.honesty_flags(res, stack_spec(expect_kernel=expect_kernel), cell or cell_spec(min_measured_s=1.0))


def test_each_condition_sets_its_own_flag_and_no_other():
    assert flags(fake_result("s", 8, 0, 100.0)) == []
    assert flags(with_wall(fake_result("s", 8, 0, 100.0), 0.99)) == ["short_measurement"]
    assert flags(with_wall(fake_result("s", 8, 0, 100.0), 1.0)) == []
    stalled = fake_result("s", 8, 0, 100.0)
    for stall_s, flagged in ((0.25, []), (0.26, ["client_stalled"])):  # CLIENT_STALL_S itself is no stall yet
        stalled.summary.client_stall_s = stall_s
        assert flags(stalled) == flagged
    assert flags(capped(peak=9.0)) == ["over_memory_cap"]
    odd = fake_result("s", 8, 0, 100.0)
    odd.summary.output_tok_s = 500.0  # 1000 tokens in 2 s, where 200 were counted
    assert flags(odd) == ["implausible"]


def test_client_lag_is_flagged_above_an_open_loops_limit_only():
    open_loop = cell_spec(
        users=0, arrival={"pattern": "poisson", "rate_rps": 2.0, "requests": 8}, max_client_lag_s=0.05,
        min_measured_s=1.0,
    )  # fmt: skip
    res = fake_result("s", 8, 0, 100.0)
    res.summary.lag_s = Distribution(mean=0.01, median=0.01, p90=0.02, p99=0.05)
    assert flags(res, open_loop) == []
    res.summary.lag_s.p99 = 0.06
    assert flags(res, open_loop) == ["client_lag"]
    assert flags(res) == []  # a closed loop has no schedule to lag behind


def test_the_kernel_check_sets_kernel_ok_and_flags_a_mismatch():
    res = fake_result("s", 8, 0, 100.0)
    res.engine = EngineFacts(linear_kernel="MacheteLinearKernel")
    assert (flags(res, expect_kernel="Marlin"), res.kernel_ok) == (["kernel_mismatch"], False)
    assert (flags(res, expect_kernel="Machete"), res.kernel_ok) == ([], True)
    assert (flags(res), res.kernel_ok) == ([], None)  # nothing expected
    res.engine = EngineFacts()  # an engine that never named its kernel does not match one expected
    assert (flags(res, expect_kernel="Machete"), res.kernel_ok) == (["kernel_mismatch"], False)
