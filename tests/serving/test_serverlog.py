"""serving/serverlog.py read against servers' own logs: the committed session logs of the GPU
evidence runs (vLLM 0.26, transformers serve), one launch at a time, and what they say
about the engine, its start-up and its failures."""

import gzip
import itertools

import pytest
from conftest import REPO

from speedsplit.serving import serverlog

EVIDENCE = REPO / "docs/evidence"
# The H100 KV-offload session: two launches in one log, the first compiling its graphs (cold),
# the second reading them back (warm).
OFFLOAD = EVIDENCE / "h100-2026-12-06-sessions/logs/sessions/llama-3.1-8b__vllm-fp16-offload__tp1__all.server0.log"
DRAFT = EVIDENCE / "h200-2026-12-07-speculative/logs/sessions/small__vllm-fp16-draft__tp1__all.server0.log"
# The H100 LMCache session (gzipped: LMCache logs every request), whose CUDA extension did not load
LMCACHE = EVIDENCE / "h100-2026-12-07-lmcache/logs/sessions/llama-3.1-8b__vllm-fp16-lmcache__tp1__all.server0.log.gz"
ENGINE_DEAD = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


def _second_launch_offset(path) -> int:
    """Where the log's second '[speedsplit] launching' line starts (a byte offset)."""
    data = path.read_bytes()
    first = data.index(b"[speedsplit] launching")
    return data.index(b"\n[speedsplit] launching", first) + 1


def test_a_launch_output_is_the_log_from_its_offset_and_its_facts_are_that_launchs_own():
    offset = _second_launch_offset(OFFLOAD)
    second = serverlog.launch_output(OFFLOAD, offset)
    assert second.startswith("[speedsplit] launching: ") and second.count("[speedsplit] launching") == 1
    whole = serverlog.launch_output(OFFLOAD, 0)
    assert whole == OFFLOAD.read_bytes().decode() and whole.endswith(second) and len(whole) > len(second)

    first = serverlog.engine_facts(OFFLOAD.read_bytes()[:offset].decode())
    again = serverlog.engine_facts(second)
    # the same hand-sized cache both times (--kv-cache-memory-bytes 4 GiB: no fit estimate)
    for f in (first, again):
        assert (f["kv_cache_gib"], f["kv_cache_tokens"], f["max_concurrency"], f["kv_cache_fit_gib"]) == (
            4.0, 32768, 8.0, None,
        )  # fmt: skip
        assert (f["weight_memory_gib"], f["attention_backend"], f["dtype"]) == (15.0, "FLASH_ATTN", "torch.float16")
    assert (first["compile_cache"], first["compile_s"], first["load_s"], first["engine_init_s"]) == (
        "cold", 17.98, 3.588434, 55.11,
    )  # fmt: skip
    assert (again["compile_cache"], again["compile_s"], again["load_s"], again["engine_init_s"]) == (
        "warm", 3.54, 3.26877, 17.57,
    )  # fmt: skip
    assert (first["config_s"], first["spawn_s"], first["warmup_s"]) == (0.0, 10.0, 19.0)
    assert (again["config_s"], again["spawn_s"], again["warmup_s"]) == (0.0, 9.0, 1.0)


def test_a_log_that_cannot_be_read_gives_an_empty_launch_output(tmp_path):
    assert serverlog.launch_output(tmp_path / "never-written.log", 0) == ""
    assert serverlog.launch_output(tmp_path, 0) == ""  # a folder, not a log


def test_a_launch_output_survives_bytes_that_are_not_utf8_and_an_offset_past_the_end(tmp_path):
    log = tmp_path / "s.log"
    log.write_bytes(b"old launch\nnew \xff launch\n")
    assert serverlog.launch_output(log, len(b"old launch\n")) == "new \ufffd launch\n"
    assert serverlog.launch_output(log, 10_000) == ""


def test_the_cause_of_a_dead_vllm_engine_is_its_exception_without_the_prefix_or_the_traceback():
    """The H200 chain's vLLM log ends in a traceback whose lines carry vLLM's process and level
    prefix; earlier, a WARNING quotes `OSError: [Errno 24]` (a ulimit hint): not the failure."""
    log = EVIDENCE / "h200-2026-11-30-chain/logs/sessions/llama-3.1-8b__vllm-fp16__tp1__all.server0.log"
    text = log.read_text()
    assert "WARNING 11-30 04:51:37 [system_utils.py:299] Found ulimit" in text and "OSError: [Errno 24]" in text
    assert serverlog.log_cause(text) == ENGINE_DEAD


def test_a_cause_repeated_by_a_second_launch_is_named_once():
    log = EVIDENCE / "h200-2026-12-01-startup/logs/sessions/llama-3.1-8b__vllm-fp16__tp1__all.server0.log"
    text = log.read_text()
    assert text.count("EngineDeadError: EngineCore encountered an issue") == 2  # one per launch
    assert serverlog.log_cause(text) == ENGINE_DEAD


def test_the_last_distinct_causes_are_named_oldest_first_and_a_repeat_counts_as_its_latest():
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    text = "\n".join(
        [
            "error: invalid argument: --no-such-flag",
            f"(EngineCore pid=7) ERROR 12-01 06:37:04 [core.py:1] {oom}",
            "api_server.py: error: unrecognized arguments: --no-such-flag",
            "Killed",
            f"(EngineCore pid=7) ERROR 12-01 06:37:09 [core.py:1] {oom}",  # the same failure, later
            "(APIServer pid=6) INFO 12-01 06:37:10 [launcher.py:100] [shutdown] API server: shutdown triggered",
        ]
    )
    assert serverlog.log_cause(text) == f"api_server.py: error: unrecognized arguments: --no-such-flag | Killed | {oom}"
    assert serverlog.log_cause(text, lines=1) == oom
    assert serverlog.log_cause(text, lines=5).split(" | ")[0] == "error: invalid argument: --no-such-flag"


def test_a_server_end_is_said_in_words():
    assert serverlog.exit_cause(None) == "still running"
    assert serverlog.exit_cause(0) == "exited with code 0"
    assert serverlog.exit_cause(1) == "exited with code 1"
    assert serverlog.exit_cause(-9) == (
        "killed by SIGKILL (signal 9) (sent by the kernel's out-of-memory killer, or kill -9)"
    )
    assert serverlog.exit_cause(-15) == "killed by SIGTERM (signal 15)"
    assert serverlog.exit_cause(-200) == "killed by signal 200 (signal 200)"  # no name for it


def test_a_speculative_engine_with_a_draft_model_reports_its_cache_and_start_up():
    """The H200 draft-model session: weights of target and drafter together, a cold compile."""
    f = serverlog.engine_facts(DRAFT.read_text())
    assert (f["weight_memory_gib"], f["attention_backend"], f["linear_kernel"]) == (0.68, "FLASH_ATTN", None)
    assert (f["kv_cache_gib"], f["kv_cache_tokens"], f["kv_cache_fit_gib"], f["max_concurrency"]) == (
        126.35, 5299440, 126.23, 2587.62,
    )  # fmt: skip
    assert (f["graphs_s"], f["engine_init_s"], f["compile_cache"]) == (4.0, 46.31, "cold")
    # the log's clock: 05:40:30 resolved, 05:40:43 the engine; graphs and init both at 05:41:32
    assert (f["config_s"], f["spawn_s"], f["warmup_s"]) == (0.0, 13.0, 0.0)
    # vLLM's V1 model runner: "Model loading took 0.68 GiB memory and 0.551843 seconds"
    assert f["load_s"] == 0.551843
    # the model's torch.compile (18.34 s) and the drafter's (8.28 s): vLLM's "compilation: 26.63 s"
    assert f["compile_s"] == 26.62


def test_a_start_up_phase_is_read_off_the_log_clock_and_one_whose_clock_runs_back_is_not_measured():
    resolved = "(APIServer pid=6419) INFO 12-07 05:40:30 [model.py:623] Resolved architecture: LlamaForCausalLM"
    engine = (
        "(EngineCore pid=6450) INFO 12-07 05:40:43 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config"
    )
    assert serverlog.engine_facts(f"{resolved}\n{engine}")["spawn_s"] == 13.0
    assert serverlog.engine_facts(resolved)["spawn_s"] is None  # no end: nothing to measure
    # the clock has no year: across New Year the end reads earlier than the start
    new_year = (
        f"{resolved.replace('12-07 05:40:30', '12-31 23:59:58')}\n{engine.replace('12-07 05:40:43', '01-01 00:00:11')}"
    )
    assert serverlog.engine_facts(new_year)["spawn_s"] is None
    # across a month's end, and a leap day
    for start, end in (("11-30 23:59:58", "12-01 00:00:11"), ("02-28 23:59:58", "02-29 00:00:11")):
        spans = f"{resolved.replace('12-07 05:40:30', start)}\n{engine.replace('12-07 05:40:43', end)}"
        assert serverlog.engine_facts(spans)["spawn_s"] == 13.0


def test_a_python_traceback_is_named_by_its_exception_not_by_a_line_of_its_code():
    """transformers serve on one H200 whose hub cache folder was missing: uvicorn's line, then the
    traceback's last line (an exception class named neither ...Error nor ...Exception); the
    traceback's code (`send_no_error`) names nothing."""
    log = (EVIDENCE / "h200-2026-12-04-bundle/logs/sessions/llama-3.1-8b__hf-fp16__tp1__all.server0.log").read_text()
    assert serverlog.log_cause(log) == (
        "ERROR:    Exception in ASGI application | huggingface_hub.errors.CacheNotFound: Cache directory not found: "
        "/root/.cache/huggingface/hub. Please use `cache_dir` argument or set `HF_HUB_CACHE` environment variable."
    )


def test_transformers_serve_reports_only_its_cache_in_gib():
    """transformers' continuous batching logs 'Memory available for cache allocation: 7856 MB'
    (the H200 capacity run); none of vLLM's facts is read into its log."""
    log = EVIDENCE / "h200-2026-11-30-capacity/logs/sessions/llama-3.1-8b__hf-fp16__tp1__all.server0.log"
    f = serverlog.engine_facts(log.read_text())
    assert {k: v for k, v in f.items() if v is not None} == {"kv_cache_gib": 7.672}


@pytest.mark.parametrize(
    ("run", "stack", "kernel", "quantization", "weight_gib", "expect_kernel"),
    [
        ("h100-2026-12-06-why", "vllm-marlin", "MarlinLinearKernel", "auto_gptq", 5.36, "Marlin"),
        ("h100-2026-12-06-why", "vllm-gptq-auto", "MacheteLinearKernel", "auto_gptq", 5.39, "Machete"),
        ("h100-2026-12-06-why", "vllm-fp8", "CutlassFP8ScaledMMLinearKernel", "fp8", 8.54, "ScaledMM"),
        ("h200x2-2026-11-30-references", "vllm-gptq-exllama", "ExllamaLinearKernel", "auto_gptq", 5.39, "Exllama"),
        (
            "h200x2-2026-11-30-references",
            "vllm-gptq-triton",
            "TritonW4A16LinearKernel",
            "auto_gptq",
            5.4,
            "TritonW4A16",
        ),
    ],
)
def test_the_linear_kernel_vllm_chose_is_read_and_checked_against_the_stacks_expectation(
    run, stack, kernel, quantization, weight_gib, expect_kernel
):
    """vLLM names it 'Using X for ...' (GPTQ) or 'Selected X for ...' (FP8)."""
    log = EVIDENCE / run / f"logs/sessions/llama-3.1-8b__{stack}__tp1__all.server0.log"
    f = serverlog.engine_facts(log.read_text())
    assert (f["linear_kernel"], f["quantization"], f["weight_memory_gib"]) == (kernel, quantization, weight_gib)
    assert serverlog.kernel_matches(expect_kernel, f["linear_kernel"]) is True
    assert serverlog.kernel_matches("Marlin", f["linear_kernel"]) is (kernel == "MarlinLinearKernel")


def test_a_plugin_that_runs_without_its_compiled_extension_is_said_so():
    """LMCache 0.5.6 on torch 2.11 (the H100 run): its cuda_ops did not load and it said it stays
    on the torch baseline; the engine's facts name the missing extension. vLLM alone says nothing so."""
    with gzip.open(LMCACHE, "rt") as f:  # its start-up: until the server was ready
        start = "".join(itertools.takewhile(lambda line: "Application startup complete" not in line, f))
    f = serverlog.engine_facts(start)
    assert f["missing_extension"] == "lmcache.cuda_ops"
    assert (f["attention_backend"], f["kv_cache_gib"]) == ("FLASH_ATTN", 4.0)
    assert serverlog.engine_facts(OFFLOAD.read_text())["missing_extension"] is None
