"""The load generator measured against a server of known speed (`speedsplit calibrate`): on
this host, how much time the client itself adds to TTFT, inter-token latency and end-to-end
latency, at one user and at many, and its ceiling (the highest output rate it can measure,
against a server that answers at once). The workflow runs it before the first cell; every
result records it, and every factor's interval carries the offsets.

    speedsplit calibrate [--users 1 16] [--out results/calibration.json]
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from speedsplit.core.record import Calibration
from speedsplit.core.facts import CalibrationLevel
from speedsplit.core.results import _cpu_model, write_json_atomic
from speedsplit.probes import loadgen, slo
from speedsplit.serving import reference_speed
from speedsplit.serving.lease import cpu_split
from speedsplit.serving.stacks import HOST

# The reference server the offsets are measured against: slow enough that its own timing is
# exact to the millisecond, fast enough that a calibration takes seconds.
SPEED = reference_speed.Speed(ttft_s=0.05, itl_s=0.005)
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 32
REQUESTS = 32  # measured requests per level, spread over its users
# The uncontended client once more, waiting as long for each first token as a large model's
# prefill makes it: a client idle that long may read it later (Calibration.uncontended).
LONG_WAIT = reference_speed.Speed(ttft_s=0.4, itl_s=0.005)
LONG_WAIT_REQUESTS = 8


@contextmanager
def reference_server(
    speed: reference_speed.Speed, faults: reference_speed.Faults = reference_speed.Faults(), cpus: list[int] = ()
):
    """A reference server in its own process on a free loopback port (on `cpus`, if given); its
    base URL."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "speedsplit.serving.reference", "--host", HOST, "--port", str(port)]
    proc = subprocess.Popen(
        argv + reference_speed.argv(speed, faults),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the reference server exited: {proc.stderr.read().decode()[-300:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the reference server did not answer /health within 30 s") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _load(url: str, users: int, per_user: int, output_tokens: int, warmup: int = 1) -> loadgen.LoadSpec:
    prompts = [" ".join(f"w{u}x{j}" for j in range(PROMPT_TOKENS)) for u in range(users * (per_user + warmup))]
    return loadgen.LoadSpec(
        urls=[url],
        model="reference",
        prompts=prompts,
        users=users,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=output_tokens,
        requests_per_user=per_user,
        warmup_requests=warmup,
    )


def level(url: str, users: int, speed: reference_speed.Speed = SPEED, requests: int = REQUESTS) -> CalibrationLevel:
    """The client's offsets at one number of users against a server of this speed (no cap),
    over about `requests` measured requests (two a user at least)."""
    per_user = max(2, requests // users)
    summary, records = loadgen.run(_load(url, users, per_user, OUTPUT_TOKENS))
    ok = [r for r in records if r.phase == "measured" and r.ok]
    if len(ok) < summary.requests:
        raise RuntimeError(f"calibration at {users} users: {summary.failed} requests failed ({summary.failures})")
    first, whole = speed.first_token_s(PROMPT_TOKENS), speed.service_s(PROMPT_TOKENS, OUTPUT_TOKENS)
    e2e = sorted(r.end - r.sent - whole for r in ok)
    e2e_median = statistics.median(e2e)
    # quantiles as a run's own (a p99 offset for a run's p99)
    ttft = loadgen.distribution([r.first_token - r.sent - first for r in ok])
    tpot = loadgen.distribution([slo.tpot(r) - speed.itl_s for r in ok])
    truth = reference_speed.expected(
        speed, users=users, requests_per_user=per_user, prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS
    )
    true_tok_s = sum(t.output_tokens for t in truth) / max(t.end for t in truth)
    # the gap from each measured answer's end to the same user's next request (the true one is
    # none; warm-up requests are sent apart from the users' loops)
    sent = {}
    for r in ok:
        sent.setdefault(r.user, []).append((r.sent, r.end))
    turns = [b[0] - a[1] for u in sent.values() for a, b in zip(sorted(u), sorted(u)[1:])]
    return CalibrationLevel(
        users=users,
        requests=len(ok),
        ttft_s=ttft.median,
        itl_s=statistics.fmean(g for r in ok for g in r.gaps) - speed.itl_s,
        tpot_s=tpot.median,
        e2e_s=e2e_median,
        e2e_p90_s=e2e[int(0.9 * (len(e2e) - 1))],
        ttft_p99_s=ttft.p99,
        tpot_p99_s=tpot.p99,
        throughput_error=summary.output_tok_s / true_tok_s - 1.0,
        cycle_s=e2e_median + (statistics.median(turns) if turns else 0.0),
        wait_s=first,
    )


def ceiling(url: str, users: int, output_tokens: int, per_user: int = 2) -> float:
    """Output tok/s the client measures against a server that answers at once."""
    summary, _ = loadgen.run(_load(url, users, per_user, output_tokens))
    return summary.output_tok_s


def calibrate(
    users: list[int], ceiling_users: int = 64, ceiling_tokens: int = 256, server_cpus: list[int] = ()
) -> Calibration:
    """Offsets at each number of users, at the fewest once more with a long wait for each first
    token (LONG_WAIT), then the ceiling; the offsets carried are the largest. server_cpus: the
    cores the reference server runs on (the caller's client runs where it is)."""
    with reference_server(SPEED, cpus=server_cpus) as url:
        levels = [level(url, u) for u in users]
    with reference_server(LONG_WAIT, cpus=server_cpus) as url:
        levels.append(level(url, min(users), LONG_WAIT, LONG_WAIT_REQUESTS))
    with reference_server(reference_speed.Speed(ttft_s=0.0, itl_s=0.0), cpus=server_cpus) as url:
        top = ceiling(url, ceiling_users, ceiling_tokens)
    return Calibration(
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        host_cpu=_cpu_model(),
        reference=" ".join(reference_speed.argv(SPEED)),
        levels=levels,
        ttft_s=max(0.0, *(lv.ttft_s for lv in levels)),
        itl_s=max(0.0, *(lv.itl_s for lv in levels)),
        tpot_s=max(0.0, *(lv.tpot_s for lv in levels)),
        e2e_s=max(0.0, *(lv.e2e_s for lv in levels)),
        cycle_s=max(0.0, *(lv.cycle_s for lv in levels)),
        ttft_p99_s=max(0.0, *(lv.ttft_p99_s for lv in levels)),
        tpot_p99_s=max(0.0, *(lv.tpot_p99_s for lv in levels)),
        ceiling_tok_s=top,
        ceiling_users=ceiling_users,
    )


def _ms(seconds: float | None, spec: str) -> str:
    return "not measured" if seconds is None else f"{seconds * 1e3:{spec}} ms"


def lines(c: Calibration) -> list[str]:
    """The calibration for people: one line per level, the ceiling, the offsets carried."""
    out = [f"the load generator against a server of known speed ({c.reference}), {c.host_cpu}:"]
    for lv in c.levels:
        out.append(
            f"  {lv.users:>3} users, {lv.requests} requests, first tokens {lv.waited_s * 1e3:.0f} ms away: TTFT {lv.ttft_s * 1e3:+.2f} ms, ITL "
            f"{lv.itl_s * 1e3:+.3f} ms, TPOT {lv.tpot_s * 1e3:+.3f} ms, E2E {lv.e2e_s * 1e3:+.2f} ms "
            f"(p90 {lv.e2e_p90_s * 1e3:+.2f}), cycle {_ms(lv.cycle_s, '+.2f')}, TTFT p99 "
            f"{_ms(lv.ttft_p99_s, '+.2f')}, TPOT p99 {_ms(lv.tpot_p99_s, '+.3f')}, "
            f"throughput {lv.throughput_error * 100:+.2f}%"
        )
    out.append(
        f"  ceiling: {c.ceiling_tok_s:.0f} output tok/s at {c.ceiling_users} users (a server that answers at once)"
    )
    out.append(
        f"  carried into every factor's interval: TTFT {c.ttft_s * 1e3:.2f} ms, ITL {c.itl_s * 1e3:.3f} ms, "
        f"TPOT {c.tpot_s * 1e3:.3f} ms, E2E {c.e2e_s * 1e3:.2f} ms, closed-loop cycle {_ms(c.cycle_s, '.2f')}; "
        f"into a p99's: TTFT {_ms(c.ttft_p99_s, '.2f')}, TPOT {_ms(c.tpot_p99_s, '.3f')}"
    )
    return out


def splits(config: dict) -> bool:
    """Whether a workflow's cells are measured with the CPU split (benchmark.cpu_isolation on a
    CPU), so that its calibration must be too."""
    from speedsplit.planning import config as cfgmod

    from speedsplit.planning import grid as gridmod

    cfg = cfgmod.validate(config)
    return gridmod.platform_of(cfg) == "cpu" and bool(cfg.benchmark.cpu_isolation)


def run(out: str | Path | None, users: list[int], split: bool = False) -> Calibration:
    """Calibrate, print what was found, and write it (atomically) where asked. split: as the
    cells will be measured on a CPU (benchmark.cpu_isolation), the client on its core and the
    server on the others: across cores the client read its first tokens about a millisecond
    later than sharing them (a 70 ms TTFT read +2.3-2.9% split, +1.6% shared), so the offsets are
    taken so."""
    server: list[int] = []
    if split:
        server, client = cpu_split()
        if client:
            os.sched_setaffinity(0, client)
    c = calibrate(users, server_cpus=server)
    print("\n".join(lines(c)), file=sys.stderr)
    if out:
        write_json_atomic(out, c.model_dump(mode="json"))
    return c
