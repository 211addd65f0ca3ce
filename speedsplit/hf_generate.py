"""Stock `generate()` as a server: the plainest HF reference (stack `hf-generate`).

An OpenAI-compatible streaming `/v1/completions` around `model.generate()` with static
batching and nothing smarter: take up to `--max-batch` of the requests waiting (at least
one), left-pad them into one batch, generate, stream each row's tokens as they are produced,
answer, repeat. No continuous batching (a request arriving mid-batch waits for the next
batch) and no paged cache. Requests speak vLLM's dialect: `max_tokens`, `min_tokens` and
`ignore_eos` make the output length exact; `temperature` 0 is greedy, otherwise sampling
with `top_p` and, per batch, the first request's `seed`.

    python -m speedsplit.hf_generate --model DIR --served-model-name NAME \
        --host 127.0.0.1 --port 8000 --device cpu --dtype bfloat16 --max-batch 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

BATCH_KEY = web.AppKey("batcher", object)


@dataclass
class Request:
    """One completion request waiting for, or in, a batch."""

    prompt: str
    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    out: asyncio.Queue = field(default_factory=asyncio.Queue)  # token ids, then None


class Batcher:
    """Static batching over `model.generate()`, one batch at a time on a worker thread."""

    def __init__(self, model, tokenizer, max_batch: int, device: str):
        self.model, self.tokenizer, self.max_batch, self.device = model, tokenizer, max_batch, device
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.batches = 0
        self.largest_batch = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.waiting.get()]
            while len(batch) < self.max_batch and not self.waiting.empty():
                batch.append(self.waiting.get_nowait())
            self.batches += 1
            self.largest_batch = max(self.largest_batch, len(batch))
            try:
                await asyncio.to_thread(self._generate, batch, loop)
            except Exception as exc:  # the batch's clients get the error; the server goes on
                for req in batch:
                    loop.call_soon_threadsafe(req.out.put_nowait, exc)

    def _generate(self, batch: list[Request], loop: asyncio.AbstractEventLoop) -> None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        enc = self.tokenizer([r.prompt for r in batch], return_tensors="pt", padding=True).to(self.device)
        width = enc["input_ids"].shape[1]
        longest = max(r.max_tokens for r in batch)

        class Stream(StoppingCriteria):
            """Called after every decode step: hands each row its new token (never stops)."""

            def __call__(self, input_ids, scores, **kwargs):
                step = input_ids.shape[1] - width - 1  # 0 for the first new token
                newest = input_ids[:, -1].tolist()  # one device-to-host copy per step, not one per row
                for req, token in zip(batch, newest):
                    if step < req.max_tokens:  # a shorter request's stream ends; its row runs on
                        loop.call_soon_threadsafe(req.out.put_nowait, token)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        first = batch[0]
        sampling = {"do_sample": False}
        if first.temperature > 0:
            sampling = {"do_sample": True, "temperature": first.temperature, "top_p": first.top_p}
            if first.seed is not None:
                torch.manual_seed(first.seed)
        with torch.inference_mode():
            self.model.generate(
                **enc,
                max_new_tokens=longest,
                # no row ends before the batch's longest: EOS is suppressed up to the exact lengths
                min_new_tokens=max(max(r.min_tokens for r in batch), longest),
                stopping_criteria=StoppingCriteriaList([Stream()]),
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        for req in batch:
            loop.call_soon_threadsafe(req.out.put_nowait, None)


def _chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> bytes:
    body = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def make_app(batcher: Batcher, served_name: str) -> web.Application:
    tok = batcher.tokenizer

    async def health(_):
        return web.Response(text="ok")

    async def stats(_):  # what the batcher did: how many batches, the largest one
        return web.json_response({"batches": batcher.batches, "largest_batch": batcher.largest_batch})

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": served_name, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            if body.get("model") not in (None, served_name):
                raise ValueError(f"unknown model {body.get('model')!r} (this server serves {served_name!r})")
            max_tokens = int(body.get("max_tokens") or 16)
            req = Request(
                prompt=str(body["prompt"]),
                max_tokens=max_tokens,
                min_tokens=max_tokens if body.get("ignore_eos") else int(body.get("min_tokens") or 0),
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                seed=body.get("seed"),
            )
            if not body.get("stream"):
                raise ValueError("only streaming requests are served (stream: true)")
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        prompt_tokens = len(tok(req.prompt)["input_ids"])
        await batcher.waiting.put(req)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid, created, n = f"cmpl-{uuid.uuid4().hex}", int(time.time()), 0
        while True:
            item = await req.out.get()
            if item is None:
                break
            if isinstance(item, Exception):
                err = {"error": {"message": f"{type(item).__name__}: {item}", "type": "server_error"}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                return resp
            n += 1  # the last token carries the finish reason, as vLLM sends it
            finish = "length" if n == req.max_tokens else None
            await resp.write(_chunk(rid, served_name, created, tok.decode([item]), finish))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        final = {"id": rid, "object": "text_completion", "created": created, "model": served_name}
        await resp.write(b"data: " + json.dumps({**final, "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start_batcher(app: web.Application):
        app[BATCH_KEY] = asyncio.create_task(batcher.run())
        yield
        app[BATCH_KEY].cancel()

    app = web.Application()
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="model.generate() behind an OpenAI-compatible streaming server.")
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-batch", type=int, default=8, help="batch ceiling: requests generated together at most")
    args = p.parse_args(argv)
    model, tokenizer = load(args.model, args.device, args.dtype)
    print(
        f"hf-generate: {args.model} on {args.device} ({args.dtype}), static batches of up to {args.max_batch}",
        flush=True,
    )
    batcher = Batcher(model, tokenizer, args.max_batch, args.device)
    web.run_app(make_app(batcher, args.served_model_name), host=args.host, port=args.port, access_log=None)


if __name__ == "__main__":
    main()
