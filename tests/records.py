"""Complete result records with numbers chosen by a test (analysis tests read them as the
workflow would)."""

from speedsplit.core.record import (
    Distribution,
    EngineFacts,
    Provenance,
    RunResult,
    RecordedJob,
    ServerFacts,
    Summary,
    to_json,
)
from speedsplit.core.specs import CellParams, StackSpec
from speedsplit.core.facts import Hardware
from speedsplit.core.results import write_json_atomic


def stack_spec(**changes) -> StackSpec:
    """A CPU stack of the tiny model with these fields changed."""
    base = dict(
        stack="s", model="tiny", topology="tp1", platform="cpu", variant="fp16", args=["{python}"],
        dtype="float16", max_model_len=64,
    )  # fmt: skip
    return StackSpec(**{**base, **changes})


def cell_spec(**changes) -> CellParams:
    """A closed-loop cell at 8 users with these fields changed."""
    base = dict(
        cell="u8-wide-greedy", workload="wide", sampling="greedy", users=8, prompt_tokens=8, output_tokens=16,
        requests_per_user=2, warmup_requests=1, temperature=0.0, top_p=1.0, seed=0, min_measured_s=0.0,
    )  # fmt: skip
    return CellParams(**{**base, **changes})


def fake_result(
    stack,
    users,
    run,
    tok_s,
    status="ok",
    workload="wide",
    flags=(),
    topology="tp1",
    tp=1,
    instances=1,
    sampling="greedy",
    arrival=None,
) -> RunResult:
    dist = Distribution(mean=0.1, median=0.1, p90=0.2, p99=0.3)
    measured = status == "ok"
    return RunResult(
        model="tiny",
        stack=stack,
        topology=topology,
        cell=f"u{users}-{workload}-{sampling}",
        run=run,
        status=status,
        flags=list(flags),
        job=RecordedJob(
            stack=stack_spec(
                stack=stack,
                topology=topology,
                variant="gptq" if "marlin" in stack else "fp16",
                dialect="transformers" if stack.startswith("hf") else "vllm",
                dtype="bfloat16",
                tensor_parallel=tp,
                instances=instances,
                expect_kernel="CPUWNA16" if "marlin" in stack else "",
            ),
            cell=CellParams(
                cell=f"u{users}-{workload}-{sampling}",
                workload=workload,
                sampling=sampling,
                users=users,
                arrival=arrival,  # an open loop's (users 0)
                prompt_tokens=8,
                output_tokens=16,
                requests_per_user=2,
                warmup_requests=1,
                temperature=0.0,
                top_p=1.0,
                seed=0,
                request_timeout_s=60.0,
                stall_timeout_s=30.0,
                min_measured_s=1.0,
            ),
            run=run,
        ),
        session_key=f"tiny/{stack}/{topology}/all",
        summary=Summary(
            requests=4,
            completed=4,
            failed=0,
            failures={},
            wall_s=2.0,
            # as a measurement makes them (core/plausible.py): the tokens the rate fits in 2 s
            output_tokens=round(tok_s * 2.0) if tok_s and tok_s > 0 else 64,
            output_tok_s=tok_s,
            request_s=2.0,
            ttft_s=dist,
            itl_s=dist,
            tpot_s=dist,
            e2e_s=dist,
            wrong_output_length=0,
            wrong_prompt_length=0,
            warmup_s=0.5,
            warmup_failed=0,
        )
        if measured
        else None,
        server=ServerFacts(
            startup_s=10.0,
            lease_wait_s=0.0,
            devices=["cpu"],
            argv="python -m server",
            model_id="tiny",
            error=None if measured else f"the server {status}",
            log_tail=None,
            exit_code=None,
            wide_listeners=[],
            reused=run > 0,
            cells_before=run,
        ),
        engine=EngineFacts(linear_kernel="CPUWNA16LinearKernel" if "marlin" in stack else None),
        kernel_ok=True if "marlin" in stack else None,
        started="2026-11-30T00:00:00+00:00",
        finished="2026-11-30T00:00:05+00:00",
        provenance=Provenance(
            versions={}, python="3.11", workflow_commit="abc", hardware=Hardware(host_cpu="Test CPU", cpu_count=2)
        ),
    )


def write_result(path, res: RunResult):
    write_json_atomic(path, to_json(res))
    return path


def with_wall(res: RunResult, wall_s: float) -> RunResult:
    """The run measured over wall_s seconds, its counts what its rates make in that time (as a
    measurement writes them: speedsplit/core/plausible.py)."""
    s = res.summary
    s.wall_s = wall_s
    s.output_tokens = round((s.output_tok_s or 0) * wall_s)
    s.request_s = s.completed / wall_s
    return res
