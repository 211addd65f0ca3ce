"""Stock generate() as a server: static batches never exceed the ceiling, every request gets
exactly its tokens, streamed one by one, and the workflow's load generator reads it as any
other stack."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO
from speedsplit import loadgen

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """The server with a batch ceiling of 2, as a process of its own."""
    port = _free_port()
    log = tmp_path_factory.mktemp("hfgen") / "server.log"
    argv = [sys.executable, "-m", "speedsplit.hf_generate", "--model", str(tiny_model), "--served-model-name", "tiny"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--max-batch", "2"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def stats(url) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
        return json.loads(resp.read())


def spec(url, tiny_model, **kw):
    from speedsplit.bench import build_prompts

    base = dict(users=5, prompt_tokens=8, output_tokens=6, requests_per_user=1, warmup_requests=0)
    base.update(kw)
    prompts = build_prompts(tiny_model, base["users"] * 2, base["prompt_tokens"], seed=3)
    return loadgen.LoadSpec(urls=[url], model="tiny", prompts=prompts, **base)


def test_every_request_gets_exactly_its_tokens_streamed(server, tiny_model):
    summary, records = loadgen.run(spec(server, tiny_model))
    assert summary.completed == 5 and summary.failed == 0
    assert summary.wrong_output_length == 0 and summary.wrong_prompt_length == 0
    for r in records:
        assert r.output_tokens == 6 and r.chunks == 6 and len(r.gaps) == 5  # one chunk per token


def test_batches_never_exceed_the_ceiling(server, tiny_model):
    before = stats(server)
    summary, _ = loadgen.run(spec(server, tiny_model, users=5, output_tokens=4))
    after = stats(server)
    assert summary.completed == 5
    assert after["largest_batch"] == 2  # 5 waiting users, a ceiling of 2
    assert after["batches"] - before["batches"] >= 3


def test_a_request_for_another_model_is_refused(server):
    body = json.dumps({"model": "other", "prompt": "a b", "max_tokens": 2, "stream": True}).encode()
    req = urllib.request.Request(server + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400 and "unknown model 'other'" in err.value.read().decode()


def test_the_workflow_measures_it_as_any_stack(tiny_model, tmp_path):
    """Started, held and stopped by the session machinery, read by the load generator."""
    from speedsplit import bench, procs, session
    from speedsplit import config as C
    from speedsplit.plan import BenchJob, SessionPlan

    cfg = C.load(REPO / "config/config.yaml")
    stack = C.stack_params(cfg, "tiny", "hf-generate", "tp1")
    cell = C.cell_params(cfg, C.cells(cfg)[0])
    cell.update(users=3, requests_per_user=2, output_tokens=8, min_measured_s=0.0)
    plan = SessionPlan(
        key="hfgen/tiny/tp1/run0",
        log=str(tmp_path / "session.log"),
        cache_dir=str(tmp_path / "cache"),
        last_job=BenchJob("tiny", "hf-generate", "tp1", cell["cell"], 0).result,
        idle_timeout_s=120.0,
        lease_timeout_s=600.0,
    )
    res = bench.measure(
        stack=stack,
        cell=cell,
        run=0,
        session=plan,
        model_dir=tiny_model,
        tokenizer_dir=tiny_model,
        out_json=tmp_path / "r.json",
        out_requests=tmp_path / "r.requests.jsonl",
        owner=procs.me(),
    )
    assert res.status == "ok", res.server
    assert res.summary.completed == 6 and res.summary.wrong_output_length == 0 and res.flags == []
    st = session.Session(plan.key).state()
    assert st["state"] == "stopped" and not any(procs.Proc.from_record(r).alive() for r in st["servers"])
