"""Telemetry: Prometheus text parsed as vLLM exposes it, counters cut to the measured phase
by interpolation, energy per token from NVML's energy counter, and the reasons when a side
cannot be read (no /metrics, no GPU)."""

import threading
import time

import pytest
from aiohttp import web

from speedsplit.probes import telemetry as T

VLLM_METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 512.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 4096.0
"""


def test_prometheus_samples_are_summed_over_engines():
    two = VLLM_METRICS + 'vllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
    got = T.parse_prometheus(two, {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"})
    assert got == {"vllm:kv_cache_usage_perc": 0.25, "vllm:num_requests_running": 12.0}


def test_counters_are_cut_to_the_measured_phase():
    # readings at t = 0, 1, 2, 3 s; the measured phase is [0.5, 2.5]
    samples = [
        (
            float(t),
            {
                "vllm:kv_cache_usage_perc": kv,
                "vllm:num_requests_running": 8.0,
                "vllm:num_requests_waiting": w,
                "vllm:num_preemptions_total": p,
                "vllm:prefix_cache_hits_total": 0.0,
                "vllm:prefix_cache_queries_total": 100.0 * t,
            },
        )
        for t, kv, w, p in ((0, 0.1, 0.0, 0.0), (1, 0.5, 4.0, 2.0), (2, 0.7, 2.0, 6.0), (3, 0.2, 0.0, 6.0))
    ]
    s = T.server_summary(samples, 0.5, 2.5)
    assert s.samples == 2 and s.kv_cache_usage_peak == 0.7 and s.kv_cache_usage_mean == pytest.approx(0.6)
    assert s.waiting_mean == 3.0 and s.preemptions == pytest.approx(6.0 - 1.0)  # 1.0 at 0.5 s, 6.0 at 2.5 s
    assert s.prefix_cache_hit_rate == 0.0 and s.prefix_cache_hits_flagged is False
    assert (s.prefix_cache_hits, s.prefix_cache_queries) == (0.0, pytest.approx(200.0))  # the counts, not a rate only
    assert s.series["t"] == [0.5, 1.5] and s.series["kv_cache"] == [0.5, 0.7]
    samples[2][1]["vllm:prefix_cache_hits_total"] = 150.0  # 150 of 200 queries hit: distinct prompts should not
    assert T.server_summary(samples, 0.5, 2.5).prefix_cache_hits_flagged is True
    assert T.server_summary(samples, 3.5, 4.0) is None  # no reading inside


def test_energy_per_token_from_the_energy_counter():
    # 700 W flat: the counter rises 700 J a second; 1.5 s measured, 3000 output tokens
    samples = [
        (float(t), {"power_w": 700.0, "energy_j": 1000.0 + 700.0 * t, "sm_util_pct": 90.0, "memory_gib": 20.0})
        for t in range(4)
    ]
    g = T.gpu_summary(samples, 0.75, 2.25, 3000, ["0"])
    assert g.energy_j == pytest.approx(1050.0) and g.energy_per_output_token_j == pytest.approx(0.35)
    assert g.power_mean_w == 700.0 and g.sm_util_mean_pct == 90.0 and g.devices == ["0"]
    assert T.gpu_summary(samples, 2.5, 3.5, 3000, ["0"]) is None  # the end is not bracketed


def test_a_cpu_run_says_why_there_are_no_gpu_readings():
    assert T.GpuProbe(["cpu"]).absent == "no GPU: the run was on the CPU"
    probe = T.GpuProbe(["0"])  # no NVML here (or no card 0 it can read)
    assert probe.absent is None or probe.absent.startswith("NVML")


def _serve(app):
    """app served on a loopback port on a thread of its own: (its URL, its loop)."""
    import asyncio
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}", loop


@pytest.fixture
def plain_server():
    """A real HTTP server without /metrics (as transformers serve and hf-generate are)."""

    async def health(_):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    url, loop = _serve(app)
    yield url
    loop.call_soon_threadsafe(loop.stop)


def test_a_server_without_metrics_is_said_so_and_sampling_goes_on(plain_server):
    sampler = T.Sampler(T.ServerProbe([plain_server]), T.GpuProbe(["cpu"]), interval_s=0.05)
    with sampler:
        threading.Event().wait(0.2)
    tel = T.summarize(sampler, 0.0, 1e12, 100, ["cpu"])
    assert tel.server is None and tel.server_absent == "the server has no Prometheus /metrics endpoint (HTTP 404)"
    assert tel.gpu is None and tel.gpu_absent == "no GPU: the run was on the CPU"


@pytest.mark.serial
def test_one_slow_metrics_answer_is_a_missed_reading_not_the_end_of_the_readings():
    """A vLLM-like /metrics whose first answer comes after the probe's timeout: that reading is
    missed (and counted), every later one is taken."""
    import asyncio

    calls = []

    async def metrics(_):
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(0.6)
        body = "vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 2\nvllm:num_requests_waiting 0\n"
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    url, loop = _serve(app)
    sampler = T.Sampler(T.ServerProbe([url], timeout_s=0.2), T.GpuProbe(["cpu"]), interval_s=0.05)
    t0 = time.time()
    with sampler:
        threading.Event().wait(1.2)
    loop.call_soon_threadsafe(loop.stop)
    tel = T.summarize(sampler, t0, time.time(), 100, ["cpu"])
    assert tel.server_absent is None and tel.server.samples >= 5, tel
    assert tel.server.missed_readings == 1 and "did not answer" in tel.server.missed_why[0]
    assert tel.server.kv_cache_usage_peak == 0.5 and tel.server.sparse is False


def test_a_phase_with_few_readings_is_flagged_sparse():
    samples = [(10.0, {"vllm:kv_cache_usage_perc": 0.2}), (19.0, {"vllm:kv_cache_usage_perc": 0.4})]
    summary = T.server_summary(samples, 9.5, 19.5, interval_s=0.5)
    assert summary.samples == 2 and summary.sparse is True  # 20 readings were due
    assert T.server_summary(samples, 9.5, 19.5, interval_s=5.0).sparse is False


@pytest.mark.serial
def test_a_measured_phase_shorter_than_the_interval_still_has_a_reading_when_the_sampler_is_poked():
    """The load generator pokes the sampler as its measured phase starts: a phase of 0.3 s on a
    10 s interval gets a reading inside it (without the poke it has none and says so)."""
    body = "vllm:kv_cache_usage_perc 0.25\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"

    async def metrics(_):
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    url, loop = _serve(app)
    readings = {}
    for poked in (False, True):
        sampler = T.Sampler(T.ServerProbe([url]), T.GpuProbe(["cpu"]), interval_s=10.0)
        with sampler:
            threading.Event().wait(0.2)  # the first reading, then the warm-up
            start = time.time()
            if poked:
                sampler.poke()
            threading.Event().wait(0.3)
            end = time.time()
        readings[poked] = T.summarize(sampler, start, end, 100, ["cpu"])
    loop.call_soon_threadsafe(loop.stop)
    assert readings[False].server is None and readings[False].server_absent.startswith("no sample inside")
    assert readings[True].server.samples == 1 and readings[True].server.kv_cache_usage_peak == 0.25


@pytest.mark.serial
def test_a_poke_is_not_held_back_by_a_slow_reading_in_flight():
    """The sampler's own reading is in flight (a /metrics answer taking 1 s, as on a busy CPU)
    when a 0.3 s measured phase starts: the poke's reading is taken on a thread of its own and
    lands inside the phase; the samples come out in time order."""
    import asyncio

    calls = []

    async def metrics(_):
        calls.append(time.time())
        if len(calls) == 1:
            await asyncio.sleep(1.0)
        return web.Response(text="vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 1\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    url, loop = _serve(app)
    sampler = T.Sampler(T.ServerProbe([url]), T.GpuProbe(["cpu"]), interval_s=10.0)
    with sampler:
        threading.Event().wait(0.2)  # the first reading is in flight
        start = time.time()
        sampler.poke()
        threading.Event().wait(0.3)
        end = time.time()
    loop.call_soon_threadsafe(loop.stop)
    assert len(calls) == 3  # the slow one, the poke's, the one after the load
    tel = T.summarize(sampler, start, end, 100, ["cpu"])
    assert tel.server is not None and tel.server.samples == 1, tel
    times = [t for t, _ in sampler.server_samples]
    assert times == sorted(times) and times[0] < start < times[1] < end < times[2]


def test_engine_steps_run_from_the_reading_between_the_phases_to_the_first_after_the_end():
    """The warm-up's 24 steps end before the phase; bench reads the counter between the phases
    (0.95 s); the poke as the phase starts (1.003 s) already holds 6 of its steps; the first
    reading after its end holds all 120: 120, neither the warm-up's, nor less its first, nor an
    interpolated part."""
    steps = "vllm:iteration_tokens_total_count"
    samples = [
        (0.0, {steps: 0.0}),
        (0.4, {steps: 10.0}),
        (0.95, {steps: 24.0}),
        (1.003, {steps: 30.0}),
        (1.5, {steps: 80.0}),
        (3.2, {steps: 144.0}),
    ]
    s = T.server_summary(samples, 1.0, 3.0)
    assert s.engine_steps == 120.0 and s.engine_tokens is None  # the sum was not exposed


def test_llama_cpp_counts_its_steps_as_its_decode_calls():
    """llama.cpp's server has no vLLM step histogram; its llama_decode() calls are its steps."""
    steps = "llamacpp:n_decode_total"
    samples = [(0.9, {steps: 40.0}), (2.0, {steps: 90.0}), (3.1, {steps: 140.0})]
    s = T.server_summary(samples, 1.0, 3.0)
    assert s.engine_steps == 100.0 and s.engine_tokens is None
