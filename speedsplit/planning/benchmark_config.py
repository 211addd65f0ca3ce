"""The config's `benchmark` section (how each benchmark job measures), typed: a key, its type,
its default and its description live here only (the config schema's entry is generated from
the experiment, planning/experiment.py); a validated experiment's is `experiment.benchmark`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from speedsplit.planning.typed_config import Entry
from speedsplit.core.numbers import AboveOne, AtLeastOne, NonNegative, Positive


class BenchmarkConfig(Entry):
    """How each benchmark job measures."""

    models: list[str] = Field([], description="Models to benchmark (empty: every model).")
    stacks: list[str] = Field([], description="Stacks to benchmark (empty: every stack of every chain).")
    topologies: list[str] = Field(["tp1"], description="Topologies to benchmark.")
    server_reuse: Literal["per_run", "per_stack", "per_cell"] = Field(
        "per_run",
        description=(
            "per_run: one server per (model, stack, topology, run index) measures every cell of that run in "
            "turn, so repeated runs see independent server starts; per_stack: one server measures every cell "
            "and run of a (model, stack, topology); per_cell: every cell run starts its own server."
        ),
    )
    warmup: Literal["every_cell", "session_start"] = Field(
        "every_cell",
        description=(
            "every_cell: each cell run sends its workload's warm-up requests first; session_start: only a "
            "server session's first cell does (the later ones find the server warm and record warmup_requests "
            "0), which saves a full pass per cell on slow stacks."
        ),
    )
    telemetry_s: Positive = Field(
        0.5,
        description=(
            "Seconds between readings of the servers' /metrics and of NVML while a cell's load runs; cut to "
            "the measured phase, they become the result's telemetry."
        ),
    )
    cpu_isolation: bool = Field(
        True,
        description=(
            "On cuda, each card's servers, and the client of the cells they serve, run on their own share of "
            "the host's cores (the cores the workflow may use, split evenly over the visible cards in order; "
            "a server on k cards gets k shares), so two lanes never compete for a core. On a CPU (two cores "
            "or more), the load generator runs on the first core the workflow may use and the server on the "
            "rest (its threads sized to them: {server_cpu_count}, {server_cpus} in a stack's env), so neither "
            "takes the other's. false: every process may use every core."
        ),
    )
    idle_timeout_s: AtLeastOne = Field(120, description="A server no cell job has used for this long is stopped.")
    foreign_idle_s: NonNegative = Field(
        60,
        description=(
            "A session waiting for cards that another workflow's idle servers hold stops them once no cell "
            "has used them for this long (this workflow's own idle servers it stops at once). Between two "
            "cells a session sits idle for seconds: stopping it there made two workflows on one host stop "
            "each other's servers cell after cell. So workflows take the cards in turns of whole sessions, a "
            "stalled one gives them up, and the waiting job says on the terminal who holds them."
        ),
    )
    api_key: bool = Field(
        False,
        description=(
            "Each session's servers demand an API key drawn for that session (through the stack's "
            "api_key_env), so no other user of the host can send them requests during a run; the result "
            "records whether each server refused a request without it. A stack whose engine has no key option "
            "(api_key_env null) runs without one, and its result says so. Changes no measurement: no cell "
            "reruns when it is turned on or off."
        ),
    )
    lease_timeout_s: AtLeastOne = Field(
        3600,
        description=("Seconds a job waits for its GPUs before it records a failed start."),
    )
    request_timeout_s: AtLeastOne = Field(600, description="Seconds one request may take.")
    max_client_lag_s: Positive = Field(
        0.1,
        description=(
            "Open-loop cells: when the p99 of how late the load generator sent requests after they were due "
            "exceeds this, the run is flagged client_lag and counts in no factor (the server was not offered "
            "the rate asked for)."
        ),
    )
    stall_timeout_s: AtLeastOne = Field(120, description="Seconds without a token before a request counts as stalled.")
    cpu_lanes: int = Field(
        1,
        ge=1,
        description=(
            "On the cpu platform, how many server sessions measure at once (give as many with --resources "
            "gpu=N). 1: vLLM's and transformers' CPU servers each want every core. A server that barely "
            "computes, such as the reference stacks of known speed, can share."
        ),
    )
    calibration_users: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 16],
        min_length=1,
        description=(
            "The numbers of users the client's calibration measures at (rule calibrate, before the first "
            "cell, against the reference server of known speed): the largest offsets found are carried into "
            "every factor's interval."
        ),
    )
    outlier_factor: AboveOne = Field(
        5.0,
        description=(
            "A completed request whose end-to-end latency is above this many times what its length predicts "
            "(its run's median TTFT + its output tokens x the run's median TPOT), and at least outlier_min_s "
            "above it, is a latency outlier: a stall too short for stall_timeout_s. Its run is flagged "
            "latency_outlier and counts in no factor. On every committed H200 run the slowest request took at "
            "most 2.5 times its prediction."
        ),
    )
    outlier_min_s: NonNegative = Field(
        1.0,
        description=("How many seconds above its prediction a latency outlier must be (see outlier_factor)."),
    )
    min_measured_s: NonNegative = Field(1.0, description="A measured phase shorter than this is flagged.")
    fail_on_undecomposed: bool = Field(
        True,
        description=(
            "A run whose chains could not all be decomposed at their headline cells ends with a non-zero exit "
            "code (after its summary and report); false accepts such a run."
        ),
    )
