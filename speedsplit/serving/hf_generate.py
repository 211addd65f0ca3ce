"""Stock `generate()` as a server: the plainest HF reference (stack `hf-generate`).

An OpenAI-compatible streaming `/v1/completions` around `model.generate()` with static
batching and nothing smarter: take up to `--max-batch` of the requests waiting (at least
one), left-pad them into one batch, generate, stream each row's tokens as they are produced,
answer, repeat. No continuous batching (a request arriving mid-batch waits for the next
batch) and no paged cache. Requests speak vLLM's dialect: `max_tokens`, `min_tokens` and
`ignore_eos` make the output length exact; `temperature` 0 is greedy, otherwise sampling
with `top_p` and the request's own `seed`, row by row (a greedy request batched with a
sampled one stays greedy). `logprobs` (with `return_tokens_as_token_ids`) streams each token's
log-probability and the top ones, from the model's own distribution; `echo` with `logprobs`
scores a prompt instead (its tokens' logprobs and one greedy token after them, as OpenAI's
completions answer echo with max_tokens 1; one JSON answer): what the quality probes ask
(speedsplit/probes/quality.py).

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

from aiohttp import web

from speedsplit.core import apikey
from speedsplit.core.errors import BadRequest
from speedsplit.serving import logprobs
from speedsplit.serving.hf_request import SEED_LIMIT, Done, Request, parse_request

BATCH_KEY = web.AppKey("batcher", object)


class Batcher:
    """Static batching over `model.generate()`, one batch at a time on a worker thread."""

    def __init__(self, model, tokenizer, max_batch: int, device: str):
        self.model, self.tokenizer, self.max_batch, self.device = model, tokenizer, max_batch, device
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.batches = 0
        self.largest_batch = 0
        self.steps = 0  # decode steps run, all batches together
        self.stopping = False  # set on shutdown: the running batch stops at its next step
        self.model_lock = asyncio.Lock()  # one batch or one scoring at a time
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
            async with self.model_lock:
                await asyncio.to_thread(self._generate, batch, loop)
        except Exception as exc:
            if len(batch) > 1 and not any(r.sent for r in batch):
                for req in batch:  # nothing streamed yet: each request again on its own
                    await self._serve([req], loop)
                return
            for req in batch:  # its clients get the error; the server goes on
                loop.call_soon_threadsafe(req.out.put_nowait, exc)

    def score(self, ids: list[int], k: int) -> tuple[list[int], list[float], list[dict[int, float]]]:
        """A prompt scored, then one greedy token after it (as OpenAI's echo with max_tokens 1
        answers): the tokens, each one's logprob given those before it (from the second on),
        and the k highest at each of those places."""
        import torch

        with torch.inference_mode():
            x = torch.tensor([ids], device=self.device)
            lp = self.model(input_ids=x).logits[0].float().log_softmax(-1)
        after = int(lp[-1].argmax())
        chosen = lp[:-1].gather(1, x[0, 1:, None])[:, 0].tolist() + [float(lp[-1, after])]
        return ids + [after], chosen, [logprobs.top_of(row, k) if k else {} for row in lp]

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
        raw = []  # the model's own log-probabilities of the latest step, where a row asked for them

        class KeepRaw(LogitsProcessor):
            def __call__(self, input_ids, scores):
                raw[:] = [scores.float().log_softmax(-1)]
                return scores

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
                    lp = None
                    if req.asked.top is not None:
                        lp = (float(raw[0][i, token]), logprobs.top_of(raw[0][i], req.asked.top))
                    loop.call_soon_threadsafe(req.out.put_nowait, (token, lp))
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
                logits_processor=LogitsProcessorList(
                    ([KeepRaw()] if any(r.asked.top is not None for r in batch) else []) + [RowSampling()]
                ),
                stopping_criteria=StoppingCriteriaList([stream]),
                pad_token_id=self.tokenizer.pad_token_id,
            )
        for req, done in zip(batch, stream.done):
            if not done or self.stopping:  # cut short: the stream says so
                loop.call_soon_threadsafe(req.out.put_nowait, RuntimeError("the server is shutting down"))


def _chunk(rid: str, model: str, created: int, text: str, finish: str | None, lp: dict | None = None) -> bytes:
    body = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}],
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
        if req.asked.echo:
            return await scored(req)
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
                token, lp = item
                n += 1  # the last token carries the finish reason, as vLLM sends it
                last = n == req.max_tokens or (token in batcher.eos_ids and n >= req.min_tokens)
                finish = ("stop" if n < req.max_tokens else "length") if last else None
                lp = lp and logprobs.logprobs_object([token], [lp[0]], [lp[1]], tok.decode, req.asked.as_ids)
                await resp.write(_chunk(rid, served_name, created, tok.decode([token]), finish, lp))
            n_prompt = len(req.prompt_ids)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
            final = {"id": rid, "object": "text_completion", "created": created, "model": served_name}
            await resp.write(b"data: " + json.dumps({**final, "choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            req.cancelled = True  # finished, or its client left (the handler was cancelled): its row stops

    async def scored(req: Request) -> web.Response:
        """An echo request: the prompt's own scores and one greedy token, after the running batch."""
        async with batcher.model_lock:
            ids, lps, tops = await asyncio.to_thread(batcher.score, req.prompt_ids, req.asked.top)
        lp = logprobs.logprobs_object(ids, [None, *lps], [None, *tops], tok.decode, req.asked.as_ids)
        choice = {"index": 0, "text": tok.decode(ids), "logprobs": lp, "finish_reason": "length"}
        n = len(req.prompt_ids)
        usage = {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": served_name,
                "choices": [choice],
                "usage": usage,
            }
        )

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
