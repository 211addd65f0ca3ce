"""Streaming load generator for OpenAI-compatible /v1/completions servers.

Closed loop: N users each send their next request when the previous one completes; the
measured phase starts for all users at once, or with the users joining evenly over a ramp.
Open loop (a schedule, speedsplit/core/traffic.py): each request is sent when it is due,
whatever is still in flight, with its own prompt and output length; each records when it was
due beside when it was sent. A warm-up phase runs first (closed loop) and is excluded. It
knows URLs and a request dialect, never which stack is behind them. What a cell asks (LoadSpec)
and each dialect's request body are speedsplit/probes/loadspec.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import sys
import time
from typing import Callable

import aiohttp

from speedsplit.core import apikey, awake
from speedsplit.core.loads import DueRequest, ClosedLoopSettings
from speedsplit.core.record import Distribution, InstanceLoad, Summary
from speedsplit.core.requestlog import RequestRecord
from speedsplit.probes import slo
from speedsplit.probes.loadspec import REQUEST_FORMATS, LoadSpec, request_body, request_index


def _running_count(chunk: dict) -> int | None:
    """The output tokens a server says it has streamed so far, where each chunk says so: vLLM's
    usage (continuous_usage_stats), llama.cpp's timings.predicted_n (timings_per_token)."""
    usage, timings = chunk.get("usage") or {}, chunk.get("timings") or {}
    n = usage.get("completion_tokens", timings.get("predicted_n"))
    return n if isinstance(n, int) else None


def _new_tokens(choice: dict, running: int | None, streamed: int) -> int:
    """Output tokens one streamed chunk carries: what the running count grew by (a chunk may
    hold no text, a partial character, or several tokens), else one for a chunk with text, or
    with no text and no finish reason (transformers streams a token that decodes to nothing so;
    a closing chunk carries a finish reason, a role chunk no text either)."""
    if running is not None:
        return max(0, running - streamed)
    if "delta" in choice:
        delta = choice["delta"] or {}
        return (
            1
            if delta.get("content") or ("content" in delta and "role" not in delta and not choice.get("finish_reason"))
            else 0
        )
    return 1 if choice.get("text") or (choice.get("text") == "" and not choice.get("finish_reason")) else 0


def _on_the_wire() -> aiohttp.TraceConfig:
    """A request's `sent` restamped as its body goes to the socket: aiohttp writes a body from
    a task of its own (eagerly from Python 3.12 on, on 3.11 after every task ready before it),
    so in a burst of N requests sent at once the first went out only after the other N-1 had
    started (a burst of 8 on a 2-core host: 10 ms), and that wait was read as the server's
    TTFT. The wait stays in the record as lateness (sent - due)."""

    async def stamp(session, ctx, params) -> None:
        sending = ctx.trace_request_ctx  # {"rec": ..., "t0": ...} until its body goes out
        if sending and "rec" in sending:
            sending.pop("rec").sent = time.perf_counter() - sending["t0"]

    config = aiohttp.TraceConfig()
    config.on_request_chunk_sent.append(stamp)
    return config


async def _drained(resp: aiohttp.ClientResponse) -> None:
    """Read an answer to its end after its [DONE]: a body left unread as the response is released
    (its chunked terminator not yet arrived) makes aiohttp close the connection, and a later
    request opened a new one instead of reusing it (a test of connection reuse failed one run in
    two). A server that sends nothing more in a second gets its connection closed, as before."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
        async with asyncio.timeout(1.0):
            await resp.content.read()


async def _one_request(http: aiohttp.ClientSession, spec: LoadSpec, rec: RequestRecord, body: dict, t0: float) -> None:
    last = None
    streamed = 0  # output tokens seen in the stream so far
    running = None  # whether every chunk carries the running count (_running_count)
    try:
        async with asyncio.timeout(spec.request_timeout_s):
            async with http.post(
                rec.url + "/v1/completions", json=body, trace_request_ctx={"rec": rec, "t0": t0}
            ) as resp:
                if resp.status != 200:
                    rec.error = f"http_{resp.status}"
                    rec.detail = (await resp.text())[:300]
                    return
                events, other = 0, b""  # data: lines seen; the start of anything else (not a stream?)
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        other = other if len(other) >= 200 else other + raw[: 200 - len(other)]
                        continue
                    events += 1
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        rec.end = time.perf_counter() - t0
                        await _drained(resp)
                        break
                    now = time.perf_counter() - t0
                    chunk = json.loads(payload)
                    if chunk.get("error"):
                        rec.error, rec.detail = "server_error", str(chunk["error"])[:300]
                        return
                    usage = chunk.get("usage")
                    if chunk.get("choices"):
                        rec.chunks += 1
                        count = _running_count(chunk)
                        if running is None:  # does the stream carry its running count from the start?
                            running = count is not None
                        choice = chunk["choices"][0]
                        new = _new_tokens(choice, count if running else None, streamed)
                        if choice.get("text"):
                            rec._text.append(choice["text"])
                        if new:  # a chunk that carries output (not a role or a closing one)
                            streamed += new
                            if rec.first_token is None:
                                rec.first_token = now
                            else:
                                rec.gaps.append(now - last)
                            last = now
                    if usage:  # the last usage seen is what the server says it sent
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.usage_tokens = usage.get("completion_tokens")
                        details = usage.get("prompt_tokens_details") or {}  # what its KV cache held
                        rec.cached_tokens, rec.offloaded_tokens = (
                            details.get("cached_tokens"),
                            details.get("offloaded_tokens"),
                        )
        if rec.end is None:  # a stream that ended without [DONE]
            rec.end = time.perf_counter() - t0
        if not events:  # a 200 answer, but no server-sent event in it
            kind = resp.headers.get("Content-Type", "no Content-Type")
            rec.error = "not_a_stream"
            rec.detail = f"HTTP 200 with no 'data:' event ({kind}): " + other.decode(errors="replace").strip()[:200]
            return
        rec.streamed_tokens, rec.stream_count = streamed, "running" if running else "chunks"
        rec.settle()  # again once its text is counted (count_text)
        if rec.usage_tokens is None:
            rec.error, rec.detail = "no_usage", "stream ended without a usage chunk"
    except aiohttp.ServerTimeoutError:  # no byte for stall_timeout_s
        rec.error = "stall"
    except TimeoutError:  # the whole request outlasted request_timeout_s
        rec.error = "timeout"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
        rec.error, rec.detail = "connection", type(exc).__name__
    except json.JSONDecodeError as exc:
        rec.error, rec.detail = "protocol", str(exc)[:200]
    finally:
        if rec.end is None:
            rec.end = time.perf_counter() - t0


def count_text(records: list[RequestRecord], count: Callable[[str], int] | None) -> None:
    """Each request's streamed text tokenised again (`count`: the model's tokenizer, no special
    tokens), once the phases are over (never beside a measured request), and its output tokens
    settled with it: where the stream has no running count, usage is believed only as far as
    the text bears it out (RequestRecord.usage_disagrees)."""
    if count is None:
        return
    for rec in records:
        if rec.streamed_tokens is not None:
            rec.text_tokens = count("".join(rec._text))
            rec.settle()
        rec._text = []
    _session_prompts(records, count)


def _session_prompts(records: list[RequestRecord], count: Callable[[str], int]) -> None:
    """A session's later turns asked for prompts of what their text counts, plus what the server
    counted beyond the text in its first turn (a BOS token): their lengths are checked as every
    other prompt's are (a prompt the server read otherwise is wrong_prompt_length)."""
    first = {r.user: r for r in records if r.index == 0 and r._prompt is not None}
    for rec in records:
        if rec._prompt is None:
            continue
        base = first.get(rec.user)
        if rec.index > 0 and base is not None and base.prompt_tokens is not None:
            rec.asked_prompt_tokens = count(rec._prompt) + base.prompt_tokens - count(base._prompt)
    for rec in records:
        rec._prompt = None


async def _phase(
    http: aiohttp.ClientSession,
    spec: LoadSpec,
    phase: str,
    per_user: int,
    records: list[RequestRecord],
    progress: Callable[[str], None] | None,
    on_start: Callable[[], None] | None = None,
) -> tuple[float, float]:
    total = spec.users * per_user
    if phase == "measured" and spec.schedule is not None:
        total = len(spec.schedule)
    elif phase == "measured" and spec.sessions is not None:
        total = spec.sessions.requests
    done = 0
    t0 = time.perf_counter()
    if on_start:
        on_start()

    async def user(u: int) -> None:
        nonlocal done
        url = spec.urls[u % len(spec.urls)]
        if phase == "measured" and spec.closed.ramp_s:
            await asyncio.sleep(u * spec.closed.ramp_s / spec.users)
        for i in range(per_user):
            rec = RequestRecord(user=u, index=i, phase=phase, url=url, sent=time.perf_counter() - t0)
            records.append(rec)
            k = request_index(spec, phase, u, i)
            body = request_body(spec, spec.prompts[k % len(spec.prompts)], spec.seed + k)
            await _one_request(http, spec, rec, body, t0)
            done += 1
            if phase == "measured" and spec.closed.think_s and i + 1 < per_user:
                await asyncio.sleep(spec.closed.think_s)

    async def open_loop() -> None:
        """Each scheduled request sent when due, however many are in flight."""
        sent = []

        async def one(i: int, a: DueRequest) -> None:
            nonlocal done
            url = spec.urls[i % len(spec.urls)]
            rec = RequestRecord(user=0, index=i, phase=phase, url=url, sent=time.perf_counter() - t0, due=a.due_s)
            rec.asked_prompt_tokens, rec.asked_output_tokens = a.prompt_tokens, a.output_tokens
            records.append(rec)
            k = request_index(spec, phase, 0, i)
            body = request_body(spec, spec.prompts[k % len(spec.prompts)], spec.seed + k, a.output_tokens)
            await _one_request(http, spec, rec, body, t0)
            done += 1

        for i, a in enumerate(spec.schedule):
            delay = a.due_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(asyncio.create_task(one(i, a)))
        await asyncio.gather(*sent)

    async def sessions() -> None:
        """Each session begun when due, then each of its turns sent think_s after the last
        answer ended: the conversation so far (its prompt and the answer the server gave) and the
        turn's new text. A turn that fails ends its session: its later turns are recorded as
        failed with that cause (never sent)."""
        run = spec.sessions

        async def one(s: int) -> None:
            nonlocal done
            url = spec.urls[s % len(spec.urls)]
            prompt, due = run.first[s], run.due_s[s]
            for k in range(run.turns(s)):
                delay = due - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                rec = RequestRecord(user=s, index=k, phase=phase, url=url, sent=time.perf_counter() - t0, due=due)
                rec._prompt = prompt
                rec.asked_output_tokens = run.asked[s][k]
                if k == 0:  # a later turn's length is what its conversation's text counts
                    rec.asked_prompt_tokens = run.first_tokens[s]
                records.append(rec)
                body = request_body(spec, prompt, spec.seed + request_index(spec, phase, s, k), run.asked[s][k])
                await _one_request(http, spec, rec, body, t0)
                done += 1
                if not rec.ok:
                    for later in range(k + 1, run.turns(s)):
                        records.append(
                            RequestRecord(
                                user=s, index=later, phase=phase, url=url, sent=rec.end, end=rec.end,
                                error="session_ended", detail=f"turn {k} failed ({rec.error})",
                            )
                        )  # fmt: skip
                    return
                if k + 1 < run.turns(s):
                    prompt += "".join(rec._text) + run.more[s][k]
                    due = rec.end + run.think_s[s][k]

        await asyncio.gather(*(one(s) for s in range(len(run.first))))

    async def report() -> None:
        while True:
            await asyncio.sleep(2.0)
            # Chunks streamed so far, finished requests or not: with one request per user
            # all of them end together, and a count of finished ones reads 0 until then.
            elapsed = time.perf_counter() - t0
            streamed = sum(r.chunks for r in records)
            progress(f"{phase}: {done}/{total} requests done, {streamed / max(elapsed, 1e-9):.1f} chunks/s streamed")

    reporter = asyncio.create_task(report()) if progress else None
    try:
        if phase == "measured" and spec.schedule is not None:
            await open_loop()
        elif phase == "measured" and spec.sessions is not None:
            await sessions()
        else:
            await asyncio.gather(*(user(u) for u in range(spec.users)))
    finally:
        if reporter:
            reporter.cancel()
    t1 = time.perf_counter()
    return t0, t1


async def run_async(
    spec: LoadSpec,
    progress: Callable[[str], None] | None = None,
    on_measured: Callable[[], None] | None = None,
    before_measured: Callable[[], None] | None = None,
) -> tuple[Summary, list[RequestRecord]]:
    warm: list[RequestRecord] = []
    warm_s = 0.0
    # One session for both phases: the measured phase's first requests go out on the
    # connections the warm-up opened, not on new ones (a burst of 16 first requests on fresh
    # connections waited up to 29 ms longer for its first token).
    timeout = aiohttp.ClientTimeout(total=None, sock_read=spec.stall_timeout_s, sock_connect=30)
    kept = {"keepalive_timeout": spec.idle_close_s} if spec.keep_alive else {"force_close": True}
    connector = aiohttp.TCPConnector(limit=0, **kept)
    # Awake: a client idle 300 ms for a first token would read it milliseconds late (core/awake.py)
    async with (
        awake.held() as ticker,
        aiohttp.ClientSession(
            timeout=timeout, connector=connector, trace_configs=[_on_the_wire()], headers=apikey.headers(spec.api_key)
        ) as http,
    ):
        if spec.warmup_requests:
            w0, w1 = await _phase(http, spec, "warmup", spec.warmup_requests, warm, progress)
            warm_s = w1 - w0
        if before_measured:  # nothing in flight: the warm-up is over, the measured phase not begun
            before_measured()
        measured: list[RequestRecord] = []
        with _heap_frozen():
            t0, t1 = await _phase(http, spec, "measured", spec.requests_per_user, measured, progress, on_measured)
    count_text(warm + measured, spec.count_tokens)
    summary = summarize(measured, t1 - t0, spec, warm_s, sum(1 for r in warm if not r.ok))
    summary.client_stall_s = ticker.longest_stall(t0, t1)
    summary.measured_from = time.time() - (time.perf_counter() - t0)
    return summary, warm + measured


@contextlib.contextmanager
def _heap_frozen():
    """No full garbage collection over the client's heap inside a measured phase: one took 15-20 ms
    on a 2-core Xeon (the imports' objects alone), a stall the requests in flight carried (the
    truth tier read a 20 ms longer TPOT, a 2% longer TTFT p99). What lives before the phase is
    collected once and set aside from collection (gc.freeze); what the phase makes is collected
    as usual, and the heap is handed back to the collector after it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run(
    spec: LoadSpec,
    progress: Callable[[str], None] | None = None,
    on_measured: Callable[[], None] | None = None,
    before_measured: Callable[[], None] | None = None,
) -> tuple[Summary, list[RequestRecord]]:
    """Run warm-up then the measured phase; returns the run summary and every request.
    on_measured is called (it must not block) as the measured phase starts; before_measured
    (it may block, briefly) between the two phases, with nothing in flight."""
    return asyncio.run(run_async(spec, progress, on_measured, before_measured))


def distribution(values: list[float]) -> Distribution:
    """Mean, median, p90 and p99 of values (linear between the nearest ranks), as every run's
    latencies are summarised."""
    if not values:
        return Distribution(mean=None, median=None, p90=None, p99=None)
    v = sorted(values)

    def pct(q: float) -> float:
        k = (len(v) - 1) * q
        lo, hi = int(k), min(int(k) + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (k - lo)

    return Distribution(mean=statistics.fmean(v), median=pct(0.5), p90=pct(0.9), p99=pct(0.99))


def latency_outliers(ok: list[RequestRecord], factor: float, min_s: float) -> list[int]:
    """The completed requests far slower than their own length predicts (positions in `ok`):
    an end-to-end latency above `factor` x (the run's median TTFT + (its output tokens - 1) x
    the run's median TPOT), and at least `min_s` above that prediction. A request held silent
    (a stall shorter than stall_timeout_s) is one; queueing and mixed lengths are not (on every
    committed H200 run, closed loop to 256 users, open loop past the cliff and trace replay,
    the slowest request took at most 2.5 x its prediction). Needs three requests: with fewer,
    the medians are the outlier's own."""
    timed = [r for r in ok if r.first_token is not None and r.output_tokens]
    if len(timed) < 3:
        return []
    ttft = statistics.median(r.first_token - r.sent for r in timed)
    tpots = [t for t in (slo.tpot(r) for r in timed) if t is not None]
    tpot = statistics.median(tpots) if tpots else 0.0  # one-token answers: their TTFT is all
    out = []
    for i, r in enumerate(ok):
        if r.first_token is None or not r.output_tokens:
            continue
        predicted = ttft + (r.output_tokens - 1) * tpot
        e2e = r.end - r.sent
        if e2e > factor * predicted and e2e - predicted >= min_s:
            out.append(i)
    return out


def client_wall(records: list[RequestRecord], wall_s: float, spec: LoadSpec) -> float | None:
    """The part of a measured phase's wall its records show the client held (Summary.
    client_wall_s): a server of known speed would have taken wall_s less this, less each
    request's own end-to-end offset (which only a calibration shows)."""
    done = [r for r in records if r.end is not None]
    if not done:
        return None
    last = max(done, key=lambda r: r.end)
    held = wall_s - last.end  # after the last answer, until the phase ended
    if spec.kind != "closed":  # requests leave when due; the last one's lag
        return max(0.0, held + max(0.0, last.sent - (last.due or 0.0)))
    mine = sorted((r for r in done if r.user == last.user), key=lambda r: r.index)
    start = last.user * spec.closed.ramp_s / spec.users if spec.users else 0.0
    held += max(0.0, mine[0].sent - start)  # its first request after its place in the ramp
    held += sum(max(0.0, b.sent - a.end - spec.closed.think_s) for a, b in zip(mine, mine[1:]))
    return max(0.0, held)


def summarize(
    records: list[RequestRecord], wall_s: float, spec: LoadSpec, warmup_s: float = 0.0, warmup_failed: int = 0
) -> Summary:
    """Per-run numbers over the measured phase: throughput, latency distributions, failures."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    failures: dict[str, int] = {}
    for r in records:
        if r.error:
            failures[r.error] = failures.get(r.error, 0) + 1
    wrong_len = sum(1 for r in ok if r.output_tokens != (r.asked_output_tokens or spec.output_tokens))
    returning = spec.kind == "sessions"  # a session's later turn: its length is what its text counts
    wrong_prompt = sum(
        1
        for r in ok
        if r.prompt_tokens is not None
        and not (returning and r.index > 0 and r.asked_prompt_tokens is None)
        and r.prompt_tokens != (r.asked_prompt_tokens or spec.prompt_tokens)
    )
    # open loop: when requests were due (sessions: when each began; its later turns follow answers)
    due = [r.due for r in records if r.due is not None and not (returning and r.index > 0)]
    mismatched = sum(1 for r in ok if r.usage_disagrees)
    carrying = sum(len(r.gaps) + 1 for r in ok if r.first_token is not None)  # chunks that carried tokens
    tpot = [t for t in (slo.tpot(r) for r in ok) if t is not None]
    per_instance = [
        InstanceLoad(
            instance=i,
            requests=sum(1 for r in records if r.url == url),
            completed=sum(1 for r in ok if r.url == url),
            output_tokens=sum(r.output_tokens or 0 for r in ok if r.url == url),
        )
        for i, url in enumerate(spec.urls)
    ]
    return Summary(
        requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        failures=failures,
        wall_s=wall_s,
        output_tokens=out_tokens,
        output_tok_s=out_tokens / wall_s if wall_s > 0 else None,
        request_s=len(ok) / wall_s if wall_s > 0 else None,
        ttft_s=distribution([r.first_token - r.sent for r in ok if r.first_token is not None]),
        itl_s=distribution([g for r in ok for g in r.gaps]),
        tpot_s=distribution(tpot),
        e2e_s=distribution([r.end - r.sent for r in ok]),
        wrong_output_length=wrong_len,
        usage_mismatch=mismatched,
        tokens_per_chunk=out_tokens / carrying if carrying else None,
        client_wall_s=client_wall(records, wall_s, spec),
        latency_outliers=len(latency_outliers(ok, spec.outlier_factor, spec.outlier_min_s)),
        wrong_prompt_length=wrong_prompt,
        warmup_s=warmup_s,
        warmup_failed=warmup_failed,
        per_instance=per_instance,
        # open loop: the rate asked for, and how late the client sent what was due
        offered_rps=(len(due) - 1) / max(due) if len(due) > 1 and max(due) > 0 else None,
        trace_skipped=spec.fitted["skipped"] if spec.fitted else None,
        trace_capped=spec.fitted["capped"] if spec.fitted else None,
        lag_s=distribution([r.sent - r.due for r in records if r.due is not None]) if due else None,
        **(_session_numbers(records) if spec.kind == "sessions" else {}),
    )


def _session_numbers(records: list[RequestRecord]) -> dict[str, Distribution]:
    """A sessions run's own numbers: the TTFT of first turns and of returning ones (a whole
    conversation to read again, or a cache to find it in), and each session's time from its first
    turn's send to its last answer (sessions answered in full)."""
    ok = [r for r in records if r.ok and r.first_token is not None]
    by: dict[int, list[RequestRecord]] = {}
    for r in records:
        by.setdefault(r.user, []).append(r)
    spans = [max(r.end for r in rs) - min(r.sent for r in rs) for rs in by.values() if all(r.ok for r in rs)]
    return {
        "ttft_first_s": distribution([r.first_token - r.sent for r in ok if r.index == 0]),
        "ttft_return_s": distribution([r.first_token - r.sent for r in ok if r.index > 0]),
        "session_s": distribution(spans),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", action="append", required=True, help="server base URL (repeat for instances)")
    p.add_argument("--model", required=True)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--prompt-words", type=int, default=64, help="prompt length in words of a synthetic vocabulary")
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests-per-user", type=int, default=2)
    p.add_argument("--dialect", default="vllm", choices=list(REQUEST_FORMATS))
    p.add_argument("--ramp-s", type=float, default=0.0, help="users join the measured phase over this many seconds")
    args = p.parse_args(argv)
    rng = random.Random(0)
    prompts = [" ".join(f"w{rng.randrange(3, 1000)}" for _ in range(args.prompt_words)) for _ in range(64)]
    spec = LoadSpec(
        urls=args.url,
        model=args.model,
        prompts=prompts,
        users=args.users,
        prompt_tokens=args.prompt_words,
        output_tokens=args.output_tokens,
        requests_per_user=args.requests_per_user,
        dialect=args.dialect,
        closed=ClosedLoopSettings(ramp_s=args.ramp_s),
    )
    summary, _ = run(spec, progress=lambda m: print(m, file=sys.stderr))
    print(summary.model_dump_json(indent=2))


if __name__ == "__main__":
    main()
