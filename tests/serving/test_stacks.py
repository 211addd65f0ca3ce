import os
import time

import pytest
from records import stack_spec

from speedsplit.core import procs
from speedsplit.serving import serverlog, stacks
from speedsplit.serving.caches import MODELINFOS_ENV, cache_args, compile_cache

VLLM_GPU_LOG = """
(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.26.0) with config: model='m', dtype=torch.float16, quantization=gptq_marlin, enforce_eager=False
(EngineCore pid=1) INFO [gptq_marlin.py:300] Using MarlinLinearKernel for GPTQMarlinLinearMethod
(EngineCore pid=1) INFO [cuda.py:400] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN']
(EngineCore pid=1) INFO [gpu_model_runner.py:5150] Model loading took 5.31 GiB memory and 12.1 seconds
(Worker pid=2) INFO [gpu_worker.py:760] Available KV cache memory: 118.45 GiB
(EngineCore pid=1) INFO [kv_cache_utils.py:1000] GPU KV cache size: 1,034,880 tokens
(EngineCore pid=1) INFO [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) on startup. Desired GPU memory utilization is (0.1709, 23.89 GiB). Actual usage is 15.0 GiB for weight, 1.1 GiB for peak activation, 0.22 GiB for non-torch memory, and 0.98 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=6906680947` (6.43 GiB) to fit into requested memory, or `--kv-cache-memory=130810379776` (121.83 GiB) to fully utilize gpu memory. Current kv cache memory in use is 7.56 GiB.
(EngineCore pid=1) INFO [kv_cache_utils.py:1001] Maximum concurrency for 2,048 tokens per request: 505.31x
"""


def test_engine_facts_from_a_vllm_log():
    f = serverlog.engine_facts(VLLM_GPU_LOG)
    assert f["linear_kernel"] == "MarlinLinearKernel"
    assert f["attention_backend"] == "FLASH_ATTN"
    assert f["weight_memory_gib"] == pytest.approx(5.31)
    assert f["kv_cache_tokens"] == 1034880 and f["kv_cache_gib"] == pytest.approx(118.45)
    assert f["kv_cache_fit_gib"] == pytest.approx(6.43)  # what fits the memory share, CUDA graphs counted
    assert f["max_concurrency"] == pytest.approx(505.31)
    assert f["quantization"] == "gptq_marlin" and f["dtype"] == "torch.float16"
    assert serverlog.kernel_matches("Marlin", f["linear_kernel"]) is True
    assert serverlog.kernel_matches("Machete", f["linear_kernel"]) is False
    assert serverlog.kernel_matches("", f["linear_kernel"]) is None
    assert serverlog.kernel_matches("Marlin", None) is False
    assert serverlog.engine_facts("nothing here")["linear_kernel"] is None


def test_the_kv_cache_of_transformers_continuous_batching_is_read_in_gib():
    line = "2026-11-30 - ContinuousBatchingLogger - INFO - Memory available for cache allocation: 6144 MB"
    assert serverlog.engine_facts(line)["kv_cache_gib"] == 6.0


def _stack(args):
    return stack_spec(args=args)


def test_stop_takes_down_the_whole_process_tree(tmp_path, tiny_model):
    # a "server" that leaves children behind, as vLLM's engine core would, one of them in a
    # session of its own
    script = (
        "import subprocess,time; subprocess.Popen(['sleep','300']); "
        "subprocess.Popen(['setsid','sleep','301']); time.sleep(300)"
    )
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], tmp_path / "s.log")
    deadline = time.monotonic() + 10
    while len(procs.tree(srv.proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = procs.tree(srv.proc.pid)
    assert len(tree) == 3
    assert os.getpgid(srv.proc.pid) == srv.proc.pid  # its own group, not ours
    # but our session: the autogroup scheduler shares the CPUs between sessions, and a session
    # of spinning server threads starved the client's for seconds (core/procs.die_with_parent)
    assert os.getsid(srv.proc.pid) == os.getsid(0)
    srv.stop(grace_s=5)
    assert not [p for p in tree if p.alive()]


def test_leaving_with_stops_the_server_whatever_ended_the_block(tmp_path, tiny_model):
    script = "import subprocess,time; subprocess.Popen(['sleep','300']); time.sleep(300)"
    stack = _stack(["{python}", "-c", script, "{host}"])
    with pytest.raises(RuntimeError, match="the cell failed"):
        with stacks.launch(stack, tiny_model, "m", 1, [], tmp_path / "s.log") as srv:
            deadline = time.monotonic() + 10
            while len(procs.tree(srv.proc.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            tree = procs.tree(srv.proc.pid)
            assert len(tree) == 2
            raise RuntimeError("the cell failed")
    assert srv.proc.returncode is not None and not [p for p in tree if p.alive()]


def test_a_command_that_never_binds_loopback_is_refused(tmp_path, tiny_model):
    with pytest.raises(ValueError, match="never passes {host}"):
        stacks.launch(_stack(["{python}", "-m", "http.server", "{port}"]), tiny_model, "m", 1, [], tmp_path / "s.log")


def test_engine_facts_come_from_this_launch_only(tmp_path, tiny_model):
    """The log is appended across launches; an earlier launch's kernel must not be reported."""
    log = tmp_path / "s.log"
    for kernel in ("MarlinLinearKernel", "MacheteLinearKernel"):
        script = f"print('Using {kernel} for GPTQMarlinLinearMethod', flush=True)"
        srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], log)
        srv.proc.wait(10)
        srv.log_copied()
    printed = [ln for ln in log.read_text().splitlines() if ln.startswith("Using ")]
    assert printed == [
        "Using MarlinLinearKernel for GPTQMarlinLinearMethod",
        "Using MacheteLinearKernel for GPTQMarlinLinearMethod",
    ]
    assert serverlog.engine_facts(srv.launch_output())["linear_kernel"] == "MacheteLinearKernel"


def test_a_server_that_exits_is_a_startup_failure_with_its_log(tmp_path, tiny_model):
    srv = stacks.launch(
        _stack(["{python}", "-c", "import sys; print('boom: no such model'); sys.exit(3)", "{host}"]),
        tiny_model,
        "m",
        1,
        [],
        tmp_path / "s.log",
    )
    with pytest.raises(stacks.StartupFailed) as err:
        srv.ready("/health", 30)
    assert "exited with code 3" in str(err.value)
    assert "boom: no such model" in err.value.log_tail


def test_a_server_that_never_gets_ready_times_out(tmp_path, tiny_model):
    srv = stacks.launch(
        _stack(["{python}", "-c", "import time; time.sleep(60)", "{host}"]), tiny_model, "m", 1, [], tmp_path / "s.log"
    )
    t0 = time.monotonic()
    with pytest.raises(stacks.StartupFailed, match="not ready within 2 s"):
        srv.ready("/health", 2)
    assert time.monotonic() - t0 < 10
    srv.stop()
    assert not srv.alive()


SERVE = """
import http.server, socket, sys
host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "side":  # an internal socket on every interface, as vLLM's TCPStore on a GPU
    side = socket.socket(socket.AF_INET6)
    side.bind(("::", 0))
    side.listen()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{{}}")  # braces doubled: stack args are format strings
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0" if mode == "wide" else host, port), H).serve_forever()
"""


@pytest.mark.parametrize("mode", ["side", "wide"])
def test_the_served_port_must_be_loopback_only_and_other_listeners_are_recorded(tmp_path, tiny_model, mode):
    from speedsplit.serving import lease

    with lease.Lease() as held:
        port = held.port()
        srv = stacks.launch(
            _stack(["{python}", "-c", SERVE, "{host}", "{port}", mode]), tiny_model, "m", port, [], tmp_path / "s.log"
        )
        try:
            if mode == "wide":
                with pytest.raises(stacks.StartupFailed, match=f"beyond loopback on its port {port}"):
                    srv.ready("/health", 30)
            else:
                srv.ready("/health", 30)
                assert len(srv.wide_listeners) == 1 and srv.wide_listeners[0].startswith("::")
        finally:
            srv.stop()


def test_a_pinned_server_and_its_children_run_on_their_cores_only(tmp_path, tiny_model):
    """Two lanes' servers must not share cores: the launch pins the server, and what it starts
    (vLLM's engine core, compile workers) inherits the pinning."""
    mine = sorted(os.sched_getaffinity(0))
    script = (
        "import os,subprocess,sys; print('server', sorted(os.sched_getaffinity(0)), flush=True); "
        "subprocess.run([sys.executable, '-c', 'import os; print(\"child\", sorted(os.sched_getaffinity(0)))'])"
    )
    log = tmp_path / "s.log"
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], log, cpus=mine[-1:])
    srv.proc.wait(timeout=30)
    text = log.read_text()
    assert f"server [{mine[-1]}]" in text and f"child [{mine[-1]}]" in text
    unpinned = tmp_path / "u.log"
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], unpinned)
    srv.proc.wait(timeout=30)
    assert f"server {mine}" in unpinned.read_text()


def test_cards_are_numbered_as_nvml_numbers_them(tmp_path, tiny_model, monkeypatch):
    """CUDA counts cards fastest first unless CUDA_DEVICE_ORDER says otherwise; NVML (telemetry,
    the memory cap) and nvidia-smi (the lease) count by PCI bus: every server gets PCI_BUS_ID,
    whatever the caller's environment says."""
    from speedsplit.measuring import link

    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    script = "import os; print('order=' + os.environ.get('CUDA_DEVICE_ORDER', ''), flush=True)"
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, ["1"], tmp_path / "s.log")
    srv.proc.wait(10)
    assert "order=PCI_BUS_ID" in srv.launch_output()
    assert link.BASE_ENV["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_no_launched_server_reports_usage_to_its_authors(tmp_path, tiny_model, monkeypatch):
    """vLLM sends usage stats from any host with network unless told not to: every launched
    server gets them off, whatever the caller's environment says."""
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "0")
    script = "import os; print('stats=' + os.environ.get('VLLM_NO_USAGE_STATS', '-'), flush=True)"
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], tmp_path / "s.log")
    srv.proc.wait(10)
    assert "stats=1" in srv.launch_output()


def test_a_killed_server_says_which_signal_and_what_its_log_names(tmp_path, tiny_model):
    """The OOM killer's SIGKILL, an exit code, and the exception the log ends with: the words a
    result's cause is made of."""
    script = (
        "import os, signal, sys; print('Traceback (most recent call last):'); "
        "print(\"(Worker pid=7) ERROR 12-01 06:37:04 [x.py:1] AttributeError: '_C' object has no attribute 'op'\"); "
        "sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], tmp_path / "s.log")
    with pytest.raises(stacks.StartupFailed) as err:
        srv.ready("/health", 30)
    assert "killed by SIGKILL (signal 9)" in str(err.value) and "out-of-memory" in str(err.value)
    assert "AttributeError: '_C' object has no attribute 'op'" in str(err.value)
    assert (
        serverlog.exit_cause(3) == "exited with code 3" and serverlog.exit_cause(-15) == "killed by SIGTERM (signal 15)"
    )
    assert serverlog.log_cause("INFO all good\nWARNING slow\n") == ""


def test_a_server_that_refuses_its_command_line_names_the_refusal(tmp_path, tiny_model):
    """A flag the server does not know: argparse's own line is the cause, not only the exit code."""
    stack = _stack(["{python}", "-m", "speedsplit.serving.reference", "--host", "{host}", "--no-such-flag-xyz"])
    srv = stacks.launch(stack, tiny_model, "m", 1, [], tmp_path / "s.log")
    with pytest.raises(stacks.StartupFailed) as err:
        srv.ready("/health", 30)
    assert str(err.value).startswith("server exited with code 2 before it was ready: ")
    assert "error: unrecognized arguments: --no-such-flag-xyz" in str(err.value)


@pytest.mark.slow
def test_the_continuous_batching_stack_serves_a_50k_vocabulary_on_a_cpu(tmp_path):
    """transformers' continuous batching reserves logit rows for 1024 requests (206 MB at
    GPT-2's 50,257 tokens) before sizing its cache: the host cap leaves room for them (it once
    did not: every first request failed, 'num_sectors = -25')."""
    from conftest import REPO, measure_alone

    from speedsplit.models.checkpoint import synthesize
    from speedsplit.planning import config as C

    from speedsplit.planning import grid as G

    model = tmp_path / "gpt2-vocab"
    synthesize("tiny", model, tokenizer="gpt2")
    cfg = C.validate(
        C.merge(
            C.read_yaml(REPO / "config/config.yaml"), {"models": {"tiny": {"tokenizer": "gpt2", "weights": "random"}}}
        )
    )
    stack = G.stack_params(cfg, "tiny", "hf-fp16", "tp1")
    assert stack["host_cache_cap"]
    cell = G.cell_params(cfg, G.cell_by_name(cfg, "u2-wide-greedy"))
    cell.update(min_measured_s=0.0)
    res, _ = measure_alone(stack, cell, model, tmp_path / "run", startup_timeout_s=300.0)
    assert res.status == "ok", res.error
    assert res.summary.completed == 2 * 8 and res.summary.wrong_output_length == 0


def test_a_vllm_start_up_is_split_into_weights_compile_graphs_and_engine_from_its_log():
    """Read from a real H200 engine log (committed evidence): where its 118 s went, and that
    its compile cache was cold; a launch that read its graphs back says warm."""
    from conftest import REPO

    from speedsplit.core.record import EngineFacts

    log = REPO / "docs/evidence/h200-2026-12-01-traffic/logs/sessions/llama-3.1-8b__vllm-fp16__tp1__all.server0.log"
    f = serverlog.engine_facts(log.read_text())
    assert (f["load_s"], f["compile_s"], f["graphs_s"], f["engine_init_s"]) == (4.757898, 20.35, 8.0, 47.40)
    assert f["compile_cache"] == "cold" and EngineFacts(**f).compile_cache == "cold"
    # off the log's clock: the model inspection, the engine process's start, the warm-up
    assert (f["config_s"], f["spawn_s"], f["warmup_s"]) == (23.0, 19.0, 16.0)
    warm = "INFO [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.2 s"
    assert serverlog.engine_facts(warm)["compile_cache"] == "warm"
    assert serverlog.engine_facts("nothing here")["compile_cache"] is None


def test_a_kv_cache_sized_by_hand_is_read_from_the_line_vllm_prints_for_it():
    """With --kv-cache-memory-bytes vLLM skips its profile and prints what it reserved
    (the capped H200 run's own log) instead of 'Available KV cache memory'."""
    from conftest import REPO

    log = (
        REPO
        / "docs/evidence/h200-2026-12-01-traffic-capped/logs/sessions/llama-3.1-8b__vllm-fp16__tp1__all.server0.log"
    )
    f = serverlog.engine_facts(log.read_text())
    assert (f["kv_cache_gib"], f["kv_cache_tokens"], f["kv_cache_fit_gib"]) == (4.6, 37680, None)


def test_sessions_that_build_the_same_thing_share_one_compile_cache_one_at_a_time(tmp_path):
    """One folder per model identity, stack definition, topology and engine versions: a later
    session reads back what an earlier one compiled; while one holds it, another takes its
    private folder (never two writers); another argument is another folder."""
    stack = stack_spec(args=["{python}", "-m", "vllm.entrypoints.openai.api_server"], platform="cuda")
    model = {"path": "/m", "digest": "abc"}
    shared, private = tmp_path / "shared", tmp_path / "session-a"
    first = compile_cache(shared, private, stack, model)
    assert first.dir.parent == shared and first.how == f"shared {first.dir.name}"
    busy = compile_cache(shared, tmp_path / "session-b", stack, model)
    assert busy.dir == tmp_path / "session-b" and busy.how.startswith("private: another session")
    first.release()
    again = compile_cache(shared, tmp_path / "session-c", stack, model)
    assert again.dir == first.dir  # read back what the first one compiled
    again.release()
    longer = stack.model_copy(update={"args": stack.args + ["--max-num-seqs", "8"]})
    other = compile_cache(shared, private, longer, model)
    assert other.dir.parent == shared and other.dir != first.dir
    other.release()
    assert compile_cache(shared, private, stack, {**model, "digest": "new"}).dir != first.dir


def test_flags_that_only_size_memory_or_switch_prefix_caching_share_a_compile_cache(tmp_path, monkeypatch):
    """vLLM compiles nothing that depends on its memory share, KV cache size or prefix cache
    (and keys its own graphs on a hash of what does): such stacks share one folder; and every
    cache, private or shared, reads one engine-wide model inspection (vLLM's modelinfos)."""
    base = ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}"]
    stack = stack_spec(args=base, platform="cuda")
    model, shared = {"path": "/m"}, tmp_path / "shared"
    monkeypatch.delenv(MODELINFOS_ENV, raising=False)  # the results folder's own (the test suite sets one)
    first = compile_cache(shared, tmp_path / "a", stack, model)
    first.release()
    for extra in (
        ["--no-enable-prefix-caching"],
        ["--gpu-memory-utilization", "0.5"],
        ["--kv-cache-memory-bytes=1000", "--enable-prefix-caching"],
    ):
        again = compile_cache(shared, tmp_path / "a", stack.model_copy(update={"args": base + extra}), model)
        assert again.dir == first.dir, extra
        again.release()
    assert cache_args(base + ["--gpu-memory-utilization", "0.5", "--seed", "0"]) == base + ["--seed", "0"]
    held = compile_cache(shared, tmp_path / "a", stack, model)
    private = compile_cache(shared, tmp_path / "b", stack, model)
    assert private.dir == tmp_path / "b"
    for cache in (held, private):  # the folder a server instance's VLLM_CACHE_ROOT lies in
        link = cache.instance(0) / "vllm" / "modelinfos"
        assert link.is_symlink() and link.resolve().parent == (shared / "modelinfos").resolve()
    (held.instance(0) / "vllm" / "modelinfos" / "m.json").write_text("{}")
    assert (private.instance(1) / "vllm" / "modelinfos" / "m.json").read_text() == "{}"
    # a host-wide folder, where one is named, serves every results folder's caches
    monkeypatch.setenv(MODELINFOS_ENV, str(tmp_path / "host"))
    other = compile_cache(tmp_path / "other", tmp_path / "c", stack, model)
    assert (other.instance(0) / "vllm" / "modelinfos").resolve().parent == (tmp_path / "host").resolve()


def test_a_server_that_prints_a_secret_leaves_none_in_its_log(tmp_path, tiny_model, monkeypatch):
    """A server prints the HF_TOKEN it inherited, and a key of another service: its log holds
    neither, as it is written (not only the log tail a result keeps)."""
    token, key = "hf_PlantedSecretToken0123456789abcdef", "sk-live-0123456789abcdefABCDEF"
    monkeypatch.setenv("HF_TOKEN", token)
    script = f"import os; print('token', os.environ['HF_TOKEN'], flush=True); print('key {key}', flush=True)"
    srv = stacks.launch(_stack(["{python}", "-c", script, "{host}"]), tiny_model, "m", 1, [], tmp_path / "s.log")
    srv.proc.wait(10)
    deadline = time.monotonic() + 10
    while "key" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = (tmp_path / "s.log").read_text()
    assert "token <HF_TOKEN>" in log and "key <redacted key>" in log
    assert token not in log and key not in log


def test_a_draft_models_folder_is_named_beside_the_served_models(tmp_path, tiny_model):
    """{draft_dir}: the FP16 folder of the stack's draft model, beside the served model's
    (resources/models/{draft}/fp16, as the model rule makes it), absolute."""
    script = "import sys; print('draft=' + sys.argv[1], flush=True)"
    stack = _stack(["{python}", "-c", script, "{draft_dir}", "{host}"]).model_copy(update={"draft_model": "tiny-draft"})
    served = tmp_path / "models" / "tiny" / "fp16"
    served.mkdir(parents=True)
    for f in tiny_model.iterdir():
        (served / f.name).symlink_to(f)
    srv = stacks.launch(stack, served, "m", 1, [], tmp_path / "s.log")
    srv.proc.wait(10)
    assert f"draft={tmp_path / 'models' / 'tiny-draft' / 'fp16'}" in srv.launch_output()
