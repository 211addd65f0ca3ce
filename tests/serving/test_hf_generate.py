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
from conftest import REPO, measure_alone

from speedsplit.probes import loadgen

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
    argv = [
        sys.executable,
        "-m",
        "speedsplit.serving.hf_generate",
        "--model",
        str(tiny_model),
        "--served-model-name",
        "tiny",
    ]
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
    from speedsplit.models.prompts import prompts_of

    base = dict(users=5, prompt_tokens=8, output_tokens=6, requests_per_user=1, warmup_requests=0)
    base.update(kw)
    prompts = prompts_of(tiny_model, [base["prompt_tokens"]] * (base["users"] * 2), seed=3)
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
    from speedsplit.planning import config as C
    from speedsplit.planning import grid as G
    from speedsplit.serving import session_state

    cfg = C.load(REPO / "config/config.yaml")
    stack = G.stack_params(cfg, "tiny", "hf-generate", "tp1")
    cell = G.cell_params(cfg, G.cells(cfg)[0])
    cell.update(users=3, requests_per_user=2, output_tokens=8, min_measured_s=0.0)
    res, plan = measure_alone(stack, cell, tiny_model, tmp_path, startup_timeout_s=300.0)
    assert res.status == "ok", res.server
    assert res.summary.completed == 6 and res.summary.wrong_output_length == 0 and res.flags == []
    st = session_state.Session(plan.key).state()
    assert st.state == "stopped" and not any(r.alive() for r in st.servers)


def post(url, body, timeout=60):
    """(HTTP status, the streamed texts, the error or usage at the end) of one request."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            texts, end = [], None
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("error") or chunk.get("usage"):
                    end = chunk.get("error") or chunk["usage"]
                elif chunk.get("choices"):
                    texts.append(chunk["choices"][0]["text"])
            return resp.status, texts, end
    except urllib.error.HTTPError as err:
        return err.code, [], json.loads(err.read())["error"]["message"]


BASE = {"model": "tiny", "prompt": "one two three", "stream": True}


@pytest.mark.parametrize(
    "body, why",
    [
        (b"[1, 2]", "the body must be a JSON object, not a list"),
        (b"{not json", "the body is not JSON"),
        ({**BASE, "max_tokens": 0}, "max_tokens must be between 1 and"),
        ({**BASE, "max_tokens": -5}, "max_tokens must be between 1 and"),
        ({**BASE, "max_tokens": 10**15}, "max_tokens must be between 1 and"),
        ({**BASE, "max_tokens": "8"}, "max_tokens must be an integer"),
        ({**BASE, "max_tokens": 4, "min_tokens": 9}, "min_tokens must be between 0 and 4"),
        ({**BASE, "seed": "abc", "temperature": 1.0}, "seed must be an integer"),
        ({**BASE, "seed": -1, "temperature": 1.0}, "seed must be between 0 and"),
        ({**BASE, "temperature": -1}, "temperature must be in"),
        ({**BASE, "top_p": 0}, "top_p must be in (0.0, 1.0]"),
        ({**BASE, "prompt": ["a", "b"]}, "prompt must be a non-empty string"),
        ({**BASE, "stream": False}, "only streaming requests are served"),
    ],
)
def test_a_bad_request_gets_400_with_its_reason_before_anything_runs(server, body, why):
    status, texts, message = post(server, body)
    assert status == 400 and why in message and texts == []


def test_max_tokens_defaults_to_16_and_a_bad_request_never_fails_a_good_one(server):
    """A request without max_tokens gets OpenAI's 16; one with a bad seed sent beside a good
    one is refused alone."""
    import concurrent.futures

    assert post(server, {**BASE, "ignore_eos": True})[2]["completion_tokens"] == 16
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        good = pool.submit(post, server, {**BASE, "max_tokens": 6, "ignore_eos": True, "temperature": 1.0, "seed": 3})
        bad = pool.submit(post, server, {**BASE, "max_tokens": 6, "temperature": 1.0, "seed": 2**70})
        assert bad.result()[0] == 400
        status, texts, usage = good.result()
    assert status == 200 and len(texts) == 6 and usage["completion_tokens"] == 6


def test_sampling_is_each_requests_own(server):
    """A greedy request batched with a sampled one stays greedy; a seed repeats its sample."""
    import concurrent.futures

    greedy = {**BASE, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    sampled = {**BASE, "max_tokens": 12, "ignore_eos": True, "temperature": 1.0, "seed": 11}
    alone = post(server, greedy)[1]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        both = [pool.submit(post, server, body) for body in (greedy, sampled)]
        batched, drawn = both[0].result()[1], both[1].result()[1]
    assert batched == alone and drawn != alone
    assert post(server, sampled)[1] == drawn and post(server, {**sampled, "seed": 12})[1] != drawn


def test_a_client_that_leaves_stops_its_generation(server):
    """The client reads one token of a request for ~1000 and disconnects: its row, and with it
    the batch, stops; decode steps stop growing and the next request is served at once."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps({**BASE, "max_tokens": 1000, "ignore_eos": True}),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(b"data:")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    time.sleep(1.0)
    before = stats(server)["steps"]
    time.sleep(1.0)
    assert stats(server)["steps"] == before, "the batch went on generating for a client that left"
    t0 = time.monotonic()
    assert post(server, {**BASE, "max_tokens": 4, "ignore_eos": True})[0] == 200
    assert time.monotonic() - t0 < 10


def test_sigterm_stops_a_running_batch_promptly(tiny_model, tmp_path):
    """SIGTERM mid-batch: the server stops at the batch's next step (its client is told), and
    exits within seconds, not after the batch's 1000 tokens."""
    import signal
    import threading

    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "speedsplit.serving.hf_generate",
        "--model",
        str(tiny_model),
        "--served-model-name",
        "tiny",
    ]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        got = {}
        client = threading.Thread(
            target=lambda: got.update(r=post(url, {**BASE, "max_tokens": 1000, "ignore_eos": True}))
        )
        client.start()
        while stats(url)["steps"] < 5:
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - t0 < 10
        client.join(30)
        status, texts, end = got["r"]
        assert status == 200 and len(texts) < 1000 and "shutting down" in str(end)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_its_logprobs_and_prompt_scores_are_the_models_own(server, tiny_model):
    """What the quality probe asks (probes/quality.py): each streamed token's logprob and top
    ones, and a prompt's scores (echo), equal the model's own log-softmax over the same tokens."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from speedsplit.core.quality import QualityProbe
    from speedsplit.probes import quality

    probe = QualityProbe(prompts=2, prompt_tokens=8, output_tokens=5, windows=2, window_tokens=12, top_logprobs=3)
    rec = quality.run(server, "tiny", "vllm", probe, tiny_model)
    assert rec.status == "ok" and rec.serves == {"token_ids": "yes", "logprobs": "yes", "prompt_logprobs": "yes"}
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.bfloat16)
    for w in rec.windows:
        with torch.inference_mode():
            lp = model(input_ids=torch.tensor([w.ids])).logits[0, :-1].float().log_softmax(-1)
        own = lp.gather(1, torch.tensor(w.ids[1:])[:, None])[:, 0].tolist()
        assert w.logprobs == pytest.approx(own, abs=1e-4)
        assert all(str(int(lp[i].argmax())) == max(top, key=top.get) for i, top in enumerate(w.top))
    for o in rec.outputs:
        assert len(o.ids) == len(o.top) == 5 and not o.error
        # greedy with EOS barred (ignore_eos): its pick is the top token other than EOS (id 2)
        best = [max(v for k, v in t.items() if k != "2") for t in o.top]
        assert all(math.isclose(b, t[str(i)], abs_tol=1e-6) for i, t, b in zip(o.ids, o.top, best))


def test_rows_batched_together_each_get_their_own_logprobs(server, tiny_model):
    """Four requests asking for logprobs sent at once (batches of up to 2, so some row is a
    batch's second): every streamed token's logprob is the model's own for that row's context,
    not another row's; a request that asks none gets none."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speedsplit.models.prompts import prompts_of
    from speedsplit.probes import quality

    prompts = prompts_of(tiny_model, [8] * 5, seed=11)
    spec = loadgen.LoadSpec(urls=[server], model="tiny", prompts=[], users=1, prompt_tokens=8, output_tokens=6)
    ask = {"logprobs": 2, "return_tokens_as_token_ids": True}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: quality.continuation(server, spec, p, ask, None, 60), prompts[:4]))
    assert stats(server)["largest_batch"] >= 2
    assert quality.continuation(server, spec, prompts[4], {}, None, 60)[1:] == (None, None)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    for prompt, (_, ids, top) in zip(prompts, answers):
        context = tok(prompt)["input_ids"]
        with torch.inference_mode():
            lp = model(input_ids=torch.tensor([context + ids])).logits[0].float().log_softmax(-1)
        for k, t in enumerate(ids):
            assert top[k][str(t)] == pytest.approx(float(lp[len(context) - 1 + k, t]), abs=0.05)
