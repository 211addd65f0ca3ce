"""How the results become tables, a report and estimates, as the config says it, typed: the
analysis (`analysis`), the report's first screen (`report`) and the estimate of a grid's time
(`estimate`): `experiment.analysis`, `.report` and `.estimate` (planning/experiment.py, whose
schema is generated from these types).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speedsplit.planning.typed_config import Entry, absent, nested
from speedsplit.core.numbers import AtLeastOne, NonNegative, Positive, Share


class CardPrices(Entry):
    """US dollars an hour for one card, by platform (a CPU run: the whole host); null: not priced."""

    cpu: Positive | None = Field(None, description="A CPU run's host, dollars an hour (null: not priced).")
    cuda: Positive | None = Field(None, description="One GPU, dollars an hour (null: not priced).")


class CostConfig(Entry):
    """What an hour of the hardware costs: each stack's dollars per million tokens at every cell,
    and each step's cost factor (speedsplit/analysis/cost.py)."""

    card_hour_usd: CardPrices = nested(CardPrices, "Dollars an hour for one card, by platform; null: no cost.")
    stacks: dict[str, Positive] = Field(
        {},
        description=(
            "A stack's own dollars per card-hour where it differs from its platform's (another cloud, a reserved card)."
        ),
    )

    def priced(self) -> bool:
        return bool(self.stacks) or self.card_hour_usd.cpu is not None or self.card_hour_usd.cuda is not None


class AnalysisConfig(Entry):
    """How results become tables."""

    cost: CostConfig = nested(
        CostConfig, "Dollars per million tokens per stack and per step, from an hour's price (absent: no cost)."
    )

    tolerate_flags: list[
        Literal[
            "request_failures",
            "output_length_mismatch",
            "prompt_length_mismatch",
            "short_measurement",
            "kernel_mismatch",
            "usage_mismatch",
            "latency_outlier",
        ]
    ] = Field(
        [],
        description=(
            "Honesty flags a run may carry and still count in the attribution. By default only clean runs (status"
            " ok, no flag) make a factor; attribution.csv says per factor how many runs were used and which were "
            "left out, and why."
        ),
    )


class Headline(Entry):
    """One cell of the first screen."""

    users: int = Field(ge=1, description="Its concurrent users (a grid cell's).")
    workload: str = Field(description="Its workload (a grid cell's).")
    sampling: str | None = absent("Its sampling (absent: each of the grid's).")


class ReportConfig(Entry):
    """What the report's first screen answers."""

    headline: list[Headline] = Field(
        [],
        description=(
            "The cells the first screen decomposes, each {users, workload} (optional sampling). Empty: for each "
            "workload and sampling of the grid, the cell with the most users."
        ),
    )
    kernel_reference: str | None = Field(
        None,
        description=(
            "The FP16 stack the kernel plot sets every INT4 (gptq) stack against (plots/kernels.*, drawn where it"
            " and at least two gptq stacks were measured). null: the stack before the first gptq stack of the "
            "first chain that has one."
        ),
    )


class OutputRates(Entry):
    cpu: Positive = Field(20, description="On the cpu platform.")
    cuda: Positive = Field(1000, description="On one GPU.")


class StartupTimes(Entry):
    cpu: NonNegative = Field(90, description="On the cpu platform.")
    cuda: NonNegative = Field(200, description="On GPUs.")


class WarmStartupTimes(Entry):
    cpu: NonNegative = Field(90, description="On the cpu platform.")
    cuda: NonNegative = Field(70, description="On GPUs.")


class EstimateConfig(Entry):
    """How long a grid will take (speedsplit estimate; each bench job's Slurm runtime request). A
    job's load runs at the rate already measured for its stack, topology and cell on this
    platform where results exist, else at the decode roofline (cuda, a known model shape and
    copy bandwidth) times roofline_efficiency, else at output_tok_s; a session's first job also
    starts its server (measured start-up, else startup_s)."""

    output_tok_s: OutputRates = nested(OutputRates, "Output tokens per second of a cell with nothing better to go on.")
    startup_s: StartupTimes = nested(
        StartupTimes, "Seconds from launch to a ready server, where no result measured it."
    )
    startup_warm_s: WarmStartupTimes = nested(
        WarmStartupTimes,
        "Seconds from launch to a ready vLLM server whose compile cache an earlier session of the same model, "
        "stack and topology filled (results/cache/shared), where no result measured it (8B on one H200: 64 s "
        "warm against 109-183 s cold).",
    )
    job_overhead_s: NonNegative = Field(
        5,
        description=(
            "Seconds a job takes beyond its server's start and its load (tokenizing, warm-up set-up, writing), "
            "where no result measured it."
        ),
    )
    roofline_efficiency: Share = Field(0.5, description="Share of the decode roofline a server reaches.")
    bandwidth_gb_s: Positive | None = Field(
        None,
        description="Card memory bandwidth for the roofline; null: results/hardware/bandwidth.json where it exists.",
    )
    margin: AtLeastOne = Field(2.0, description="Factor from a job's estimate to its Slurm runtime request.")
    min_runtime_min: int = Field(
        1,
        ge=1,
        description="The smallest runtime request, in minutes (a lane asks for the sum of its jobs': keep it small).",
    )
