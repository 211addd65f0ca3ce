"""The quality probe (speedsplit/probes/quality.py): the held-out text and its windows, what it asks
a server, and what it records of the answers, against the reference server's known answers
(serving/reference_answers.py: answer token i is " t{i}", id i; every scored token -nll)."""

import asyncio
import contextlib
import hashlib
import json
import math
import random
import threading

import pytest
from aiohttp import web

from speedsplit.core.quality import QualityProbe
from speedsplit.models.prompts import exact_prompt, load_tokenizer
from speedsplit.probes import quality
from speedsplit.serving import reference as R
from speedsplit.serving.reference_answers import DIVERGED, Answers
from speedsplit.serving.reference_speed import Faults, Speed

# 40 words the word-level tokenizer spells as ids 10..49; windows of 8: chunks 0..4, and 3 of
# them spread evenly (a step of 5/3): chunks 0, 1 and 3, ids 10..17, 18..25 and 34..41
TEXT = " ".join(f"w{i}" for i in range(10, 50))
PROBE = QualityProbe(
    prompts=3, prompt_tokens=4, output_tokens=5, windows=2, window_tokens=8, top_logprobs=2, text="held.txt"
)
DEAD = '{"error": {"message": "EngineDeadError: the engine died", "code": 500}}'  # the reference's 500


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """A model folder of the word-level tokenizer alone ("w17" is id 17, anything else <unk>, 0):
    all the probe and the reference server read of a model."""
    from speedsplit.models.checkpoint import build_tokenizer

    out = tmp_path_factory.mktemp("words")
    build_tokenizer(1000, out)
    return out


@pytest.fixture()
def workdir(tmp_path):
    (tmp_path / "held.txt").write_text(TEXT)
    return tmp_path


@contextlib.contextmanager
def serving(app):
    """app on a free port in a thread of its own, stopped (its port closed) when the block ends."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def reference(words, answers=Answers(), faults=Faults(), middleware=None, received=None):
    app = R.make_app(Speed(0.0, 0.0), faults, "m", str(words), received, answers=answers)
    if middleware:
        app.middlewares.append(middleware)
    return app


def probe_on(app, words, workdir, probe=PROBE):
    with serving(app) as url:
        return quality.run(url, "m", "vllm", probe, words, timeout_s=10.0, workdir=workdir)


def test_the_configs_text_wins_then_the_models_own_held_out_text(words, workdir, tmp_path_factory):
    assert quality.held_out_text(PROBE, words, workdir) == (TEXT, "quality.text held.txt")
    absolute = PROBE.model_copy(update={"text": str(workdir / "held.txt")})
    assert quality.held_out_text(absolute, words, "/nonexistent") == (TEXT, f"quality.text {workdir / 'held.txt'}")
    own = tmp_path_factory.mktemp("own")
    (own / "speedsplit-heldout.txt").write_text("its own")
    assert quality.held_out_text(QualityProbe(), own) == (
        "its own",
        "the model's held-out text (speedsplit-heldout.txt)",
    )
    with pytest.raises(FileNotFoundError, match="quality.text missing.txt does not exist"):
        quality.held_out_text(PROBE.model_copy(update={"text": "missing.txt"}), words, workdir)


def test_a_text_it_can_spell_is_cut_into_windows_spread_evenly(words):
    tok = load_tokenizer(words)
    wins, note = quality.windows_of(TEXT, tok, PROBE)
    assert wins == [list(range(10, 18)), list(range(18, 26)), list(range(34, 42))] and note == ""
    # 20 tokens make 2 windows of 8: too few for max(3 prompts, 2 windows)
    with pytest.raises(ValueError, match="^the held-out text has 20 tokens: too few for 3 windows of 8$"):
        quality.windows_of(" ".join(f"w{i}" for i in range(10, 30)), tok, PROBE)


def test_a_tokenizer_that_cannot_spell_the_text_gets_seeded_windows_of_its_own_words(words):
    """Python's source is all <unk> to the word-level tokenizer: windows of its own words, from
    prompts seeded with 0, the same on every call."""
    tok = load_tokenizer(words)
    wins, note = quality.windows_of("def f(x):\n    return x + 1\n", tok, PROBE)
    rng = random.Random(0)
    assert wins == [tok.encode(exact_prompt(tok, 8, rng), add_special_tokens=False) for _ in range(3)]
    assert [len(w) for w in wins] == [8, 8, 8] and 0 not in sum(wins, []) and len({tuple(w) for w in wins}) == 3
    assert note == " (the tokenizer cannot spell it: windows of its own words, seeded, instead)"


def test_a_missing_text_is_the_records_error_and_nothing_is_asked(words, workdir):
    probe = PROBE.model_copy(update={"text": "missing.txt"})
    rec = quality.run("http://127.0.0.1:9", "m", "vllm", probe, words, workdir=workdir)  # nothing listens there
    assert (rec.status, rec.error) == ("error", "FileNotFoundError: quality.text missing.txt does not exist")
    assert rec.outputs == [] and rec.windows == [] and rec.serves == {} and rec.probe == probe


@pytest.mark.slow
def test_it_sends_each_windows_start_greedy_then_each_window_with_echo(words, workdir):
    """Three continuations of the windows' first 4 tokens, 5 tokens forced (vLLM's dialect, no
    seed: greedy), then the first two windows whole, one token asked, echo with top 2 logprobs."""
    received = []
    probe_on(reference(words, received=received), words, workdir)
    ask = {"logprobs": 2, "return_tokens_as_token_ids": True}
    stream = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    forced = {"max_tokens": 5, "min_tokens": 5, "ignore_eos": True, "temperature": 0.0, "top_p": 1.0}
    assert received[:3] == [
        {"model": "m", "prompt": " ".join(f"w{i}" for i in range(s, s + 4))} | forced | stream | ask
        for s in (10, 18, 34)
    ]
    scored = {"model": "m", "max_tokens": 1, "temperature": 0.0, "echo": True, "stream": False} | ask
    assert received[3:] == [scored | {"prompt": " ".join(f"w{i}" for i in range(s, s + 8))} for s in (10, 18)]


@pytest.mark.slow
def test_it_records_the_continuations_token_ids_and_top_logprobs_as_served(words, workdir):
    """Every prompt diverges from its third token (--diverge-every 1 --diverge-at 2): ids 0, 1,
    then DIVERGED + 2..4, each certain (logprob 0); its text is no word of the tokenizer's: <unk>."""
    rec = probe_on(reference(words, Answers(diverge_every=1, diverge_at=2)), words, workdir)
    ids = [0, 1, DIVERGED + 2, DIVERGED + 3, DIVERGED + 4]
    assert [o.prompt for o in rec.outputs] == [0, 1, 2] and all(o.error is None for o in rec.outputs)
    for o in rec.outputs:
        assert (o.text, o.ids, o.text_ids) == (" t0 t1 u2 u3 u4", ids, [0] * 5)
        assert o.top == [{str(i): 0.0} for i in ids]


@pytest.mark.slow
def test_a_window_scored_at_nll_3_has_perplexity_e_cubed(words, workdir):
    """--nll 3.0: each of a window's 7 tokens after its first at -3.0, the top two at its place
    itself, then DIVERGED + id + 1 a nat below; perplexity exp(21 / 7) = e^3."""
    rec = probe_on(reference(words, Answers(nll=3.0)), words, workdir)
    assert [w.window for w in rec.windows] == [0, 1]
    for w, start in zip(rec.windows, (10, 18)):
        assert (w.ids, w.logprobs, w.error) == (list(range(start, start + 8)), [-3.0] * 7, None)
        assert w.top == [{str(t): -3.0, str(DIVERGED + t + 1): -4.0} for t in range(start + 1, start + 8)]
        assert math.exp(-sum(w.logprobs) / len(w.logprobs)) == math.exp(3.0)


@pytest.mark.slow
def test_the_record_says_its_text_and_that_the_server_serves_all_it_asked(words, workdir):
    rec = probe_on(reference(words), words, workdir)
    assert (rec.status, rec.error, rec.probe, rec.text) == ("ok", None, PROBE, "quality.text held.txt")
    assert rec.text_sha256 == hashlib.sha256(TEXT.encode()).hexdigest()[:16]
    assert rec.serves == {"token_ids": "yes", "logprobs": "yes", "prompt_logprobs": "yes"}
    assert (len(rec.outputs), len(rec.windows), rec.tasks, rec.tasks_error) == (3, 2, [], None)
    assert 0 < rec.seconds < 10


def refusing(field, status, seen):
    """A server that refuses a request naming `field`, as one that does not know it."""

    @web.middleware
    async def refuse(request, handler):
        seen.append(body := await request.json())
        if field in body:
            return web.json_response({"error": {"message": f"unknown field {field}"}}, status=status)
        return await handler(request)

    return refuse


@pytest.mark.slow
def test_a_server_that_refuses_token_ids_is_asked_again_without_them_once(words, workdir):
    """A 400 naming return_tokens_as_token_ids: the first continuation asked again with logprobs
    alone, every later request without the field; tokens named by text are no ids, so no ids nor
    tops are kept, but the windows' logprobs (-1.0 a token) are."""
    seen = []
    rec = probe_on(reference(words, middleware=refusing("return_tokens_as_token_ids", 400, seen)), words, workdir)
    assert ["return_tokens_as_token_ids" in b for b in seen] == [True] + [False] * 5  # 1 + 3 + 2 requests
    assert all(b["logprobs"] == 2 for b in seen)
    refused = 'no: HTTP 400: {"error": {"message": "unknown field return_tokens_as_token_ids"}}'
    assert rec.serves == {"token_ids": refused, "logprobs": "no: none in the stream", "prompt_logprobs": "yes"}
    assert rec.status == "ok"
    assert [(o.text, o.ids, o.top, o.error) for o in rec.outputs] == [(" t0 t1 t2 t3 t4", None, None, None)] * 3
    assert [(w.ids, w.logprobs, w.top, w.error) for w in rec.windows] == [(None, [-1.0] * 7, None, None)] * 2


@pytest.mark.slow
def test_a_server_that_refuses_logprobs_keeps_its_continuations_and_has_no_perplexity(words, workdir):
    """A 422 to any request with logprobs: the first continuation asked three times (ids and
    logprobs, logprobs, nothing), the others once, plainly; the first window once, refused; the
    second never asked."""
    seen = []
    rec = probe_on(reference(words, middleware=refusing("logprobs", 422, seen)), words, workdir)
    asked = [(b.get("logprobs"), "return_tokens_as_token_ids" in b, b.get("echo", False)) for b in seen]
    assert asked == [(2, True, False), (2, False, False), *[(None, False, False)] * 3, (2, False, True)]
    no = 'no: HTTP 422: {"error": {"message": "unknown field logprobs"}}'
    assert rec.serves == {"token_ids": no, "logprobs": no, "prompt_logprobs": no}
    assert rec.status == "ok" and all(o.error is None and o.ids is o.top is None for o in rec.outputs)
    assert [len(o.text_ids) for o in rec.outputs] == [5, 5, 5]  # the reference's plain answers: a word a token
    assert [(w.ids, w.logprobs, w.error) for w in rec.windows] == [(None, None, "not served")] * 2


@pytest.mark.slow
def test_a_dead_engine_is_the_records_error_never_an_exception(words, workdir):
    """--dead-after-probe: HTTP 500 to every request, each continuation and window says so."""
    rec = probe_on(reference(words, faults=Faults(dead_after_probe=True)), words, workdir)
    said = f"Refused: HTTP 500: {DEAD}"
    assert (rec.status, rec.error) == ("error", said)
    assert [(o.text, o.ids, o.error) for o in rec.outputs] == [("", None, said)] * 3
    assert [(w.logprobs, w.error) for w in rec.windows] == [(None, said)] * 2
    assert (rec.serves["token_ids"], rec.serves["logprobs"]) == ("no: none in the stream",) * 2


@pytest.mark.slow
def test_a_server_that_scored_no_window_is_not_said_to_serve_prompt_logprobs(words, workdir):
    rec = probe_on(reference(words, faults=Faults(dead_after_probe=True)), words, workdir)
    assert all(w.logprobs is None for w in rec.windows)
    assert rec.serves["prompt_logprobs"] != "yes"


@web.middleware
async def unstreamed(request, handler):
    """The reference server's answer as a server that ignores `stream` gives it: one JSON body."""
    body = await request.json()
    request._read_bytes = json.dumps(body | {"stream": False}).encode()  # what the handler reads
    return await handler(request)


@pytest.mark.slow
def test_a_non_streaming_answer_is_the_continuations_error(words, workdir):
    """Asked to stream, the server answers " t0 t1 t2 t3 t4" in one JSON body: that is no
    continuation the probe read, and the record must say so, not keep an empty text."""
    rec = probe_on(reference(words, middleware=unstreamed), words, workdir)
    assert [o.text for o in rec.outputs] == ["", "", ""]
    assert rec.status == "error" and all(o.error for o in rec.outputs)
