"""What one cell run sends: its prompts (the same on every stack), and for an open-loop or
trace cell its schedule, as the load generator's LoadSpec (by its kind of load: _RUN_LOAD).
"""

from __future__ import annotations

import zlib
from pathlib import Path

from speedsplit.core.loads import ClosedLoop, OpenLoop, TraceReplay
from speedsplit.core.record import CellParams
from speedsplit.core.specs import StackSpec
from speedsplit.models.prompts import block_prompts, load_tokenizer, prompts_of
from speedsplit.probes import loadgen


def build_prompts(tokenizer_dir: str | Path, n: int, prompt_tokens: int, seed: int) -> list[str]:
    """n distinct prompts of exactly prompt_tokens tokens, the same for every stack."""
    return prompts_of(tokenizer_dir, [prompt_tokens] * n, seed)


def prompt_seed(cell: CellParams, run: int) -> int:
    """Prompts differ between cells and runs (a server measures several, and a repeated prompt
    is served from its prefix cache) and are the same for every stack."""
    return cell.seed + zlib.crc32(f"{cell.cell}/run{run}".encode())


def cell_load(
    state: dict,
    stack: StackSpec,
    cell: CellParams,
    run: int,
    tokenizer_dir,
    requests_per_user: int | None = None,
    warmup_requests: int | None = None,
) -> loadgen.LoadSpec:
    """The load of one cell run on a ready session (its URLs and model id in state), with the
    cell's own request counts unless others are given; prompts are the run's own."""
    per_user = cell.requests_per_user if requests_per_user is None else requests_per_user
    warmup = cell.warmup_requests if warmup_requests is None else warmup_requests
    load = cell.load
    run_load = _RUN_LOAD[type(load)]
    prompts, schedule, fitted = run_load(load, cell, stack, tokenizer_dir, per_user, warmup, prompt_seed(cell, run))
    return loadgen.LoadSpec(
        urls=state["urls"],
        model=state["model_id"],
        prompts=prompts,
        users=cell.users or 1,
        prompt_tokens=cell.prompt_tokens,
        output_tokens=cell.output_tokens,
        requests_per_user=per_user,
        warmup_requests=warmup,
        temperature=cell.temperature,
        top_p=cell.top_p,
        seed=cell.seed + 100003 * run,
        dialect=stack.dialect,
        keep_alive=stack.keep_alive,
        request_timeout_s=cell.request_timeout_s,
        stall_timeout_s=cell.stall_timeout_s,
        outlier_factor=cell.outlier_factor,
        outlier_min_s=cell.outlier_min_s,
        closed=cell.closed,
        schedule=schedule,
        fitted=fitted,
    )


def _closed_loop(
    load: ClosedLoop, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """Each user's warm-up and measured requests, a prompt of the cell's length each."""
    return build_prompts(tokenizer_dir, load.users * (per_user + warmup), cell.prompt_tokens, seed), None, None


def _open_loop(
    load: OpenLoop, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """The schedule, then one warm-up user; prompts of their own lengths (with a shared prefix:
    one system prompt, block 0, opens every measured prompt)."""
    from speedsplit.probes import traffic

    mix = load.lengths or {}
    schedule = traffic.schedule(load.arrival, mix, cell.prompt_tokens, cell.output_tokens, seed, stack.max_model_len)
    if mix.get("shared_prefix_tokens"):
        prompts = _warmup_then_blocks(
            tokenizer_dir, cell, warmup, seed, [(a.prompt_tokens, (0,)) for a in schedule], mix["shared_prefix_tokens"]
        )
    else:
        lengths = [cell.prompt_tokens] * warmup + [a.prompt_tokens for a in schedule]
        prompts = prompts_of(tokenizer_dir, lengths, seed)
    return prompts, schedule, None


def _trace_replay(
    load: TraceReplay, cell: CellParams, stack: StackSpec, tokenizer_dir, per_user: int, warmup: int, seed: int
):
    """A trace window: its arrivals, prompts made of its shared blocks."""
    from speedsplit.probes import traffic

    window = traffic.TraceWindow(**load.trace)
    schedule, fitted = traffic.read_trace(window, stack.max_model_len)
    block = max(1, round(window.block_tokens * window.length_scale))
    prompts = _warmup_then_blocks(
        tokenizer_dir, cell, warmup, seed, [(a.prompt_tokens, a.blocks) for a in schedule], block
    )
    return prompts, schedule, fitted


def _warmup_then_blocks(tokenizer_dir, cell: CellParams, warmup: int, seed: int, pairs: list, block: int) -> list[str]:
    """The warm-up's prompts at the cell's length, then measured prompts made of shared blocks."""
    return prompts_of(tokenizer_dir, [cell.prompt_tokens] * warmup, seed) + block_prompts(
        load_tokenizer(tokenizer_dir), pairs, block, seed
    )


# A cell's prompts, schedule (open loop) and what a trace window fitted, by its kind of load.
_RUN_LOAD = {ClosedLoop: _closed_loop, OpenLoop: _open_loop, TraceReplay: _trace_replay}
