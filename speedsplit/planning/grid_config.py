"""The grid a config measures, typed: its sampling modes (`sampling.<name>`), its cells (`grid`:
the product users x workloads x sampling, or cells named one by one) and its topologies
(`topologies.<name>`: how one measurement uses the cards). A validated experiment's are
`experiment.sampling[name]`, `experiment.grid` and `experiment.topologies[name]`
(planning/experiment.py, whose schema is generated from these types).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from speedsplit.planning.typed_config import Entry
from speedsplit.core.numbers import NonNegative, Share


class SamplingConfig(Entry):
    """One sampling mode."""

    temperature: NonNegative = Field(0, description="0 is greedy.")
    top_p: Share = Field(1, description="Nucleus mass.")
    seed: int = Field(
        0,
        description="Base seed. Request k of run r (k counts warm-ups first, then each user's requests in order) "
        "uses seed + 100003 r + k: the same request gets the same seed on every stack.",
    )


class CellEntry(Entry):
    """One cell."""

    users: int = Field(ge=1, description="Concurrent users.")
    workload: str = Field(description="Workload name.")
    sampling: str = Field("greedy", description="Sampling name.")
    stacks: list[str] = Field([], description="Only these stacks measure the cell (empty: every benchmarked stack).")


class GridConfig(Entry):
    """The benchmark cells are the product users x workloads x sampling."""

    users: list[Annotated[int, Field(ge=1)]] = Field([1], min_length=1, description="Concurrent users (closed loop).")
    workloads: list[str] = Field([], description="Workload names (empty: all).")
    sampling: list[str] = Field([], description="Sampling names (empty: all).")
    runs: int = Field(3, ge=1, description="Repeated runs of every cell.")
    cells: list[CellEntry] = Field(
        [], description="Explicit cells instead of the product (each names users, workload and sampling)."
    )


class TopologyConfig(Entry):
    """One topology."""

    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size of each instance.")
    instances: int = Field(1, ge=1, description="Independent instances; user u is served by instance u mod instances.")
    stacks: list[str] = Field([], description="Stacks measured in this topology (empty: all benchmarked stacks).")
