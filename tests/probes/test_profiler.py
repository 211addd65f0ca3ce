"""A profiled window (speedsplit/probes/profiler.py) against small HTTP servers standing in for vLLM's
profiler endpoints, which write hand-made Chrome traces where vLLM's workers would."""

import gzip
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from speedsplit.core.trace_split import ProfileWindow
from speedsplit.probes import profiler

WINDOW = ProfileWindow(delay_iterations=2, iterations=4)
KEY = "sk-speedsplit-test"


def k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def step(ts):  # vLLM's annotation of a decode-only engine step
    return {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_4(4)", "ts": ts, "dur": 1}


# two annotated decode steps, each: a cuBLAS GEMM 400 µs, FlashAttention 200, an NCCL all-reduce
# 100, then 300 idle before the next step; the host's op is not a kernel
TRACE_A = [step(0), step(1000), k("aten::mm", 0, 1700, cat="cpu_op")] + [
    e
    for t in (0, 1000)
    for e in (k("nvjet_tst_128x8", t, 400), k("flash_fwd_kernel", t + 400, 200), k("ncclAllReduce", t + 600, 100))
]
# not annotated (the window's 4 iterations): Marlin 2000 µs, then a 400 µs memcpy
TRACE_B = [k("void marlin::Marlin<256>", 0, 2000), k("Memcpy DtoH", 2000, 400, cat="gpu_memcpy")]


def write(path, events=None, raw=None):
    data = raw if raw is not None else json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" and raw is None else data)


def numbers(s):
    return (s.device, s.step_ms, s.dense_gemm_ms, s.quantized_gemm_ms, s.attention_ms, s.communication_ms,
            s.copy_ms, s.other_ms, s.idle_ms, s.steps, s.prefill_steps, s.kernels)  # fmt: skip


class Clock:
    """The module's clock: a sleep advances it at once (its flush wait polls every 1 s); at[t]
    runs when the clock reaches t (what a late worker writes meanwhile)."""

    def __init__(self, at=None):
        self.now, self.at = 0.0, at or {}

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.now += s
        if self.now in self.at:
            self.at.pop(self.now)()


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(profiler, "time", c)
    return c


@pytest.fixture()
def serve():
    """serve(name, on_stop, status) -> the url of a server that logs every request as (name, path,
    Authorization) in serve.log, and on /stop_profile runs on_stop before it answers."""
    log, servers = [], []

    def start(name, on_stop=lambda: None, status=200):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                log.append((name, self.path, self.headers.get("Authorization")))
                if self.path == "/stop_profile":
                    on_stop()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    start.log = log
    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def window(tmp_path, urls, load=lambda: 1, ranks=1, key=KEY):
    trace_dir = tmp_path / "traces"
    return profiler.profile_window(urls, key, WINDOW, trace_dir, trace_dir / "decode-run0", ranks, load)


@pytest.mark.parametrize("key,auth", [(KEY, f"Bearer {KEY}"), (None, None)])
def test_each_server_is_started_before_the_load_and_stopped_after_it_with_the_key(tmp_path, serve, clock, key, auth):
    urls = [serve(n, lambda: write(tmp_path / "traces" / f"{n}.pt.trace.json.gz", TRACE_B)) for n in "ab"]
    rec = window(tmp_path, urls, load=lambda: serve.log.append("load") or 2, ranks=2, key=key)
    assert rec.status == "ok" and rec.error is None
    assert serve.log == [
        ("a", "/start_profile", auth),
        ("b", "/start_profile", auth),
        "load",
        ("a", "/stop_profile", auth),
        ("b", "/stop_profile", auth),
    ]


def test_the_traces_the_window_left_are_kept_and_split_one_per_rank(tmp_path, serve, clock):
    traces = tmp_path / "traces"
    write(traces / "a-rank-0.1.pt.trace.json.gz", [k("rms_norm_kernel", 0, 999)])  # an earlier window's, late
    write(traces / "decode-run0" / "a-rank-0.0.pt.trace.json.gz", TRACE_A)  # an earlier attempt's kept trace

    def a_stops():  # vLLM's worker: its gzipped trace and its table of the top ops
        write(traces / "a-rank-0.2.pt.trace.json.gz", TRACE_A)
        (traces / "profiler_out_0.txt").write_text("Name  Self CUDA total\n")

    urls = [serve("a", a_stops), serve("b", lambda: write(traces / "b-rank-0.3.pt.trace.json", TRACE_B))]
    rec = window(tmp_path, urls, ranks=2)
    new = ["a-rank-0.2.pt.trace.json.gz", "b-rank-0.3.pt.trace.json", "profiler_out_0.txt"]
    assert rec.status == "ok" and rec.error is None and rec.window == WINDOW
    assert rec.traces == new and sorted(p.name for p in (traces / "decode-run0").iterdir()) == new
    assert sorted(p.name for p in traces.iterdir()) == ["a-rank-0.1.pt.trace.json.gz", "decode-run0"]
    # a: 2 steps over 0..1700 µs: GEMM 800, attention 400, all-reduce 200, idle 300 -> per step
    # 0.85 ms = 0.4 + 0.2 + 0.1 + 0.15; 6 kernels, no step prefilled
    # b: 4 steps (the window's iterations) over 0..2400 µs: Marlin 2000, memcpy 400 -> 0.6 ms =
    # 0.5 + 0.1, no idle; 1 kernel (a memcpy is no kernel), prefill not annotated
    assert [numbers(r) for r in rec.ranks] == [
        ("gpu", pytest.approx(0.85), pytest.approx(0.4), 0.0, pytest.approx(0.2), pytest.approx(0.1), 0.0, 0.0,
         pytest.approx(0.15), 2, 0, 6),
        ("gpu", pytest.approx(0.6), 0.0, pytest.approx(0.5), 0.0, 0.0, pytest.approx(0.1), 0.0, 0.0, 4, None, 1),
    ]  # fmt: skip
    assert rec.seconds == 1.0  # the sizes were seen twice, one poll apart


def test_the_wait_lasts_until_every_rank_has_written_its_trace_in_full(tmp_path, serve, monkeypatch):
    late = tmp_path / "traces" / "a-rank-1.pt.trace.json.gz"
    monkeypatch.setattr(profiler, "time", Clock(at={2.0: lambda: write(late, TRACE_B)}))

    def stop():  # rank 0 flushed; rank 1 has opened its file and fills it at 2 s
        write(tmp_path / "traces" / "a-rank-0.pt.trace.json.gz", TRACE_A)
        late.touch()

    rec = window(tmp_path, [serve("a", stop)], ranks=2)
    # 0 s: first sizes; 1 s: unchanged but rank 1's is empty; 2 s: it grew; 3 s: unchanged -> done
    assert rec.seconds == 3.0 and rec.status == "ok"
    assert [(r.steps, r.kernels) for r in rec.ranks] == [(2, 6), (4, 1)]  # rank 1's full trace was read


def test_a_profiler_that_wrote_no_trace_is_an_error_once_the_flush_wait_gives_up(tmp_path, serve, clock):
    rec = window(tmp_path, [serve("a")])
    assert (rec.status, rec.error, rec.traces, rec.ranks) == ("error", "the profiler wrote no trace", [], [])
    assert rec.seconds == 300.0 and list((tmp_path / "traces" / "decode-run0").iterdir()) == []


def test_a_load_that_completed_no_request_is_an_error_and_its_traces_are_still_kept(tmp_path, serve, clock):
    url = serve("a", lambda: write(tmp_path / "traces" / "a.pt.trace.json.gz", TRACE_A))
    rec = window(tmp_path, [url], load=lambda: 0)
    assert (rec.status, rec.error) == ("error", "the profiled load completed no request")
    assert rec.traces == ["a.pt.trace.json.gz"] and [r.kernels for r in rec.ranks] == [6]


def test_traces_without_a_kernel_or_an_op_are_an_error(tmp_path, serve, clock):
    rec = window(tmp_path, [serve("a", lambda: write(tmp_path / "traces" / "a.pt.trace.json.gz", [step(0)]))])
    assert (rec.status, rec.error) == ("error", "the traces hold no kernel and no op")
    assert (rec.traces, rec.ranks) == (["a.pt.trace.json.gz"], [])


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def broken_load():
    raise RuntimeError("the load generator broke")


CUT = gzip.compress(json.dumps({"traceEvents": TRACE_A}).encode())[:40]
BAD_JSON = "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
FAILURES = {
    "no server": (None, None, None, "URLError: <urlopen error [Errno 111] Connection refused>"),
    "start refused": (500, None, None, "HTTPError: HTTP Error 500: Internal Server Error"),
    "load raised": (200, None, broken_load, "RuntimeError: the load generator broke"),
    "cut gzip": (200, CUT, None, "EOFError: Compressed file ended before the end-of-stream marker was reached"),
    "not json": (200, gzip.compress(b"{traceEvents"), None, BAD_JSON),
}


@pytest.mark.parametrize("status,raw,load,error", FAILURES.values(), ids=FAILURES.keys())
def test_a_failure_is_the_records_error_in_one_line_never_raised(tmp_path, serve, clock, status, raw, load, error):
    trace = tmp_path / "traces" / "a.pt.trace.json.gz"
    url = closed_port_url() if status is None else serve("a", lambda: write(trace, raw=raw), status)
    rec = window(tmp_path, [url], load=load or (lambda: 1))
    assert (rec.status, rec.error, rec.ranks) == ("error", error, [])


def test_a_load_that_raises_still_stops_the_profiler_it_started(tmp_path, serve, clock):
    # else the armed profiler, still waiting out its delay_iterations, profiles the server's next cell
    rec = window(tmp_path, [serve("a")], load=broken_load)
    assert rec.error == "RuntimeError: the load generator broke"
    assert [path for _, path, _ in serve.log] == ["/start_profile", "/stop_profile"]


def test_a_failure_whose_message_has_several_lines_is_recorded_by_its_first(tmp_path, serve, clock):
    def load():  # the load's own spec refused (pydantic's message: one line per error, and more)
        ProfileWindow.model_validate({"iterations": 0})

    rec = window(tmp_path, [serve("a")], load=load)
    assert rec.error == "ValidationError: 1 validation error for ProfileWindow"
