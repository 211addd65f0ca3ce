"""The grid a config measures, typed: its sampling modes (`sampling.<name>`), its cells (`grid`:
the product users x workloads x sampling, or cells named one by one) and its topologies
(`topologies.<name>`: how one measurement uses the cards). Their schema entries are generated
from these types (planning/config.load_schema); `sampling_config`, `grid_config` and
`topology_config` read a validated config's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from speedsplit.planning.typed_config import Entry, plain_schema
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


def json_schemas() -> dict[str, dict]:
    """The config schema's entries: one sampling mode, the grid (filled when absent), one topology."""
    return {
        "sampling": plain_schema(SamplingConfig),
        "grid": {**plain_schema(GridConfig), "default": {}},
        "topology": plain_schema(TopologyConfig),
    }


def sampling_config(config: dict, name: str) -> SamplingConfig:
    """A validated config's sampling mode `name`, typed."""
    return SamplingConfig.model_validate(config["sampling"][name])


def grid_config(config: dict) -> GridConfig:
    """A validated config's grid, typed."""
    return GridConfig.model_validate(config["grid"])


def topology_config(config: dict, name: str) -> TopologyConfig:
    """A validated config's topology `name`, typed."""
    return TopologyConfig.model_validate(config["topologies"][name])
