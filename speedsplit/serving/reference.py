"""A server of known speed: the project's measurement standard (the `ref-*` stacks).

An OpenAI-compatible streaming server (`/v1/completions`, `/v1/chat/completions`, `/health`,
`/v1/models`, and `/metrics` with vLLM's running and waiting gauges) whose timing is set by
hand: a request waits for one of `--max-concurrency` slots (first come, first served; 0: no
cap), its first token is written `--ttft-s` + its prompt tokens / `--prefill-tok-s` (0: no
prefill cost) after it got its slot, and every next token `--itl-s` after the one before. Tokens are written at
absolute deadlines from the slot's start, so sleeping late never accumulates. Every request
gets exactly the tokens it asks for (`max_tokens`, or `max_new_tokens` of a transformers
`generation_config`), one token a chunk unless told otherwise, and `usage` last; `stream_options.
continuous_usage_stats` puts the running usage in every chunk, as vLLM does.

What a load generator should measure against it is `expected` (a replay of the same rules,
kept with Speed and Faults in speedsplit/serving/reference_speed.py); the faults make the cases
a measurement must catch, each on every N-th request the server receives (counted from its
start, warm-ups included):

    --error-every N       answer HTTP 500 at once
    --drop-every N        cut the connection after half the tokens
    --short-every N       stream only --short-fraction of the tokens, and say so in usage
    --stall-every N       hold --stall-s silent after half the tokens
    --overclaim-every N   stream only --short-fraction of the tokens, and claim them all in usage
    --dead-after-probe    its engine dies at a quality probe's first request: up, but HTTP 500 to
                          everything from then on, /health too (as vLLM's API server over a dead
                          engine); a probe must spoil no later cell
    --usage-factor F      report F x the streamed tokens in `usage` (every request)

How it streams is set too: `--tokens-per-chunk K` writes the first token alone and then K a chunk
(each chunk when its last token is due, as a speculative decoder or a proxy coalesces them);
`--no-running-count` sends usage in the last chunk only, even to a client that asks for the
running count (as transformers serve, TGI and many proxies do). An answer's text is made of
whole-word tokens of the model's tokenizer, so a client that counts the text's tokens counts
exactly what was streamed.

It may keep a KV cache (speedsplit/serving/reference_cache.py): `--prefix-cache-tokens N` holds
the last sequences it served (prompt and answer) on its card, and a prompt token found there
costs no prefill; `--offload-cache-tokens M` keeps what the card evicts in a host tier, whose
hits load at `--offload-tok-s` (KV-cache offload). It says each request's hits in its usage
(`prompt_tokens_details`: `cached_tokens`, and its own `offloaded_tokens`) and counts them as
vLLM's prefix-cache and external prefix-cache counters in `/metrics`, and says the card's cache
at start as vLLM does ("KV cache size: N tokens", an engine fact).

Its answers are set by hand too (speedsplit/serving/reference_answers.py: `--diverge-every`,
`--diverge-at`, `--nll`), with token ids and logprobs where a request asks (`logprobs`,
`return_tokens_as_token_ids`, `echo`): a quality probe's requests (they ask for logprobs) are
answered at once and count in no fault's schedule.

    python -m speedsplit.serving.reference --model DIR --served-model-name NAME \
        --host 127.0.0.1 --port 8000 --ttft-s 0.25 --itl-s 0.01 --max-concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from speedsplit.core import apikey
from speedsplit.core.awake import Awake
from speedsplit.core.errors import BadRequest
from speedsplit.serving import logprobs
from speedsplit.serving.reference_answers import Answers
from speedsplit.serving.reference_cache import KvTiers
from speedsplit.serving.reference_speed import EngineClock, Faults, Speed, add_speed_args, answers_of, speed_of

DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
STATE = web.AppKey("reference", object)


# --- the server --------------------------------------------------------------------------------


class Words:
    """The text of an answer's i-th token, for a client that counts a stream's tokens by its text
    (loadgen.count_text): with the model's tokenizer, whole-word tokens that, in the order the
    answer says them, encode back to exactly one token each (so the text counts what was
    streamed); without one, " t{i}" (one word a token)."""

    LENGTH = 512  # the answer's words, then again from its first

    def __init__(self, model_dir: str | None = None):
        self._cont: list[str] | None = None
        path = Path(model_dir) / "tokenizer.json" if model_dir else None
        if path is None or not path.is_file():
            return
        import random

        from speedsplit.models.prompts import FastTokenizer, word_ids

        tok = FastTokenizer(path)
        words = word_ids(tok, random.Random(0), want=self.LENGTH)
        ids = [words[i % len(words)] for i in range(self.LENGTH)]
        # the text token i adds after token i-1 (as an incremental detokenizer streams it)
        cont = [tok.decode([ids[i - 1], ids[i]])[len(tok.decode([ids[i - 1]])) :] for i in range(self.LENGTH)]
        first = tok.decode([ids[0]])
        check = first + "".join(cont[1:]) + "".join(cont) + cont[0]
        if len(tok.encode(check, add_special_tokens=False)) == 2 * self.LENGTH + 1:
            self._first, self._cont = first, cont

    def text(self, i: int) -> str:
        if self._cont is None:
            return f" t{i}"
        return self._first if i == 0 else self._cont[i % self.LENGTH]


@dataclass
class ServerState:
    """The server's state: its slots, its counts, and how to count a prompt's tokens."""

    speed: Speed
    faults: Faults
    served_name: str
    ids_of: object  # text -> its token ids
    answers: Answers = field(default_factory=Answers)
    words: Words = field(default_factory=Words)  # an answer's token texts
    received: int = 0
    dead: bool = False  # --dead-after-probe, once a probe came
    running: int = 0
    waiting: int = 0
    slots: asyncio.Semaphore | None = field(default=None, repr=False)
    awake: Awake = field(default_factory=Awake, repr=False)  # ticks while it serves (core/awake.py)
    engine: EngineClock | None = None  # its step counter (none where tokens come at once)
    cache: KvTiers | None = None  # its KV cache (--prefix-cache-tokens; none: every prompt read whole)

    def __post_init__(self) -> None:
        if self.speed.max_concurrency:
            self.slots = asyncio.Semaphore(self.speed.max_concurrency)
        if self.speed.step_s() > 0:
            self.engine = EngineClock(self.speed.step_s())
        if self.speed.prefix_cache_tokens:
            self.cache = KvTiers(self.speed.prefix_cache_tokens, self.speed.offload_cache_tokens)


def token_ids(model_dir: str | None):
    """How the server tokenizes a prompt: the model's tokenizer (as vLLM would, no special
    tokens added: the prompts speedsplit builds are exact in that count), else one id a word."""
    path = Path(model_dir) / "tokenizer.json" if model_dir else None
    if path is not None and path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return lambda text: tok.encode(text, add_special_tokens=False).ids
    return lambda text: [zlib.crc32(w.encode()) for w in text.split()]


def _parse(body: dict, chat: bool) -> tuple[str, int, bool, dict, logprobs.Asked]:
    """The prompt text, the tokens asked for, whether to stream, the stream options and the
    logprobs asked for."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        n = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        n = body.get("max_tokens")
    if "generation_config" in body:  # the transformers dialect
        try:
            n = json.loads(body["generation_config"]).get("max_new_tokens", n)
        except (TypeError, ValueError, AttributeError):
            raise BadRequest("generation_config must be a JSON object") from None
    n = DEFAULT_MAX_TOKENS if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadRequest(f"max_tokens must be a positive integer, not {n!r}")
    options = body.get("stream_options") or {}
    asked = logprobs.Asked() if chat else logprobs.asked(body)  # chat's logprobs: none here
    return prompt, n, bool(body.get("stream", False)), options if isinstance(options, dict) else {}, asked


def _chunk(
    kind: str, rid: str, model: str, text: str, finish: str | None, usage: dict | None, lp: dict | None = None
) -> bytes:
    if kind == "chat":
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if usage is not None:
        out["usage"] = usage
    return b"data: " + json.dumps(out).encode() + b"\n\n"


def _usage(prompt: int, completion: int, hits: tuple[int, int] | None = None) -> dict:
    """OpenAI's usage; with a KV cache, the prompt tokens it held (cached_tokens, as vLLM says
    them with --enable-prompt-tokens-details: the card's and the host's) and those of the host
    tier (offloaded_tokens: the reference server's own)."""
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if hits is not None:
        out["prompt_tokens_details"] = {"cached_tokens": hits[0] + hits[1], "offloaded_tokens": hits[1]}
    return out


async def _until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


async def _answer(request: web.Request, kind: str) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    arrived = time.perf_counter()  # its clock runs from here: reading and counting the prompt is in its TTFT
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        prompt, n, stream, options, asked = _parse(body, kind == "chat")
    except (BadRequest, ValueError) as exc:
        return web.json_response({"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}, status=400)
    if asked.top is not None and state.faults.dead_after_probe and not state.dead:
        print("reference fault: RuntimeError: the engine died serving a quality probe", flush=True)
        state.dead = True
    if state.dead:  # as vLLM's API server over an engine that died: up, answering 500
        return web.json_response({"error": {"message": "EngineDeadError: the engine died", "code": 500}}, status=500)
    if asked.top is not None:  # a quality probe's: its answer, at once
        return await _answer_probe(request, state, kind, prompt, n, stream, asked)
    state.received += 1
    fault = state.faults.of(state.received)
    if fault == "error":
        return web.json_response({"error": {"message": "reference fault: error", "code": 500}}, status=500)
    ids = state.ids_of(prompt)
    prompt_tokens = len(ids)
    streamed = max(1, int(n * state.faults.short_fraction)) if fault in ("short", "overclaim") else n
    claimed = round((n if fault == "overclaim" else streamed) * state.faults.usage_factor)  # what usage says
    async with state.awake:  # a deadline hundreds of ms away is still met to the millisecond
        state.waiting += 1
        try:
            if state.slots is not None:
                waits = state.slots.locked()
                await state.slots.acquire()
                if waits:  # its clock starts with its slot
                    arrived = time.perf_counter()
        finally:
            state.waiting -= 1
        state.running += 1
        hits = state.cache.lookup(ids) if state.cache else None  # its prompt looked up as its slot begins
        try:
            return await _serve_request(
                request, state, kind, fault, prompt_tokens, streamed, claimed, stream, options, arrived, hits
            )
        finally:
            if state.cache:  # its prompt and answer, kept
                state.cache.store(ids + state.ids_of("".join(state.words.text(i) for i in range(streamed))))
            state.running -= 1
            if state.slots is not None:
                state.slots.release()


async def _serve_request(
    request: web.Request,
    state: ServerState,
    kind: str,
    fault: str | None,
    prompt_tokens: int,
    streamed: int,
    claimed: int,
    stream: bool,
    options: dict,
    start: float,
    hits: tuple[int, int] | None = None,
) -> web.StreamResponse:
    speed = state.speed
    first = start + speed.first_token_s(prompt_tokens, *(hits or ()))
    half = streamed // 2
    rid = f"ref-{uuid.uuid4().hex[:12]}"
    engine = state.engine
    if not stream:
        pause = state.faults.stall_s if fault == "stall" else 0.0
        last = first + speed.itl_s * max(0, streamed - 1) + pause
        await _until(first)
        if engine:
            engine.begin(first)
        try:
            await _until(last)
        finally:
            if engine:
                engine.tokens += streamed
                engine.end(max(first, min(last, time.perf_counter())))
        if fault == "drop":
            request.transport.abort()
            raise ConnectionResetError("reference fault: drop")
        text = "".join(state.words.text(i) for i in range(streamed))
        choice = {"index": 0, "finish_reason": "length"}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()),
                "model": state.served_name,
                "choices": [choice],
                "usage": _usage(prompt_tokens, claimed, hits),
            }
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    continuous = bool(options.get("continuous_usage_stats")) and not speed.no_running_count
    shift = 0.0
    begun = 0  # the first token the next chunk carries
    decoding = False  # whether its engine counts it among the requests it decodes
    try:
        for i in speed.chunk_ends(streamed):  # each chunk's last token
            if begun <= half <= i and fault in ("drop", "stall"):
                if fault == "drop":
                    request.transport.abort()
                    return resp
                shift = state.faults.stall_s
            at = first + speed.itl_s * i + shift
            await _until(at)
            if engine and not decoding:
                engine.begin(at)
                decoding = True
            finish = "length" if i == streamed - 1 else None
            usage = _usage(prompt_tokens, i + 1) if continuous else None
            text = "".join(state.words.text(j) for j in range(begun, i + 1))
            if engine:
                engine.tokens += i + 1 - begun
                if speed.spec_draft_tokens and begun:  # a speculative step: its drafts, all but its last token accepted
                    engine.drafts += 1
                    engine.draft_tokens += speed.spec_draft_tokens
                    engine.accepted += i - begun
            if finish and engine:
                engine.end(at)
                decoding = False
            await resp.write(_chunk(kind, rid, state.served_name, text, finish, usage))
            begun = i + 1
    finally:
        if decoding:  # it ended early (dropped, or its client went)
            engine.end(time.perf_counter())
    if options.get("include_usage"):
        usage = {"id": rid, "object": "text_completion", "model": state.served_name, "choices": []}
        usage["usage"] = _usage(prompt_tokens, claimed, hits)
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _word_text(ids: list[int]) -> str:
    """A scored prompt's tokens named by their ids (the server has no tokenizer to decode with)."""
    return "".join(f" w{i}" for i in ids)


async def _answer_probe(
    request: web.Request, state: ServerState, kind: str, prompt: str, n: int, stream: bool, asked: logprobs.Asked
) -> web.StreamResponse:
    """A request that asks for logprobs: the prompt scored (echo), or the answer's tokens each
    with logprob 0 (the answer is certain), streamed or not."""
    rid = f"ref-{uuid.uuid4().hex[:12]}"
    ids = state.ids_of(prompt)
    if asked.echo:  # the prompt scored, then its answer's first token (logprob 0), as OpenAI's echo
        lps, tops = state.answers.scores(ids, asked.top)
        first, first_text = state.answers.token(prompt, 0)
        lp = logprobs.logprobs_object(
            [*ids, first], [None, *lps, 0.0], [None, *tops, {first: 0.0}], _word_text, asked.as_ids
        )
        choice = {"index": 0, "text": prompt + first_text, "logprobs": lp, "finish_reason": "length"}
        return web.json_response(
            {"id": rid, "object": "text_completion", "model": state.served_name, "choices": [choice]}
            | {"usage": _usage(len(ids), 1)}
        )
    diverges = state.answers.diverges(prompt)
    tokens = [state.answers.token(prompt, i, diverges) for i in range(n)]
    texts = dict(tokens)

    def decode(ids: list[int]) -> str:
        return "".join(texts[i] for i in ids)

    if not stream:
        lp = logprobs.logprobs_object(
            [t for t, _ in tokens], [0.0] * n, [{t: 0.0} for t, _ in tokens], decode, asked.as_ids
        )
        choice = {"index": 0, "text": decode([t for t, _ in tokens]), "logprobs": lp, "finish_reason": "length"}
        return web.json_response(
            {"id": rid, "object": "text_completion", "model": state.served_name, "choices": [choice]}
            | {"usage": _usage(len(ids), n)}
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for i, (t, text) in enumerate(tokens):
        lp = logprobs.logprobs_object([t], [0.0], [{t: 0.0}], decode, asked.as_ids)
        await resp.write(_chunk(kind, rid, state.served_name, text, "length" if i == n - 1 else None, None, lp))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app(
    speed: Speed,
    faults: Faults = Faults(),
    served_name: str = "reference",
    model_dir: str | None = None,
    received: list | None = None,
    api_key: str | None = None,
    answers: Answers = Answers(),
) -> web.Application:
    """The reference server as an aiohttp application; `received`, if given, collects every
    request body as the server got it (what a client really sent); with `api_key`, a /v1/
    request without it is refused (401)."""
    app = web.Application(client_max_size=16 * 2**20, middlewares=apikey.middlewares(api_key))

    async def start(app: web.Application) -> None:  # the semaphore belongs to the serving loop
        app[STATE] = ServerState(speed, faults, served_name, token_ids(model_dir), answers, Words(model_dir))

    async def completions(request: web.Request) -> web.StreamResponse:
        if received is not None:
            received.append(await request.json())
        return await _answer(request, "completion")

    async def chat(request: web.Request) -> web.StreamResponse:
        if received is not None:
            received.append(await request.json())
        return await _answer(request, "chat")

    async def health(request: web.Request) -> web.Response:
        if request.app[STATE].dead:
            return web.json_response({"status": "engine dead"}, status=500)
        return web.json_response({"status": "ok"})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": served_name, "object": "model"}]})

    async def metrics(request: web.Request) -> web.Response:
        s: ServerState = request.app[STATE]
        label = f'{{model_name="{served_name}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {s.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {s.waiting}",
        ]
        if s.engine is not None:  # as vLLM's histogram of the tokens of each step: its count and sum
            lines += [
                "# TYPE vllm:iteration_tokens_total histogram",
                f"vllm:iteration_tokens_total_count{label} {s.engine.steps(time.perf_counter())}",
                f"vllm:iteration_tokens_total_sum{label} {s.engine.tokens}",
            ]
        if s.engine is not None and s.speed.spec_draft_tokens:  # vLLM's spec-decode counters
            lines += [
                f"vllm:spec_decode_num_drafts_total{label} {s.engine.drafts}",
                f"vllm:spec_decode_num_draft_tokens_total{label} {s.engine.draft_tokens}",
                f"vllm:spec_decode_num_accepted_tokens_total{label} {s.engine.accepted}",
            ]
        if s.cache is not None:  # vLLM's prefix-cache counters, and its KV connector's (offload)
            lines += [
                f"vllm:prefix_cache_queries_total{label} {s.cache.queries}",
                f"vllm:prefix_cache_hits_total{label} {s.cache.hits}",
            ]
            if s.cache.host_tokens:
                lines += [
                    f"vllm:external_prefix_cache_queries_total{label} {s.cache.host_queries}",
                    f"vllm:external_prefix_cache_hits_total{label} {s.cache.host_hits}",
                ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app.on_startup.append(start)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    return app


def serve_in_thread(app: web.Application) -> str:
    """Run app on a free 127.0.0.1 port in a daemon thread of this process; its base URL.
    (A stack runs it as its own process: `python -m speedsplit.serving.reference`.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    ready.wait(10)
    return f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model folder: its tokenizer counts prompt tokens (else words)")
    p.add_argument("--served-model-name", default="reference")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_speed_args(p)
    args = p.parse_args(argv)
    speed, faults = speed_of(args)
    answers = answers_of(args)
    print(f"reference server: {speed} {faults} {answers} on {args.host}:{args.port}", flush=True)
    if speed.prefix_cache_tokens:  # its card's cache, as vLLM says it (serving/serverlog reads the engine's facts)
        print(f"KV cache size: {speed.prefix_cache_tokens:,} tokens", flush=True)
    app = make_app(
        speed, faults, args.served_model_name, args.model, api_key=os.environ.get(apikey.ENV), answers=answers
    )
    # A server of known speed keeps it: what lives once it has started (its tokenizer, the
    # imports) is set aside from garbage collection, whose full passes over it took 15-20 ms,
    # a stall every stream in flight would carry (vLLM's engine freezes its start-up heap too).
    gc.collect()
    gc.freeze()
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
