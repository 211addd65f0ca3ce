"""The optional analyses, each declared once in a module of this folder: the tables it writes,
when the config turns it on, what its builder needs from the config, its builder, its charts
and its report section. `aggregate` builds, charts and reports by looping over `REGISTRY`.

Adding one touches three files: its frames in speedsplit/analysis/, its module here (an
`ANALYSIS` found by name, placed by `order`), and its config section in the schema. One
whose question a run asked first (traffic) also gives the report's first screen a block.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from speedsplit.planning.experiment import Experiment


@dataclass(frozen=True)
class Basis:
    """What every analysis builds from: the runs and cells, the chains' throughput factors,
    the settings the tables are built with, the files beside the results, and its own spec."""

    runs: pl.DataFrame
    cells: pl.DataFrame
    by_throughput: pl.DataFrame  # the chains' factors, before the headline is marked
    chains: dict[str, list[str]]
    tolerate_flags: tuple[str, ...] = ()
    steps: dict[str, list[str]] = field(default_factory=dict)
    link_json: Path | None = None
    profile_paths: tuple[Path, ...] = ()
    quantize_paths: tuple[Path, ...] = ()  # the quantize rule's reports
    results: tuple = ()  # the results themselves (core/record.RunResult), for what no frame holds
    attribution: pl.DataFrame | None = None  # the chains' factors, the headline marked
    spec: Any = None


@dataclass(frozen=True)
class Analysis:
    name: str
    order: int  # where its section stands in the report, among the others
    tables: tuple[str, ...]  # results/tables/{name}.* it may write
    enabled: Callable[[dict], bool]  # from the validated config: is it on?
    build: Callable[[Basis], dict[str, pl.DataFrame]]  # its tables ({} when its inputs are absent)
    spec: Callable[[dict], Any] = lambda config: None  # what its builder needs from the config (plain builtins)
    charts: Callable[[dict[str, pl.DataFrame]], dict[str, Any]] = lambda frames: {}
    section: Callable[[dict[str, pl.DataFrame], dict], str] = lambda frames, context: ""
    # its block of the report's first screen (HTML; "" when it has nothing to answer)
    answer: Callable[[dict[str, pl.DataFrame]], str] = lambda frames: ""


def times(v, lo=None, hi=None, alone: str = "") -> str:
    """A factor as an answer states it: '1.5× [1.49, 1.52]' (no interval: '1.5×' and `alone`)."""
    from speedsplit.core.formats import value_text

    if v is None:
        return "—"
    if lo is None or hi is None:  # (runs that agree exactly have an interval of no width: said as one)
        return f"{value_text(v, 3)}×{alone}"
    return f"{value_text(v, 3)}× [{value_text(lo, 3)}, {value_text(hi, 3)}]"


def answer_block(title: str, lines: list[str]) -> str:
    """An analysis's block of the report's first screen: a heading and one line per answer."""
    import html

    if not lines:
        return ""
    return f"<h3>{html.escape(title)}</h3>" + "".join(f"<p class='headline'>{html.escape(t)}</p>" for t in lines)


def html_section(title: str, note: str, *body: str) -> str:
    """A report section: its heading, what it shows and how to read it, then its tables."""
    return "\n".join([f"<h2>{title}</h2>", f"<p class='note'>{note}</p>", *body])


def _discover() -> tuple[Analysis, ...]:
    found = []
    for mod in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        found.append(module.ANALYSIS)
    return tuple(sorted(found, key=lambda a: a.order))


REGISTRY: tuple[Analysis, ...] = _discover()


def table_names(config: Experiment) -> list[str]:
    """Every table a run of this config writes: the core ones, then each enabled analysis's."""
    from speedsplit.analysis import CORE_TABLES

    return list(CORE_TABLES) + [t for a in REGISTRY if a.enabled(config) for t in a.tables]


def analysis_spec(config: Experiment) -> dict:
    """What the tables are built with (aggregate.build_frames' keyword arguments), as plain
    builtins (Snakemake params)."""
    from speedsplit.planning import grid as gridmod

    return {
        "chains": config.chains,
        "tolerate_flags": list(config.analysis.tolerate_flags),
        "steps": gridmod.chain_steps(config),
        "headline": gridmod.headline(config),
        "specs": {a.name: a.spec(config) for a in REGISTRY if a.enabled(config)},
    }


def build(basis: Basis, specs: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """Every analysis's tables: the enabled ones (in specs) and those whose inputs are given."""
    from dataclasses import replace

    frames: dict[str, pl.DataFrame] = {}
    for a in REGISTRY:
        frames |= a.build(replace(basis, spec=specs.get(a.name)))
    return frames


def charts(frames: dict[str, pl.DataFrame]) -> dict[str, Any]:
    return {name: chart for a in REGISTRY for name, chart in a.charts(frames).items()}


def sections(frames: dict[str, pl.DataFrame], context: dict) -> list[str]:
    return [html for a in REGISTRY if (html := a.section(frames, context))]


def answers(frames: dict[str, pl.DataFrame]) -> list[str]:
    """The first screen's blocks of the analyses that answer there, in their order."""
    return [html for a in REGISTRY if (html := a.answer(frames))]
