"""The load generator's own ceiling: a minimal OpenAI-style streaming server that answers at
once (one SSE chunk per token, usage last), driven by the real load generator. The highest
rate it sustains bounds what the load generator can measure on this machine.

    speedsplit ceiling --users 64 --output-tokens 256 [--highest-measured TOK_S]
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from aiohttp import web


def make_app(delay_s: float = 0.0, received: list | None = None) -> web.Application:
    """A /v1/completions server that streams exactly max_tokens chunks.

    delay_s sleeps between chunks; `received`, if given, collects every request body as the
    server got it (what a client really sent)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if received is not None:
            received.append(body)
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        prompt_tokens = len(str(body.get("prompt", "")).split())
        for i in range(n):
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f" w{i}"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if delay_s:
                await asyncio.sleep(delay_s)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    return app


def serve_in_thread(app: web.Application) -> tuple[str, threading.Thread]:
    """Run app on a free 127.0.0.1 port in a daemon thread; returns its base URL."""
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

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(10)
    return f"http://127.0.0.1:{port}", t


def highest_measured(cells_table: str) -> float | None:
    from pathlib import Path

    from speedsplit.core.formats import read_frame

    if not Path(cells_table).is_file():
        return None
    return read_frame(cells_table)["output_tok_s"].max()


def report(
    users: int, output_tokens: int, requests_per_user: int, highest: float | None, results_dir: str = "results"
) -> None:
    """Measure the load generator against a server that answers at once (`speedsplit ceiling`)
    and print its ceiling beside the highest rate a cell measured (given, else the results
    folder's cells table)."""
    from speedsplit.probes import loadgen

    source = "given"
    if highest is None:
        cells = f"{results_dir}/tables/cells.parquet"
        highest, source = highest_measured(cells), cells
    # The server runs in another process so that it does not share the client's event loop.
    import multiprocessing as mp

    port_q: mp.Queue = mp.Queue()

    def server_proc(q):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        q.put(port)
        web.run_app(make_app(), host="127.0.0.1", port=port, access_log=None, print=None)

    proc = mp.get_context("fork").Process(target=server_proc, args=(port_q,), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port_q.get(timeout=10)}"
    time.sleep(1.0)
    prompts = [" ".join(f"w{j}" for j in range(64))] * 8
    spec = loadgen.LoadSpec(
        urls=[url],
        model="m",
        prompts=prompts,
        users=users,
        prompt_tokens=64,
        output_tokens=output_tokens,
        requests_per_user=requests_per_user,
        warmup_requests=1,
    )
    s, _ = loadgen.run(spec)
    proc.terminate()
    print(
        f"load generator ceiling: {s.output_tok_s:.0f} output tok/s "
        f"({users} users x {output_tokens} tokens, {s.completed} requests, {s.failed} failed)"
    )
    if highest:
        print(
            f"highest measured cell ({source}): {highest:.0f} tok/s; "
            f"ceiling / highest = {s.output_tok_s / highest:.1f}x"
        )
