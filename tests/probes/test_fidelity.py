"""The fidelity check's arithmetic, and that this vLLM's benchmark takes the arguments it is given
(`speedsplit fidelity` itself was run against vLLM's CPU server: see docs/how-it-works.md, "Traffic")."""

import pytest

from speedsplit.probes import fidelity


def test_ratios_are_speedsplits_median_over_vllms():
    rows = [
        {"tool": "speedsplit", "request_rate": r, "ttft_median_ms": t, "tpot_median_ms": 2 * t}
        for r, t in ((4.0, 10.0), (4.2, 12.0), (3.8, 11.0))
    ] + [
        {"tool": "vllm bench serve", "request_rate": r, "ttft_median_ms": t, "tpot_median_ms": t}
        for r, t in ((4.0, 10.0), (4.4, 10.0), (3.9, 12.0))
    ]
    assert fidelity.ratios(rows) == pytest.approx({"request_rate": 1.0, "ttft_median_ms": 1.1, "tpot_median_ms": 2.2})


@pytest.mark.slow
def test_vllms_benchmark_takes_the_arguments(tmp_path):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser()
    add_cli_args(p)
    args = p.parse_args(fidelity.vllm_bench_args("http://127.0.0.1:1", "m", tmp_path, 4.0, 200, 512, 256, 0, tmp_path))
    assert (args.request_rate, args.num_prompts, args.random_input_len, args.random_output_len) == (4.0, 200, 512, 256)
    assert args.ignore_eos and args.dataset_name == "random" and args.save_result


@pytest.mark.slow
def test_speedsplit_sends_on_the_arrival_times_vllms_benchmark_draws_for_the_seed(monkeypatch):
    """vLLM's own get_request, run on a clock that only its sleeps advance, after the
    np.random.seed(seed) its main() does: the sends it makes are the times vllm_arrivals gives
    speedsplit's load generator for the same rate, count and seed."""
    import asyncio

    import numpy as np
    from vllm.benchmarks import serve

    clock = [1000.0]

    async def sleep(s):
        clock[0] += s

    monkeypatch.setattr(serve.time, "time", lambda: clock[0])
    monkeypatch.setattr(serve.asyncio, "sleep", sleep)

    async def sends(rate, n):
        out = []
        async for _ in serve.get_request(list(range(n)), rate):
            out.append(clock[0] - 1000.0)
        return out

    for seed, rate, n in ((0, 8.0, 150), (2, 24.0, 40)):
        clock[0] = 1000.0
        np.random.seed(seed)
        theirs = asyncio.run(sends(rate, n))
        assert fidelity.vllm_arrivals(rate, n, seed) == pytest.approx(theirs, abs=1e-9)
        assert theirs[-1] == pytest.approx(n / rate)
