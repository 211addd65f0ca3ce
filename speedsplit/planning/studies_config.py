"""The studies beside the grid a config may ask for, typed: the capacity sweep (`capacity`), the
latency objectives every run is judged by (`slo`), the factorial of the study's confounds
(`factorial`), where tensor parallelism loses time (`coordination`), the interconnect control
(`link_control`) and why a step is worth what it is, kernel by kernel (`mechanism`): a validated
experiment's `experiment.capacity`, `.slo`, ... (planning/experiment.py, whose schema is
generated from these types).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from speedsplit.planning.typed_config import Entry, absent, nested
from speedsplit.core.numbers import Positive


class CapacityConfig(Entry):
    """The capacity sweep: a ladder of concurrent users (closed loop) or of request rates (an
    open-loop workload: rates) at one workload and sampling, each level a cell (and a job) of
    its own, judged by the objectives (slo) and failed requests. Levels above stop_after
    consecutive failing levels are not measured: their results say skipped, and why.
    tables/capacity.* gives each stack's sustainable users or rate (the largest passing level),
    the first failing level and why, and its ratio to the reference stack."""

    enabled: bool = Field(False, description="Run the sweep (its cells are jobs beside the grid's).")
    users: list[Annotated[int, Field(ge=1)]] = Field(
        [16, 32, 64, 96, 128, 192, 256, 384, 512],
        min_length=1,
        description="The ladder's concurrent users, one level each (a closed-loop workload).",
    )
    rates: list[Positive] | None = absent(
        "The ladder's request rates (requests/s) when the capacity workload is open loop (it has an arrival):"
        " each level a cell r{rate}-{workload}-{sampling}; users then does not apply. Required for an "
        "open-loop workload.",
        min_length=1,
    )
    workload: str | None = Field(None, description="null: the grid's first cell's workload.")
    sampling: str = Field("greedy", description="The sampling of every level.")
    stacks: list[str] = Field([], description="Stacks that sweep (empty: every benchmarked stack).")
    runs: int = Field(1, ge=1, description="Runs per level (at most grid.runs).")
    stop_after: int = Field(
        2, ge=1, description="After this many consecutive failing levels the levels above are skipped, not measured."
    )
    reference: str | None = Field(
        None, description="The stack capacities are set against (null: report.kernel_reference's rule)."
    )


class SloConfig(Entry):
    """Latency objectives every run is judged against (result's slo; goodput = requests that met
    them per second). Defaults: MLPerf Inference's Llama-3.1-8B server scenario."""

    ttft_p99_s: Positive = Field(2.0, description="p99 time to first token at most this.")
    tpot_p99_s: Positive = Field(0.1, description="p99 time per output token at most this.")


class FactorialConfig(Entry):
    """The confounds of an "operational" speedup, separated (tables/factorial.*): the runtime
    factor (fast over an HF reference) at two batch ceilings of the reference (two stacks, low
    and high) x two sampling modes (the first is the matched one), at one users x workload; main
    effects and interaction on the log scale, and the operational number (fast at the matched
    mode over the low ceiling at the other) as matched x batch ceiling x sampling, each with a
    95% t interval over runs. The grid must hold those cells."""

    enabled: bool = Field(False, description="Build tables/factorial.* (from the grid's cells; it measures nothing).")
    users: int = Field(64, ge=1, description="The concurrent users of its cells.")
    workload: str | None = Field(None, description="null: the grid's first cell's workload.")
    fast: str = Field("vllm-fp16", description="The fast stack every runtime factor sets over an HF reference.")
    low: str = Field("hf-generate", description="The HF reference at the low batch ceiling (the study's 8).")
    high: str = Field("hf-generate-b64", description="The HF reference at the high batch ceiling (the users).")
    sampling: list[str] = Field(
        ["greedy", "ancestral"],
        min_length=2,
        max_length=2,
        description="The two sampling modes: the matched one first, then the one the operational number's "
        "reference used.",
    )


class CoordinationConfig(Entry):
    """Where tensor parallelism loses time (rule profile): for each topology listed, a server of
    its own is profiled over `iterations` steady decode steps of one cell (vLLM's torch
    profiler) and the time per step is split into compute, communication, copies and idle gaps;
    tables/coordination.* sets each tp{k} against tp1 (shortfall vs ideal scaling)."""

    enabled: bool = Field(False, description="Run rule profile for each topology listed.")
    stack: str = Field("vllm-fp16", description="A vLLM stack (the profiler endpoints are vLLM's).")
    topologies: list[str] = Field(["tp1"], description="Single-instance topologies to profile (tp1 and tp{k}).")
    cell: str | None = Field(None, description="Cell name (e.g. u64-h200-wide-greedy); null: the grid's first cell.")
    delay_iterations: int = Field(16, ge=0, description="Engine steps skipped after the load starts (the prefill).")
    iterations: int = Field(32, ge=1, description="Decode steps recorded.")


class LinkControlConfig(Entry):
    """The interconnect control (rule link, no server): all-reduce latency and bus bandwidth
    between each pair of `gpus` cards, with peer-to-peer on and off, from one decode step's
    activation (users x hidden x 2 bytes) up to max_mib. On the cpu platform: two host processes
    over gloo."""

    enabled: bool = Field(False, description="Run it (results/hardware/link.json and tables/link.*).")
    gpus: int = Field(2, ge=2, description="Cards the job leases; every pair of them is measured.")
    max_mib: int = Field(256, ge=1, description="Largest payload in MiB.")


class ProfileConfig(Entry):
    """Why a step's decode is faster, kernel by kernel: at each cell named, run 0 of every vLLM
    stack profiled (or those in `stacks`) ends with a window of decode steps under vLLM's torch
    profiler (one request per user, on the server that measured the cell, armed at its start),
    each step's time split into dense GEMM, quantized GEMM (with its dequantisation),
    attention, communication, other kernels, copies and GPU idle (tables/step_time.*); a chain
    step's change of step time is split into those classes (tables/step_time_changes.*)."""

    cells: list[str] = Field([], description="Cells whose run 0 is profiled (empty: none).")
    stacks: list[str] | None = absent("The vLLM stacks profiled (absent: every vLLM stack benchmarked).")
    delay_iterations: int = Field(16, ge=0, description="Engine steps skipped once the load starts (the prefill).")
    iterations: int = Field(32, ge=1, description="Engine steps recorded.")


class MechanismConfig(Entry):
    """Why each step is worth what it is, beyond what the client and the engine's counters tell
    (those come with every run): the kernel level (`profile`)."""

    profile: ProfileConfig = nested(ProfileConfig, ProfileConfig.__doc__)


SECTIONS = {
    "capacity": CapacityConfig,
    "slo": SloConfig,
    "factorial": FactorialConfig,
    "coordination": CoordinationConfig,
    "link_control": LinkControlConfig,
    "mechanism": MechanismConfig,
}
