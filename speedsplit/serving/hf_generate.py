"""Stock `generate()` as a server: the plainest HF reference (stack `hf-generate`).

An OpenAI-compatible streaming `/v1/completions` around `model.generate()` with static
batching and nothing smarter: take up to `--max-batch` of the requests waiting (at least
one), left-pad them into one batch, generate, stream each row's tokens as they are produced,
answer, repeat. No continuous batching (a request arriving mid-batch waits for the next
batch) and no paged cache. Requests speak vLLM's dialect: `max_tokens`, `min_tokens` and
`ignore_eos` make the output length exact; `temperature` 0 is greedy, otherwise sampling
with `top_p` and the request's own `seed`, row by row (a greedy request batched with a
sampled one stays greedy).

It behaves as a server should: a malformed request gets 400 with the reason before anything
is queued (lengths bounded by the model's context), a client that leaves stops its row and a
batch whose clients all left stops, SIGTERM stops a running batch at its next step, and a
batch that fails before its first token is retried request by request so that one bad
request fails alone.

    python -m speedsplit.serving.hf_generate --model DIR --served-model-name NAME \
        --host 127.0.0.1 --port 8000 --device cpu --dtype bfloat16 --max-batch 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from speedsplit.core import apikey

BATCH_KEY = web.AppKey("batcher", object)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default when a request names none
SEED_LIMIT = 2**63


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400), with the reason."""


@dataclass
class Done:
    """The end of a row's stream: why it ended ("length" or "stop")."""

    finish: str


@dataclass
class Request:
    """One completion request waiting for, or in, a batch."""

    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    out: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then Done or an exception
    cancelled: bool = False  # its client left: its row stops at the next step
    sent: int = 0  # tokens handed to its stream (worker thread only)


def _int(body: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low} and {high}, not {value}")
    return value


def _number(body: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number, not {value!r}")
    if value > high or value < low or (low_open and value == low):
        raise BadRequest(f"{key} must be in {'(' if low_open else '['}{low}, {high}], not {value}")
    return float(value)


def parse_request(body, served_name: str, tokenizer, context: int) -> Request:
    """A /v1/completions body as a Request, or BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not a {type(body).__name__}")
    if body.get("model") not in (None, served_name):
        raise BadRequest(f"unknown model {body.get('model')!r} (this server serves {served_name!r})")
    if body.get("stream") is not True:
        raise BadRequest("only streaming requests are served (stream: true)")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string")
    prompt_ids = tokenizer(prompt)["input_ids"]
    room = context - len(prompt_ids)
    if room < 1:
        raise BadRequest(f"the prompt has {len(prompt_ids)} tokens; the model's context is {context}")
    max_tokens = _int(body, "max_tokens", min(DEFAULT_MAX_TOKENS, room), 1, room)
    if not isinstance(body.get("ignore_eos", False), bool):
        raise BadRequest(f"ignore_eos must be true or false, not {body.get('ignore_eos')!r}")
    min_tokens = max_tokens if body.get("ignore_eos") else _int(body, "min_tokens", 0, 0, max_tokens)
    return Request(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=_int(body, "seed", None, 0, SEED_LIMIT - 1),
    )


class Batcher:
    """Static batching over `model.generate()`, one batch at a time on a worker thread."""

    def __init__(self, model, tokenizer, max_batch: int, device: str):
        self.model, self.tokenizer, self.max_batch, self.device = model, tokenizer, max_batch, device
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.batches = 0
        self.largest_batch = 0
        self.steps = 0  # decode steps run, all batches together
        self.stopping = False  # set on shutdown: the running batch stops at its next step
        eos = getattr(model.generation_config, "eos_token_id", None)
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    def context(self) -> int:
        """The longest sequence (prompt + output) the model takes."""
        for source in (self.model.config, self.tokenizer):
            n = getattr(source, "max_position_embeddings", None) or getattr(source, "model_max_length", None)
            if isinstance(n, int) and 0 < n < 10**8:
                return n
        return 2048

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping:
            batch = [await self.waiting.get()]
            while len(batch) < self.max_batch and not self.waiting.empty():
                batch.append(self.waiting.get_nowait())
            batch = [r for r in batch if not r.cancelled]
            if not batch:
                continue
            self.batches += 1
            self.largest_batch = max(self.largest_batch, len(batch))
            await self._serve(batch, loop)

    async def _serve(self, batch: list[Request], loop: asyncio.AbstractEventLoop) -> None:
        try:
            await asyncio.to_thread(self._generate, batch, loop)
        except Exception as exc:
            if len(batch) > 1 and not any(r.sent for r in batch):
                for req in batch:  # nothing streamed yet: each request again on its own
                    await self._serve([req], loop)
                return
            for req in batch:  # its clients get the error; the server goes on
                loop.call_soon_threadsafe(req.out.put_nowait, exc)

    def _generate(self, batch: list[Request], loop: asyncio.AbstractEventLoop) -> None:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        enc = self.tokenizer.pad({"input_ids": [r.prompt_ids for r in batch]}, padding=True, return_tensors="pt")
        enc = enc.to(self.device)
        width = enc["input_ids"].shape[1]
        eos = sorted(self.eos_ids)
        generators = []
        for r in batch:
            g = None
            if r.temperature > 0:
                g = torch.Generator(device=self.device)
                g.manual_seed(r.seed if r.seed is not None else random.randrange(SEED_LIMIT))
            generators.append(g)
        batcher = self

        class RowSampling(LogitsProcessor):
            """Each row its own sampling: EOS barred below its min_tokens; a sampled row's
            token drawn with its own temperature, top_p and generator, then made the only
            choice, so generate()'s greedy pick takes it."""

            def __call__(self, input_ids, scores):
                for i, (req, gen) in enumerate(zip(batch, generators)):
                    if eos and input_ids.shape[1] - width < req.min_tokens:
                        scores[i, eos] = -math.inf
                    if gen is None:
                        continue
                    probs = torch.softmax(scores[i].float() / req.temperature, dim=-1)
                    if req.top_p < 1.0:
                        sorted_p, order = probs.sort(descending=True)
                        drop = sorted_p.cumsum(-1) - sorted_p >= req.top_p  # keep the smallest set reaching top_p
                        probs[order[drop]] = 0.0
                    token = torch.multinomial(probs, 1, generator=gen)
                    scores[i] = -math.inf
                    scores[i, token] = 0.0
                return scores

        class Stream(StoppingCriteria):
            """Called after every decode step: hands each row its new token; a row is done at
            its length, at EOS past its min_tokens, or when its client left."""

            def __init__(self):
                self.done = [False] * len(batch)

            def __call__(self, input_ids, scores, **kwargs):
                batcher.steps += 1
                newest = input_ids[:, -1].tolist()  # one device-to-host copy per step, not one per row
                for i, (req, token) in enumerate(zip(batch, newest)):
                    if self.done[i]:
                        continue
                    if req.cancelled:
                        self.done[i] = True
                        continue
                    req.sent += 1
                    loop.call_soon_threadsafe(req.out.put_nowait, token)
                    stop = token in batcher.eos_ids and req.sent >= req.min_tokens
                    if req.sent >= req.max_tokens or stop:
                        self.done[i] = True
                        loop.call_soon_threadsafe(req.out.put_nowait, Done("stop" if stop else "length"))
                if batcher.stopping:
                    self.done = [True] * len(batch)
                return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)

        stream = Stream()
        with torch.inference_mode():
            self.model.generate(
                **enc,
                max_new_tokens=max(r.max_tokens for r in batch),
                do_sample=False,
                eos_token_id=None,  # rows end on their own terms (Stream), never the batch on one EOS
                logits_processor=LogitsProcessorList([RowSampling()]),
                stopping_criteria=StoppingCriteriaList([stream]),
                pad_token_id=self.tokenizer.pad_token_id,
            )
        for req, done in zip(batch, stream.done):
            if not done or self.stopping:  # cut short: the stream says so
                loop.call_soon_threadsafe(req.out.put_nowait, RuntimeError("the server is shutting down"))


def _chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> bytes:
    body = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _error(message: str, status: int, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def make_app(batcher: Batcher, served_name: str, api_key: str | None = None) -> web.Application:
    tok = batcher.tokenizer
    context = batcher.context()

    async def health(_):
        return web.Response(text="ok")

    async def stats(_):  # what the batcher did: batches, the largest one, decode steps
        return web.json_response(
            {"batches": batcher.batches, "largest_batch": batcher.largest_batch, "steps": batcher.steps}
        )

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": served_name, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        if batcher.stopping:
            return _error("the server is shutting down", 503, "server_error")
        try:
            req = parse_request(await request.json(), served_name, tok, context)
        except json.JSONDecodeError as exc:
            return _error(f"the body is not JSON ({exc})", 400)
        except BadRequest as exc:
            return _error(str(exc), 400)
        try:
            await batcher.waiting.put(req)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            rid, created, n = f"cmpl-{uuid.uuid4().hex}", int(time.time()), 0
            while True:
                item = await req.out.get()
                if isinstance(item, Done):
                    break
                if isinstance(item, Exception):
                    err = {"error": {"message": f"{type(item).__name__}: {item}", "type": "server_error"}}
                    await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                    await resp.write(b"data: [DONE]\n\n")
                    return resp
                n += 1  # the last token carries the finish reason, as vLLM sends it
                last = n == req.max_tokens or (item in batcher.eos_ids and n >= req.min_tokens)
                finish = ("stop" if n < req.max_tokens else "length") if last else None
                await resp.write(_chunk(rid, served_name, created, tok.decode([item]), finish))
            n_prompt = len(req.prompt_ids)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
            final = {"id": rid, "object": "text_completion", "created": created, "model": served_name}
            await resp.write(b"data: " + json.dumps({**final, "choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            req.cancelled = True  # finished, or its client left (the handler was cancelled): its row stops

    async def start_batcher(app: web.Application):
        app[BATCH_KEY] = asyncio.create_task(batcher.run())
        yield
        batcher.stopping = True  # a running batch ends at its next decode step
        app[BATCH_KEY].cancel()

    async def stop_batches(_):  # SIGTERM: the running batch ends at its next step, its clients are told
        batcher.stopping = True

    app = web.Application(client_max_size=16 * 2**20, middlewares=apikey.middlewares(api_key))
    app.on_shutdown.append(stop_batches)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/v1/completions", completions)
    app.cleanup_ctx.append(start_batcher)
    return app


def load(model_dir: str, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"  # decoder-only batches pad on the left
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    return model, tokenizer


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="model.generate() behind an OpenAI-compatible streaming server.")
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-batch", type=_positive, default=8, help="batch ceiling: requests generated together at most")
    args = p.parse_args(argv)
    model, tokenizer = load(args.model, args.device, args.dtype)
    print(
        f"hf-generate: {args.model} on {args.device} ({args.dtype}), static batches of up to {args.max_batch}",
        flush=True,
    )
    batcher = Batcher(model, tokenizer, args.max_batch, args.device)
    # handler_cancellation: a client that disconnects cancels its handler, which stops its row
    web.run_app(
        make_app(batcher, args.served_model_name, api_key=os.environ.get(apikey.ENV)),
        host=args.host,
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=5.0,
    )


if __name__ == "__main__":
    main()
