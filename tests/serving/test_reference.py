"""The server of known speed: what its rules make (expected), what it serves, its faults, and
the load generator measured against it (the workflow's runs on it: tests/workflow/test_truth.py)."""

import asyncio
import json
import statistics
import urllib.error
import urllib.request

import aiohttp
import pytest

from speedsplit.core import apikey
from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.probes import loadgen
from speedsplit.serving import reference as R
from speedsplit.serving import reference_speed as RS
from speedsplit.serving.reference_speed import Faults, Speed, expected


def test_a_closed_loop_under_a_cap_waits_its_turn():
    speed = Speed(ttft_s=0.1, itl_s=0.01, max_concurrency=2)
    got = expected(speed, users=4, requests_per_user=1, prompt_tokens=8, output_tokens=11)
    service = 0.1 + 10 * 0.01
    assert [round(e.first_token, 9) for e in got] == [0.1, 0.1, round(service + 0.1, 9), round(service + 0.1, 9)]
    assert max(e.end for e in got) == pytest.approx(2 * service)
    assert {(e.user, e.index) for e in got} == {(u, 0) for u in range(4)}
    assert all(e.tpot_s == pytest.approx(0.01) for e in got)


def test_prefill_and_open_loop_arrivals_keep_their_order():
    speed = Speed(ttft_s=0.1, itl_s=0.01, prefill_tok_s=1000)
    got = expected(speed, arrivals=[(0.5, 100, 2), (0.0, 300, 3)])
    assert [e.index for e in got] == [0, 1]  # in the order given
    assert got[0].ttft_s == pytest.approx(0.2) and got[1].ttft_s == pytest.approx(0.4)
    assert got[1].end == pytest.approx(0.4 + 2 * 0.01)


def test_a_session_sends_its_next_turn_a_think_time_after_each_answer_and_waits_for_a_slot():
    """Two sessions of two turns on one slot: the second session's first turn waits for the
    first's, and each next turn goes think_s after its session's last answer (its longer
    prompt read at the prefill rate)."""
    speed = Speed(ttft_s=0.1, itl_s=0.01, prefill_tok_s=1000, max_concurrency=1)
    got = expected(speed, sessions=[(0.0, [(100, 3), (250, 3)]), (0.05, [(100, 3), (250, 3)])], think_s=0.5)
    by = {(e.user, e.index): e for e in got}
    first = 0.1 + 0.1 + 2 * 0.01  # 0.22 s a first turn
    assert by[0, 0].end == pytest.approx(first)
    assert by[1, 0].sent == 0.05 and by[1, 0].ttft_s == pytest.approx(first - 0.05 + 0.2)  # waited for the slot
    assert by[0, 1].sent == pytest.approx(first + 0.5)  # its think time after its answer
    assert by[0, 1].ttft_s == pytest.approx(0.1 + 0.25)  # 250 prompt tokens at 1000 a second
    assert by[1, 1].sent == pytest.approx(by[1, 0].end + 0.5)


def test_its_command_line_says_its_speed_and_faults():
    speed = Speed(0.3, 0.02, 500.0, 4, tokens_per_chunk=3, no_running_count=True)
    faults = Faults(stall_every=5, stall_s=2.0, usage_factor=2.0, overclaim_every=3)
    argv = ["python", "-m", "speedsplit.serving.reference", "--port", "1", *RS.argv(speed, faults)]
    assert RS.parse_argv(argv) == (speed, faults)
    assert RS.parse_argv(["python", "-m", "vllm.entrypoints.openai.api_server"]) is None


def _stream(url: str, body: dict, path: str = "/v1/completions") -> list[dict]:
    async def go():
        async with aiohttp.ClientSession() as http:
            async with http.post(url + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
                out = []
                async for raw in resp.content:
                    line = raw.strip()
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                        out.append(json.loads(line[5:]))
                return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def quick():
    return R.serve_in_thread(R.make_app(Speed(ttft_s=0.0, itl_s=0.001), Faults(usage_factor=2.0)))


def test_it_streams_exactly_the_tokens_asked_for_and_its_usage_says_what_it_is_told(quick):
    body = {"prompt": "a b c", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    chunks = _stream(quick, body)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == [f" t{i}" for i in range(5)]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10  # the lie: 2 x 5
    assert chunks[-1]["usage"]["prompt_tokens"] == 3  # words, without a tokenizer
    body["stream_options"]["continuous_usage_stats"] = True  # the running count, as vLLM sends it
    running = [c["usage"]["completion_tokens"] for c in _stream(quick, body)[:-1]]
    assert running == [1, 2, 3, 4, 5]
    chat = _stream(
        quick,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
        "/v1/chat/completions",
    )
    assert [c["choices"][0]["delta"]["content"] for c in chat] == [" t0", " t1", " t2"]
    gen = {"prompt": "x", "stream": True, "generation_config": json.dumps({"max_new_tokens": 4})}
    assert len(_stream(quick, gen)) == 4  # the transformers dialect


def test_the_load_generator_counts_the_stream_and_flags_usage_that_disagrees(quick):
    spec = loadgen.LoadSpec(
        urls=[quick], model="m", prompts=["a b c d"] * 8, users=2, prompt_tokens=4, output_tokens=6,
        requests_per_user=2, warmup_requests=0,
    )  # fmt: skip
    s, records = loadgen.run(spec)
    assert s.completed == 4 and s.output_tokens == 4 * 6  # counted in the stream, not usage's 12 each
    assert s.usage_mismatch == 4 and s.wrong_output_length == 0
    assert all(r.usage_tokens == 12 and r.output_tokens == 6 and r.stream_count == "running" for r in records)
    # without a running count (the transformers dialect asks for none) the chunks bound the claim
    # from below only: a server that claims fewer tokens than it streamed chunks is caught
    under = R.serve_in_thread(R.make_app(Speed(ttft_s=0.0, itl_s=0.001), Faults(usage_factor=0.5)))
    spec.urls, spec.dialect = [under], "transformers"
    s, records = loadgen.run(spec)
    assert s.usage_mismatch == 4 and s.output_tokens == 4 * 6
    assert all(r.stream_count == "chunks" and r.streamed_tokens == 6 and r.usage_tokens == 3 for r in records)


def test_a_stream_counted_by_chunks_bounds_usage_from_below_only():
    """A server holds back the tokens that end inside a character and sends no chunk for them
    (transformers serve streamed 27 chunks for 48 tokens of the tiny model, llama.cpp 27 for
    32): a claim above the chunks is believed, one below them is not."""
    from speedsplit.core.requestlog import RequestRecord

    def rec(streamed, usage, how="chunks"):
        return RequestRecord(
            user=0, index=0, phase="measured", url="", sent=0.0, streamed_tokens=streamed, usage_tokens=usage,
            stream_count=how,
        )  # fmt: skip

    assert not rec(27, 48).usage_disagrees and not rec(27, 32).usage_disagrees and not rec(32, 32).usage_disagrees
    assert rec(33, 32).usage_disagrees  # fewer tokens than chunks that carried one
    assert rec(31, 32, "running").usage_disagrees  # a running count is exact


def test_a_stream_without_a_running_count_is_held_to_its_text_retokenised():
    """Chunks bound usage from below only; the text, tokenised again, says how many tokens
    there were, give or take the slack a detokenised stream needs (text_slack)."""
    from speedsplit.core.requestlog import RequestRecord, text_slack

    def rec(chunks, usage, text, how="chunks"):
        r = RequestRecord(
            user=0, index=0, phase="measured", url="", sent=0.0, streamed_tokens=chunks, usage_tokens=usage,
            stream_count=how, text_tokens=text,
        )  # fmt: skip
        r.settle()
        return r

    assert text_slack(40) == 2 and text_slack(1000) == 20
    honest = rec(10, 40, 39)  # ten chunks of four tokens: usage believed, within a token of the text
    assert not honest.usage_disagrees and honest.output_tokens == 40
    liar = rec(30, 40, 30)  # 30 streamed, 40 claimed: the text has 30
    assert liar.usage_disagrees and liar.output_tokens == 30
    assert rec(30, 26, 30).usage_disagrees  # a claim below the chunks
    # 48 chunks, a token each, whose text encodes back to 25 (a run of spaces is one token of
    # the trained tiny model's vocabulary): the chunks bear the claim out
    spaces = rec(48, 48, 25)
    assert not spaces.usage_disagrees and spaces.output_tokens == 48
    running = rec(40, 40, 37, "running")  # a running count is exact: the text is only beside it
    assert not running.usage_disagrees and running.output_tokens == 40


def _spec(url, **kw):
    base = dict(
        urls=[url], model="m", prompts=["a b c d"] * 8, users=2, prompt_tokens=4, output_tokens=16,
        requests_per_user=2, warmup_requests=0,
    )  # fmt: skip
    return loadgen.LoadSpec(**{**base, **kw})


def test_a_server_that_streams_fewer_tokens_than_it_claims_is_caught_by_its_text(tiny_model):
    """No running count (usage only in the last chunk): the chunks would believe a claim of 16
    for 12 streamed; the text, counted by the model's tokenizer, does not. Honest servers of
    the same kind are believed, token by token or four to a chunk."""
    from speedsplit.models.prompts import token_counter

    count = token_counter(tiny_model)
    liar = R.serve_in_thread(
        R.make_app(
            Speed(ttft_s=0.0, itl_s=0.001, no_running_count=True),
            Faults(overclaim_every=2, short_fraction=0.75),
            model_dir=str(tiny_model),
        )
    )
    s, records = loadgen.run(_spec(liar, count_tokens=count))
    assert s.usage_mismatch == 2 and s.wrong_output_length == 2 and s.output_tokens == 2 * 16 + 2 * 12
    lied = [r for r in records if r.usage_disagrees]
    assert all(r.usage_tokens == 16 and r.text_tokens == 12 and r.stream_count == "chunks" for r in lied)
    for tokens_per_chunk in (1, 4):
        honest = R.serve_in_thread(
            R.make_app(
                Speed(ttft_s=0.0, itl_s=0.001, tokens_per_chunk=tokens_per_chunk, no_running_count=True),
                model_dir=str(tiny_model),
            )
        )
        s, records = loadgen.run(_spec(honest, count_tokens=count))
        assert s.usage_mismatch == 0 and s.wrong_output_length == 0 and s.output_tokens == 4 * 16
        assert all(r.text_tokens == 16 for r in records)


@pytest.mark.serial
def test_coalesced_chunks_are_counted_whole_and_the_run_says_how_many_a_chunk_carried():
    """Four tokens a chunk after the first, 4 ms apart each: throughput and TPOT are the
    tokens', the ITL a chunk's (16 ms), and the summary says 16 tokens came in 5 chunks."""
    speed = Speed(ttft_s=0.05, itl_s=0.004, tokens_per_chunk=4)
    assert speed.chunk_ends(16) == [0, 4, 8, 12, 15] and speed.chunk_gaps_s(16) == pytest.approx([0.016] * 3 + [0.012])
    url = R.serve_in_thread(R.make_app(speed))
    s, records = loadgen.run(_spec(url))
    assert s.output_tokens == 4 * 16 and s.usage_mismatch == 0 and s.wrong_output_length == 0
    assert s.tokens_per_chunk == pytest.approx(16 / 5)
    assert all(len(r.gaps) == 4 and r.stream_count == "running" for r in records)
    assert s.itl_s.median == pytest.approx(0.016, abs=0.003)
    assert s.tpot_s.median == pytest.approx(0.004, abs=0.0005)
    truth = expected(speed, users=2, requests_per_user=2, output_tokens=16)
    assert truth[0].tpot_s == pytest.approx(0.004)


def test_each_fault_hits_every_nth_request():
    faults = Faults(error_every=2, short_every=3, short_fraction=0.5)
    url = R.serve_in_thread(R.make_app(Speed(ttft_s=0.0, itl_s=0.0), faults))
    spec = loadgen.LoadSpec(
        urls=[url], model="m", prompts=["a"] * 8, users=1, prompt_tokens=1, output_tokens=8,
        requests_per_user=6, warmup_requests=0,
    )  # fmt: skip
    s, records = loadgen.run(spec)
    # requests 2, 4, 6 answer 500; 3 streams half its tokens (and says so)
    assert s.failures == {"http_500": 3} and s.wrong_output_length == 1
    assert sorted(r.output_tokens for r in records if r.ok) == [4, 8, 8]
    drop = R.serve_in_thread(R.make_app(Speed(ttft_s=0.0, itl_s=0.001), Faults(drop_every=1)))
    s, _ = loadgen.run(
        loadgen.LoadSpec(
            urls=[drop],
            model="m",
            prompts=["a"],
            users=1,
            prompt_tokens=1,
            output_tokens=8,
            requests_per_user=1,
            warmup_requests=0,
        )
    )
    assert s.failures == {"connection": 1}


@pytest.mark.serial
def test_a_stall_below_the_stall_timeout_is_a_latency_outlier():
    faults = Faults(stall_every=4, stall_s=1.2)
    url = R.serve_in_thread(R.make_app(Speed(ttft_s=0.01, itl_s=0.005), faults))
    spec = loadgen.LoadSpec(
        urls=[url], model="m", prompts=["a b"] * 16, users=2, prompt_tokens=2, output_tokens=10,
        requests_per_user=4, warmup_requests=0, stall_timeout_s=5.0,
    )  # fmt: skip
    s, records = loadgen.run(spec)
    assert s.failed == 0 and s.latency_outliers == 2  # requests 4 and 8 held 1.2 s
    slow = sorted(r.end - r.sent for r in records)[-2:]
    assert all(t > 1.2 for t in slow)
    spec.outlier_factor = 1000.0  # the rule's factor is the config's (benchmark.outlier_factor)
    assert loadgen.summarize(records, s.wall_s, spec).latency_outliers == 0


@pytest.mark.serial
def test_its_metrics_show_what_it_runs_and_what_waits():
    url = R.serve_in_thread(R.make_app(Speed(ttft_s=0.3, itl_s=0.01, max_concurrency=1)))

    async def go():
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "a", "max_tokens": 2, "stream": True}
            sent = [asyncio.create_task(http.post(url + "/v1/completions", json=body)) for _ in range(3)]
            await asyncio.sleep(0.15)
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
            for t in sent:
                (await t).release()
            return text

    text = asyncio.run(go())
    assert 'vllm:num_requests_running{model_name="reference"} 1' in text
    assert 'vllm:num_requests_waiting{model_name="reference"} 2' in text


@pytest.mark.serial
def test_the_load_generator_measures_it_within_a_few_milliseconds():
    speed = Speed(ttft_s=0.05, itl_s=0.005)
    url = R.serve_in_thread(R.make_app(speed))
    spec = loadgen.LoadSpec(
        urls=[url], model="m", prompts=["a b c"] * 20, users=2, prompt_tokens=3, output_tokens=11,
        requests_per_user=3, warmup_requests=1,
    )  # fmt: skip
    s, records = loadgen.run(spec)
    measured = [r for r in records if r.phase == "measured"]
    # the client's own offset: a few milliseconds at most (speedsplit calibrate measures it)
    assert 0 <= statistics.median(r.first_token - r.sent for r in measured) - 0.05 < 0.01
    assert s.tpot_s.median == pytest.approx(0.005, rel=0.1)


@pytest.mark.serial
def test_users_who_think_between_answers_land_on_the_truth_of_their_think_time():
    """closed.think_s (core/loads.ClosedLoopSettings): each user's next measured request leaves
    think_s after its last answer ended, and the run lands on what the server's rules make of it
    (expected) within the client's few milliseconds."""
    speed, think = Speed(ttft_s=0.05, itl_s=0.005), ClosedLoopSettings(think_s=0.3)
    url = R.serve_in_thread(R.make_app(speed))
    spec = loadgen.LoadSpec(
        urls=[url], model="m", prompts=["a b c"] * 20, users=2, prompt_tokens=3, output_tokens=11,
        requests_per_user=3, warmup_requests=1, closed=think,
    )  # fmt: skip
    s, records = loadgen.run(spec)
    measured = sorted((r for r in records if r.phase == "measured"), key=lambda r: (r.user, r.index))
    turns = [b.sent - a.end for a, b in zip(measured, measured[1:]) if a.user == b.user]
    assert len(turns) == 4 and all(0.3 <= t < 0.3 + 0.05 for t in turns)
    truth = expected(speed, users=2, requests_per_user=3, prompt_tokens=3, output_tokens=11, closed=think)
    true_wall = max(e.end for e in truth) - min(e.sent for e in truth)
    assert true_wall == pytest.approx(3 * speed.service_s(3, 11) + 2 * 0.3)
    assert s.wall_s == pytest.approx(true_wall, abs=0.05)
    assert s.output_tok_s == pytest.approx(2 * 3 * 11 / true_wall, rel=0.05)


def test_with_an_api_key_it_refuses_a_request_without_it_and_the_load_generator_sends_it():
    """benchmark.api_key (core/apikey.py): /v1/ wants the key, /health and /metrics stay open
    (as in vLLM); a load with the key is served, its record never shows the key."""
    key = apikey.new()
    url = R.serve_in_thread(R.make_app(Speed(ttft_s=0.0, itl_s=0.001), api_key=key))
    body = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
    for headers in ({}, apikey.headers("sk-wrong")):
        req = urllib.request.Request(url + "/v1/completions", data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        assert refused.value.code == 401
    for path in ("/health", "/metrics"):
        with urllib.request.urlopen(url + path, timeout=5) as resp:
            assert resp.status == 200
    spec = loadgen.LoadSpec(
        urls=[url], model="m", prompts=["a b"] * 2, users=1, prompt_tokens=2, output_tokens=3,
        requests_per_user=1, warmup_requests=1,
    )  # fmt: skip
    assert loadgen.run(spec)[0].failed == 1  # without the key: refused
    spec.api_key = key
    s, records = loadgen.run(spec)
    assert s.completed == 1 and s.failed == 0
    assert key not in repr(spec) and all(key not in r.model_dump_json() for r in records)


def test_its_engine_counts_one_step_a_chunk_gap_while_any_request_decodes():
    """The engine clock: a lone request of n chunks is n steps; two that overlap share steps."""
    clock = RS.EngineClock(step_s=0.01)
    clock.begin(0.0)
    clock.end(0.09)  # 10 tokens, 10 ms apart: 10 steps
    assert clock.steps(5.0) == pytest.approx(10.0)
    clock.begin(1.0)
    clock.begin(1.05)
    assert clock.steps(1.02) == pytest.approx(10.0 + 3.0)  # under way: 2 gaps + its first step
    clock.end(1.09)
    clock.end(1.14)
    assert clock.steps(9.0) == pytest.approx(10.0 + 15.0)  # one stretch of 140 ms: 15 steps, not 20
    assert RS.engine_steps([(0.0, 0.09), (1.0, 1.09), (1.05, 1.14)], 0.01) == pytest.approx(25.0)


def test_its_metrics_count_the_steps_and_tokens_of_what_it_served():
    """/metrics as vLLM's: vllm:iteration_tokens_total's count (steps) and sum (tokens), as the
    load generator's telemetry reads them; two users at once, a speculative server's 4 tokens a
    step."""
    from speedsplit.probes import telemetry

    speed = Speed(ttft_s=0.02, itl_s=0.005, tokens_per_chunk=4)
    url = R.serve_in_thread(R.make_app(speed))
    names = {telemetry.COUNTERS["engine_steps"], telemetry.COUNTERS["engine_tokens"]}
    probe = telemetry.ServerProbe([url])
    before = probe.read()
    assert names <= set(before) and before[telemetry.COUNTERS["engine_steps"]] == 0
    _, records = loadgen.run(_spec(url, users=1, requests_per_user=2))
    after = probe.read()
    # one user: each request alone, 16 tokens in chunks of 1, 4, 4, 4, 3, the last 75 ms after the
    # first: 1 + 75 / 20 steps of its 20 ms clock
    assert after[telemetry.COUNTERS["engine_tokens"]] == 2 * 16 and all(r.ok for r in records)
    assert after[telemetry.COUNTERS["engine_steps"]] == pytest.approx(2 * (1 + 75 / 20), rel=1e-9)


def test_a_speculative_server_counts_its_drafts_and_what_it_accepted_as_vllm_does():
    """Four tokens drafted a step, a chunk's tokens but its last accepted: a 16-token answer in
    chunks of 1, 4, 4, 4, 3 is 4 drafts, 16 drafted, 3 + 3 + 3 + 2 accepted."""
    from speedsplit.probes import telemetry

    speed = Speed(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=4, spec_draft_tokens=4)
    assert speed.spec_counts(16) == (4, 16, 11) and Speed().spec_counts(16) == (0, 0, 0)
    url = R.serve_in_thread(R.make_app(speed))
    probe = telemetry.ServerProbe([url])
    _, records = loadgen.run(_spec(url, users=1, requests_per_user=2))
    got = probe.read()
    assert all(r.ok for r in records)
    assert got[telemetry.COUNTERS["spec_drafts"]] == 2 * 4 and got[telemetry.COUNTERS["spec_draft_tokens"]] == 2 * 16
    assert got[telemetry.COUNTERS["spec_accepted"]] == 2 * 11
    assert RS.argv(speed)[-2:] == ["--spec-draft-tokens", "4"]  # its command line says so, for the truth
    with pytest.raises(SystemExit, match="at least --tokens-per-chunk - 1"):
        RS.parse_argv(["speedsplit.serving.reference", "--tokens-per-chunk", "4", "--spec-draft-tokens", "2"])
