"""The parts of a run's result (core/record.RunResult) that say what was observed: the engine,
the server and its memory cap, the weights and their shape, timing, errors, hardware and
provenance, the latency objectives, telemetry and the client's calibration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StrictRecord(BaseModel):
    """The base of every record that goes to disk."""

    # Unknown keys are refused: a reader never meets a shape the writer does not produce.
    model_config = ConfigDict(extra="forbid")


class EngineFacts(StrictRecord):
    """What the engine said about itself in this launch's log (null where it was silent)."""

    linear_kernel: str | None = None
    attention_backend: str | None = None
    weight_memory_gib: float | None = None
    kv_cache_tokens: int | None = None
    kv_cache_gib: float | None = Field(default=None, description="memory the engine gave its KV cache")
    kv_cache_fit_gib: float | None = Field(
        default=None,
        description="the KV cache that would have kept the engine inside its memory share (vLLM's own estimate)",
    )
    max_concurrency: float | None = None
    quantization: str | None = None
    dtype: str | None = None
    missing_extension: str | None = Field(
        default=None,
        description="a compiled extension the engine or a plugin of it could not load and ran without, on its "
        "slower fallback (its module, as the log names it)",
    )
    load_s: float | None = Field(default=None, description="start-up: seconds loading the weights (vLLM)")
    compile_s: float | None = Field(default=None, description="start-up: torch.compile in total (vLLM)")
    graphs_s: float | None = Field(default=None, description="start-up: capturing CUDA graphs (vLLM)")
    engine_init_s: float | None = Field(
        default=None, description="start-up: the engine's profile, KV cache and warm-up, compile and graphs included"
    )
    compile_cache: Literal["warm", "cold"] | None = Field(
        default=None, description="whether vLLM read its compiled graphs back from its cache or compiled them"
    )
    config_s: float | None = Field(
        default=None,
        description="start-up: the API server resolving the model's configuration (vLLM's model inspection; "
        "whole seconds off the log's clock)",
    )
    spawn_s: float | None = Field(
        default=None, description="start-up: the engine process starting, its imports (vLLM; log clock)"
    )
    warmup_s: float | None = Field(
        default=None, description="start-up: after the CUDA graphs, KV cache set-up and warm-up runs (vLLM; log clock)"
    )


class HostSpeed(StrictRecord):
    """The host's own speed around the run's load: one fixed piece of work timed on the client's
    core just before the load and just after it (measuring/hostspeed.py)."""

    before_ms: float = Field(description="the work's time just before the load (the quickest of a few rounds)")
    after_ms: float = Field(description="the same just after the load")

    @property
    def moved(self) -> float:
        """How far the host's speed moved across the load (1.0: not at all; 1.4: 40%, either way)."""
        return max(self.before_ms, self.after_ms) / min(self.before_ms, self.after_ms)


class MemoryCap(StrictRecord):
    """The stack's memory cap (card_memory_gib): a big card made to look like a smaller one."""

    card_memory_gib: float = Field(description="the emulated card's memory")
    applied: bool = Field(description="whether the cap was put on the server")
    card_total_gib: float | None = Field(description="the real card's memory (the smallest of the session's)")
    fraction: float | None = Field(description="card_memory_gib / card_total_gib, rounded down")
    how: str | None = Field(description="the server flag, or speedsplit.serving.memcap for a server without one")
    reason: str | None = Field(description="why it was not applied")


class ServerFacts(StrictRecord):
    """The server session the run was measured on."""

    startup_s: float | None = Field(description="seconds from launch to ready (of the session, not this run)")
    lease_wait_s: float | None = Field(description="seconds waited for cards and ports")
    devices: list[str] | None = Field(description="cards the session held")
    cpus: str | None = Field(
        None, description="host cores its servers and this run's client were pinned to ('0-15'); None: not pinned"
    )
    argv: str | None = Field(description="the server command line (redacted)")
    model_id: str | None = Field(description="model name the server answers to")
    error: str | None = Field(description="why the session did not serve this run")
    log_tail: str | None = Field(description="end of the server log when it failed")
    exit_code: int | None
    wide_listeners: list[str] | None = Field(description="server sockets not bound to loopback (internal ports)")
    reused: bool = Field(description="the server had served an earlier cell")
    cells_before: int = Field(description="cells the session measured before this one")
    memory_cap: MemoryCap | None = Field(None, description="the memory cap the session ran under; None: none asked")
    host_memory: str | None = Field(
        None, description="a CPU server's host-memory cap (host_cache_cap), in words; None: none"
    )
    compile_cache_dir: str | None = Field(
        None,
        description="the compile cache its servers used: 'shared <key>' (one per model, stack, topology and "
        "engine version, reused across sessions) or 'private: <why>'; None: results from before it was shared",
    )
    lease_holders: list[str] | None = Field(
        None,
        description="who held the cards while the session waited for them (lease_wait_s), in words: another "
        "workflow's session, or a process; None: nobody, or results from before it was recorded",
    )
    shared_with: list[str] | None = Field(
        None,
        description="other workflows' sessions measuring on this host when this run's load started or ended "
        "(they share its cores, memory and buses); None: none seen",
    )
    api_key_required: bool | None = Field(
        None,
        description="benchmark.api_key: True when the server refused a request without the session's key (checked "
        "at its start), False when its engine has no key option (api_key_env null); None: no key asked",
    )


class ModelSource(StrictRecord):
    """What speedsplit wrote about the served folder (speedsplit-model.json); empty if unreadable."""

    source: Literal["synthetic", "hub", "local"] | None = None
    shape: str | None = Field(default=None, description="synthetic: the published shape it copies")
    weights: str | None = Field(default=None, description="synthetic: random (seeded) or dummy (engine-initialised)")
    seed: int | None = None
    tokenizer: str | None = Field(
        default=None, description="synthetic: wordlevel, gpt2 (llama.cpp reads it), or bpe (trained with the weights)"
    )
    training: dict | None = Field(default=None, description="trained: its steps, losses and corpus (models/train.py)")
    repo: str | None = Field(default=None, description="hub: the repository")
    revision: str | None = Field(default=None, description="hub: the pinned revision")
    path: str | None = Field(default=None, description="local: the user's folder (its files are linked)")
    architecture: str | None = Field(default=None, description="local: config.json's architecture")
    dtype: str | None = Field(default=None, description="local: config.json's dtype")
    size_gib: float | None = Field(default=None, description="local: its weights; gguf: the GGUF file")
    quantization_config: dict | None = Field(default=None, description="local: config.json's, if any")
    variant: str | None = Field(default=None, description="gptq, awq or gguf for a converted folder")
    gguf_type: str | None = Field(default=None, description="gguf: the GGUF tensor type (f16, bf16, q8_0)")
    method: str | None = Field(default=None, description="gguf: what converted it")
    convert_s: float | None = Field(default=None, description="gguf: seconds the conversion took")
    converted_from: str | None = Field(default=None, description="gguf: the FP16 folder it was converted from")


class QuantConfig(StrictRecord):
    quant_method: str | None
    bits: int | None
    group_size: int | None
    desc_act: bool | None
    sym: bool | None


class ModelShape(StrictRecord):
    """The served model's shape from its config.json (what the roofline needs); empty if unreadable."""

    architectures: list[str] | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    quantization_config: QuantConfig | None = None


class Timing(StrictRecord):
    """When the job and its load ran (Unix seconds), for packing: how busy each card was."""

    job_start: float
    load_start: float | None = Field(default=None, description="the load's first request (warm-up included)")
    load_end: float | None = None
    job_end: float | None = None


class ErrorInfo(StrictRecord):
    """Why a run is not ok: the job's own exception, or what its servers did (ServerError: they
    answered requests with errors; ServerExit: one ended, with its exit code or signal;
    SessionLost: the session's daemon was killed; ServerHung; RequestsFailed; StartupFailed;
    CapacitySkip), with the failure their logs name."""

    type: str = Field(description="the exception's class, or the kind of server failure")
    message: str = Field(description="the cause in words, redacted")


class Gpu(StrictRecord):
    index: str
    name: str
    driver: str
    memory: str


class Hardware(StrictRecord):
    host_cpu: str
    cpu_count: int | None
    gpus: list[Gpu] | None = Field(default=None, description="absent on a host without nvidia-smi")
    platform: str | None = Field(
        default=None,
        description="the platform the job found where it ran: cuda where nvidia-smi lists a GPU, else cpu "
        "(absent in results written before it was recorded)",
    )


class Provenance(StrictRecord):
    versions: dict[str, str] = Field(description="versions of the packages that matter")
    python: str
    workflow_commit: str = Field(description="git commit of the workflow ('-dirty' with local changes)")
    hardware: Hardware


class Slo(StrictRecord):
    """The measured phase against the latency objectives (speedsplit/probes/slo.py)."""

    ttft_p99_s: float = Field(description="objective: p99 time to first token at most this")
    tpot_p99_s: float = Field(description="objective: p99 time per output token at most this")
    met: bool = Field(description="no request failed and both p99s held")
    violations: list[str] = Field(description="what did not hold, in words")
    good_requests: int = Field(description="completed requests whose own TTFT and TPOT met the objectives")
    goodput_rps: float | None = Field(description="good requests per second of the measured phase")


class ServerTelemetry(StrictRecord):
    """The server's own counters (vLLM's /metrics) over the measured phase."""

    samples: int = Field(description="readings inside the measured phase")
    kv_cache_usage_peak: float | None = Field(description="highest KV-cache use, a fraction of the cache")
    kv_cache_usage_mean: float | None
    running_mean: float | None = Field(description="requests being decoded, mean over readings")
    waiting_mean: float | None = Field(description="requests queued, mean over readings")
    waiting_peak: float | None
    preemptions: float | None = Field(description="requests preempted during the phase (counter difference)")
    prefix_cache_hit_rate: float | None = Field(description="prefix-cache hits / queries during the phase")
    prefix_cache_hits: float | None = Field(None, description="prefix-cache hits during the phase (tokens, vLLM)")
    prefix_cache_queries: float | None = Field(
        None, description="prefix-cache queries during the phase (tokens looked up, vLLM)"
    )
    offload_hits: float | None = Field(
        None,
        description="prompt tokens a KV connector (KV-cache offload, LMCache) found past the card's prefix cache "
        "during the phase (vLLM's external prefix-cache hits; null: no connector)",
    )
    offload_queries: float | None = Field(
        None, description="prompt tokens looked up in the KV connector during the phase (null: no connector)"
    )

    @property
    def offload_hit_rate(self) -> float | None:
        """The share of prompt tokens looked up past the card that an offloaded tier held."""
        return (
            self.offload_hits / self.offload_queries if self.offload_hits is not None and self.offload_queries else None
        )

    prefix_cache_hits_flagged: bool = Field(
        description="hit rate above 5%: with distinct prompts the server should be reusing almost nothing"
    )
    engine_steps: float | None = Field(
        None,
        description="the engine's steps during the phase (vLLM: vllm:iteration_tokens_total's count; null: not "
        "exposed, or results from before)",
    )
    engine_tokens: float | None = Field(
        None, description="the tokens those steps carried, prefill and decode (vllm:iteration_tokens_total's sum)"
    )
    spec_drafts: float | None = Field(
        None, description="a speculative decoder's drafts during the phase (null: not speculative, or not exposed)"
    )
    spec_draft_tokens: float | None = Field(None, description="the tokens those drafts proposed")
    spec_accepted_tokens: float | None = Field(None, description="the drafted tokens the target model accepted")
    missed_readings: int = Field(0, description="readings the server did not answer during the phase")
    missed_why: list[str] = Field(default_factory=list, description="why they were missed")
    sparse: bool = Field(
        False, description="fewer than half the readings the phase should have had: peaks and means rest on few points"
    )
    series: dict[str, list[float | None]] = Field(
        description="the readings: t (s from the phase start), kv_cache, running, waiting"
    )


class GpuTelemetry(StrictRecord):
    """NVML over the measured phase, summed (energy, power, memory) or averaged (utilisation)
    over the session's cards."""

    devices: list[str]
    samples: int
    energy_j: float = Field(description="total-energy counter difference over the phase (interpolated at both ends)")
    energy_per_output_token_j: float | None = Field(description="energy_j / the phase's output tokens")
    power_mean_w: float
    power_peak_w: float
    sm_util_mean_pct: float
    memory_peak_gib: float
    series: dict[str, list[float | None]] = Field(description="the readings: t, power_w, sm_util_pct")


class Telemetry(StrictRecord):
    """What the servers and the GPUs were doing while the cell was measured; where a side
    could not be read, the reason instead."""

    interval_s: float = Field(description="seconds between readings")
    server: ServerTelemetry | None = None
    server_absent: str | None = Field(None, description="why there are no server counters")
    gpu: GpuTelemetry | None = None
    gpu_absent: str | None = Field(None, description="why there are no GPU readings")


class CalibrationLevel(StrictRecord):
    """The load generator against the reference server at one number of users: what it saw
    minus what the server's known speed makes (medians over requests, seconds)."""

    users: int
    requests: int
    ttft_s: float = Field(description="measured TTFT less the true one")
    itl_s: float = Field(description="mean gap between chunks less the true one")
    tpot_s: float = Field(description="measured TPOT less the true one (the stream's end comes after its last token)")
    e2e_s: float = Field(description="measured end-to-end latency less the true one")
    e2e_p90_s: float = Field(description="its 90th percentile over requests")
    ttft_p99_s: float | None = Field(
        None,
        description="the TTFT offset's 99th percentile over requests (as a run's p99 is taken): what the client adds to a p99 TTFT "
        "(null: measured before it was)",
    )
    tpot_p99_s: float | None = Field(
        None,
        description="the TPOT offset's 99th percentile over requests (as a run's p99 is taken): what the client adds to a p99 TPOT "
        "(null: measured before it was)",
    )
    throughput_error: float = Field(description="measured / true output tok/s, less 1")
    cycle_s: float | None = Field(
        None,
        description="a closed-loop user's time per request less the true one: the end-to-end offset and "
        "the gap from one answer's end to the user's next request (null: measured before it was)",
    )
    wait_s: float | None = Field(
        None,
        description="the reference server's time to the first token at this level, seconds (null: 0.05, "
        "measured before it was recorded)",
    )

    @property
    def waited_s(self) -> float:
        """wait_s, or the 0.05 s every level waited before it was recorded."""
        return 0.05 if self.wait_s is None else self.wait_s


class Calibration(StrictRecord):
    """The load generator's own offsets on the host that measured, against a server of known
    speed (speedsplit/serving/reference.py; `speedsplit calibrate`): the time it adds to what it
    measures, and the highest rate it can measure at all. Every factor's interval carries
    these offsets (speedsplit/analysis/chains.py: run_speeds)."""

    measured_at: str = Field(description="when (UTC, ISO 8601)")
    host_cpu: str
    reference: str = Field(description="the reference server's settings, its flags")
    levels: list[CalibrationLevel]
    ttft_s: float = Field(description="the offset carried: the largest level's TTFT offset (0 if negative)")
    itl_s: float = Field(description="the largest level's ITL offset (0 if negative)")
    tpot_s: float = Field(description="the largest level's TPOT offset (0 if negative)")
    e2e_s: float = Field(description="the largest level's end-to-end offset (0 if negative)")
    cycle_s: float | None = Field(
        None, description="the largest level's closed-loop cycle offset (0 if negative; null: not measured)"
    )
    ttft_p99_s: float | None = Field(
        None,
        description="the largest level's p99 TTFT offset (0 if negative; null: not measured): the far side "
        "of a p99 TTFT factor's interval",
    )
    tpot_p99_s: float | None = Field(
        None,
        description="the largest level's p99 TPOT offset (0 if negative; null: not measured): the far side "
        "of a p99 TPOT factor's interval",
    )
    ceiling_tok_s: float | None = Field(description="output tok/s against a server that answers at once")
    ceiling_users: int = Field(description="users of the ceiling's load")

    def uncontended(self, first_token_s: float | None = None) -> dict[str, float | None]:
        """The offsets (ttft_s, itl_s, tpot_s, e2e_s, cycle_s; none below 0) of the levels with
        the fewest users: what every request carries at least, where nothing else competes for
        the client (more users at once add more: the largest level's bound the interval). A
        factor's value takes these out (analysis/chains.client_free). Where those levels waited
        different times for their first tokens, the offsets at a run's own wait (first_token_s,
        its TTFT) are read off the line between the nearest two (held at the ends): on one 2-core
        host, 1-user cells waiting 320-350 ms for a first token read it 4-10 ms late, where the
        calibration's 50 ms wait read 1.8 ms."""
        names = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "cycle_s")
        if not self.levels:
            return {k: getattr(self, k) for k in names}
        fewest = min(lv.users for lv in self.levels)
        least = sorted((lv for lv in self.levels if lv.users == fewest), key=lambda lv: lv.waited_s)
        lo = hi = least[0]
        if first_token_s is not None:
            below = [lv for lv in least if lv.waited_s <= first_token_s]
            above = [lv for lv in least if lv.waited_s >= first_token_s]
            lo, hi = (below or least[:1])[-1], (above or least[-1:])[0]
        w = 0.0 if hi.waited_s == lo.waited_s else (first_token_s - lo.waited_s) / (hi.waited_s - lo.waited_s)

        def at(k: str) -> float | None:
            a, b = getattr(lo, k), getattr(hi, k)
            if a is None or b is None:
                return None
            return max(0.0, a + w * (b - a))

        return {k: at(k) for k in names}

    @classmethod
    def read(cls, path: str | Path | None) -> Calibration | None:
        """A calibration file, or None where there is none to read."""
        if not path or not Path(path).is_file():
            return None
        return cls.model_validate_json(Path(path).read_text())
