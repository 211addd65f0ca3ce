"""What the servers and the GPUs were doing while a cell was measured: the servers' own
Prometheus counters (vLLM's /metrics: KV-cache use, running and waiting requests,
preemptions, prefix-cache hits) and NVML's (power, the total-energy counter, SM utilisation,
memory), sampled on a thread during the load and cut to the measured phase.

A stack without /metrics, or a machine without NVML, gets the reason instead of numbers.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from speedsplit.core import apikey
from speedsplit.core.record import Telemetry
from speedsplit.core.facts import GpuTelemetry, ServerTelemetry

# vLLM's names (0.26 and later); counters are exposed with a _total suffix.
GAUGES = {"kv_cache": "vllm:kv_cache_usage_perc", "running": "vllm:num_requests_running"}
GAUGES["waiting"] = "vllm:num_requests_waiting"
COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    # a KV connector's (KV-cache offload, LMCache): prompt tokens looked up past the card's
    # prefix cache, and found there
    "offload_hits": "vllm:external_prefix_cache_hits_total",
    "offload_queries": "vllm:external_prefix_cache_queries_total",
    # the engine's steps and the tokens they carried (prefill and decode): a histogram of the
    # tokens of each step, observed once a step
    "engine_steps": "vllm:iteration_tokens_total_count",
    "engine_tokens": "vllm:iteration_tokens_total_sum",
    # a speculative decoder's drafts, the tokens they proposed and those accepted
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
# Another engine's name for the same counter, read where vLLM's is absent: llama.cpp's server
# counts its llama_decode() calls, one a step of its slots (a long prompt's batches several).
ALSO = {"engine_steps": "llamacpp:n_decode_total"}
# Above this prefix-cache hit rate with distinct prompts, something is reusing work it should not.
PREFIX_HIT_FLAG = 0.05


def parse_prometheus(text: str, names: set[str]) -> dict[str, float]:
    """The named samples of a Prometheus text exposition, summed over their label sets (one
    per engine or instance)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


class ServerProbe:
    """Reads /metrics of each server of a session. `absent` says why it never can (no endpoint,
    no vLLM counters); a reading that fails once (a slow answer, a refused connection) is only
    missed: sampling goes on, and `misses` keeps when and why."""

    def __init__(self, urls: list[str], timeout_s: float = 2.0, api_key: str | None = None):
        self.urls, self.timeout_s, self.absent = urls, timeout_s, None
        self._headers = apikey.headers(api_key)  # llama.cpp asks /metrics for the key too
        self.misses: list[tuple[float, str]] = []
        self.names = set(GAUGES.values()) | set(COUNTERS.values()) | set(ALSO.values())

    def read(self) -> dict[str, float] | None:
        total: dict[str, float] = {}
        for url in self.urls:
            try:
                req = urllib.request.Request(f"{url}/metrics", headers=self._headers)
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    values = parse_prometheus(resp.read().decode(errors="replace"), self.names)
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 405, 501):
                    self.absent = f"the server has no Prometheus /metrics endpoint (HTTP {exc.code})"
                else:
                    self.misses.append((time.time(), f"/metrics answered HTTP {exc.code}"))
                return None
            except (OSError, ValueError) as exc:
                self.misses.append((time.time(), f"/metrics did not answer ({type(exc).__name__})"))
                return None
            if not values:
                self.absent = "/metrics answered without vLLM's counters"
                return None
            for k, v in values.items():
                total[k] = total.get(k, 0.0) + v
        return total


def _handle(pynvml, device: str):
    """NVML's handle of a card as the lease names it (an index or a UUID)."""
    if device.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(device)
    return pynvml.nvmlDeviceGetHandleByIndex(int(device))


def card_memory_gib(devices: list[str]) -> float:
    """The memory of the smallest of these cards, from NVML (a memory cap is taken from it)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return min(pynvml.nvmlDeviceGetMemoryInfo(_handle(pynvml, d)).total for d in devices) / 2**30
    finally:
        pynvml.nvmlShutdown()


class GpuProbe:
    """Reads NVML for the session's cards; `absent` says why it cannot."""

    def __init__(self, devices: list[str]):
        self.absent, self.handles, self.nvml = None, [], None
        self.misses: list[tuple[float, str]] = []
        if not devices or devices == ["cpu"]:
            self.absent = "no GPU: the run was on the CPU"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [_handle(pynvml, d) for d in devices]
        except Exception as exc:  # no library, no driver, an unknown card: say which
            self.absent = f"NVML unavailable ({type(exc).__name__}: {exc})"
            self.handles = []

    def read(self) -> dict[str, float] | None:
        if self.absent:
            return None
        n = self.nvml
        try:
            power = sum(n.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1000.0
            energy = sum(n.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0
            util = sum(n.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles) / len(self.handles)
            used = sum(n.nvmlDeviceGetMemoryInfo(h).used for h in self.handles) / 2**30
        except Exception as exc:  # one failed read is a missed reading, not the end of the readings
            self.misses.append((time.time(), f"NVML read failed ({type(exc).__name__}: {exc})"))
            return None
        return {"power_w": power, "energy_j": energy, "sm_util_pct": util, "memory_gib": used}


class Sampler:
    """Samples the probes every interval_s on a thread, from start() to stop(), and at once
    when poked (the measured phase's start: a phase shorter than the interval still has a
    reading inside it). A poke reads on a thread of its own: a reading still in flight on the
    sampler's thread (a slow /metrics answer on a busy CPU) would hold it past a short phase."""

    def __init__(self, server: ServerProbe, gpu: GpuProbe, interval_s: float = 0.5):
        self.server, self.gpu, self.interval_s = server, gpu, interval_s
        self.server_samples: list[tuple[float, dict]] = []
        self.gpu_samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._pokes: list[threading.Thread] = []

    def sample(self) -> None:
        """Take a reading now, on the caller's thread."""
        now = time.time()
        if not self.server.absent and (s := self.server.read()) is not None:
            self.server_samples.append((now, s))
        if not self.gpu.absent and (g := self.gpu.read()) is not None:
            self.gpu_samples.append((now, g))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def poke(self) -> None:
        """Take a reading now (on a thread of its own: the caller does not wait)."""
        self._pokes.append(threading.Thread(target=self.sample, name="telemetry-poke", daemon=True))
        self._pokes[-1].start()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for poke in self._pokes:
            poke.join(timeout=10)
        self.sample()  # one reading after the load, so the window's end is bracketed
        for samples in (self.server_samples, self.gpu_samples):  # a poke's reading may land late
            samples.sort(key=lambda sample: sample[0])


def _at(samples: list[tuple[float, dict]], key: str, t: float) -> float | None:
    """A counter's value at time t, linear between the samples around it (None outside)."""
    before = [(ts, s[key]) for ts, s in samples if ts <= t and key in s]
    after = [(ts, s[key]) for ts, s in samples if ts >= t and key in s]
    if not before or not after:
        return None
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _within(samples: list[tuple[float, dict]], start: float, end: float) -> list[tuple[float, dict]]:
    return [(t, s) for t, s in samples if start <= t <= end]


def _series(samples: list[tuple[float, dict]], keys: dict[str, str], start: float, digits: int = 3) -> dict:
    out = {"t": [round(t - start, 2) for t, _ in samples]}
    for short, name in keys.items():
        out[short] = [round(s[name], digits) if name in s else None for _, s in samples]
    return out


def server_summary(
    samples, start: float, end: float, interval_s: float = 0.5, misses: list[tuple[float, str]] = ()
) -> ServerTelemetry | None:
    """The measured phase [start, end] of the server's counters: peak and mean KV-cache use,
    mean running and waiting requests, preemptions and the prefix-cache hit rate over it; the
    readings the server missed in it, and whether so few were had that peaks and means rest
    on a handful of points (fewer than half of one per interval)."""
    inside = _within(samples, start, end)
    if not inside:
        return None
    missed = [why for t, why in misses if start <= t <= end]
    expected = max(1, int((end - start) / interval_s))

    def gauge(name):
        return [s[name] for _, s in inside if name in s]

    def delta(name):
        a, b = _at(samples, name, start), _at(samples, name, end)
        return None if a is None or b is None else max(0.0, b - a)

    def settled(name):
        """A counter's change over a phase outside which the server serves none of this load:
        from the last reading before its start (bench takes one between the warm-up and the
        phase, nothing in flight: Sampler.sample) to the first at or after its end.
        Interpolating would count a step just before the end as half a step; the poke as the
        phase starts may already hold its first steps (vLLM on a CPU: 15 of 56)."""
        a = [s[name] for t, s in samples if t < start and name in s]
        b = [s[name] for t, s in samples if t >= end and name in s]
        return max(0.0, b[0] - a[-1]) if a and b else None

    def first(*values):
        return next((v for v in values if v is not None), None)

    kv, running, waiting = gauge(GAUGES["kv_cache"]), gauge(GAUGES["running"]), gauge(GAUGES["waiting"])
    hits, queries = delta(COUNTERS["prefix_hits"]), delta(COUNTERS["prefix_queries"])
    rate = hits / queries if hits is not None and queries else None
    off_hits, off_queries = delta(COUNTERS["offload_hits"]), delta(COUNTERS["offload_queries"])
    return ServerTelemetry(
        samples=len(inside),
        kv_cache_usage_peak=max(kv) if kv else None,
        kv_cache_usage_mean=sum(kv) / len(kv) if kv else None,
        running_mean=sum(running) / len(running) if running else None,
        waiting_mean=sum(waiting) / len(waiting) if waiting else None,
        waiting_peak=max(waiting) if waiting else None,
        preemptions=delta(COUNTERS["preemptions"]),
        prefix_cache_hit_rate=rate,
        prefix_cache_hits=hits,
        prefix_cache_queries=queries,
        prefix_cache_hits_flagged=rate is not None and rate > PREFIX_HIT_FLAG,
        offload_hits=off_hits,
        offload_queries=off_queries,
        engine_steps=first(settled(COUNTERS["engine_steps"]), settled(ALSO["engine_steps"])),
        engine_tokens=settled(COUNTERS["engine_tokens"]),
        spec_drafts=settled(COUNTERS["spec_drafts"]),
        spec_draft_tokens=settled(COUNTERS["spec_draft_tokens"]),
        spec_accepted_tokens=settled(COUNTERS["spec_accepted"]),
        missed_readings=len(missed),
        missed_why=sorted(set(missed))[:3],
        sparse=len(inside) < expected / 2,
        series=_series(inside, GAUGES, start),
    )


def gpu_summary(samples, start: float, end: float, output_tokens: int, devices: list[str]) -> GpuTelemetry | None:
    """The measured phase [start, end] on the cards: energy from the total-energy counter
    (interpolated at both ends), energy per output token, mean and peak power, mean SM
    utilisation, peak memory."""
    inside = _within(samples, start, end)
    e0, e1 = _at(samples, "energy_j", start), _at(samples, "energy_j", end)
    if not inside or e0 is None or e1 is None:
        return None
    energy = e1 - e0
    power = [s["power_w"] for _, s in inside]
    return GpuTelemetry(
        devices=devices,
        samples=len(inside),
        energy_j=energy,
        energy_per_output_token_j=energy / output_tokens if output_tokens else None,
        power_mean_w=sum(power) / len(power),
        power_peak_w=max(power),
        sm_util_mean_pct=sum(s["sm_util_pct"] for _, s in inside) / len(inside),
        memory_peak_gib=max(s["memory_gib"] for _, s in inside),
        series=_series(inside, {"power_w": "power_w", "sm_util_pct": "sm_util_pct"}, start, 1),
    )


def summarize(sampler: Sampler, start: float, end: float, output_tokens: int, devices: list[str]) -> Telemetry:
    """The run's telemetry over its measured phase, or the reasons there is none."""
    server = server_summary(sampler.server_samples, start, end, sampler.interval_s, sampler.server.misses)
    gpu = gpu_summary(sampler.gpu_samples, start, end, output_tokens, devices)
    too_short = f"no sample inside the measured phase ({end - start:.2f} s; interval {sampler.interval_s} s)"
    missed = [why for t, why in sampler.server.misses if start <= t <= end]
    return Telemetry(
        interval_s=sampler.interval_s,
        server=server,
        server_absent=None if server else (sampler.server.absent or (missed and missed[-1]) or too_short),
        gpu=gpu,
        gpu_absent=None
        if gpu
        else (sampler.gpu.absent or (sampler.gpu.misses and sampler.gpu.misses[-1][1]) or too_short),
    )
