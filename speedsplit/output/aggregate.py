"""Result files -> tables -> plots -> report: the three aggregation steps the workflow's
tables, plots and report rules run, also as one command for results gathered from another
machine or a cluster:

    speedsplit aggregate --configfile config/h200-smoke.yaml --results gpu-host/results --out here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from speedsplit.analysis import answer, cost, step_time
from speedsplit.analysis import chains as ch
from speedsplit.analysis import frames as f
from speedsplit.analysis import timeline as tl
from speedsplit.analysis.calibration import calibration_frame
from speedsplit.analysis.mechanism import mechanism_frame
from speedsplit.core import formats, plausible
from speedsplit.core.errors import ConfigError
from speedsplit.core.record import read_result
from speedsplit.core.results import atomic_dir
from speedsplit.output import analyses, plots, report
from speedsplit.output.analyses import quality
from speedsplit.planning import config as cfgmod
from speedsplit.planning import grid as gridmod
from speedsplit.planning.experiment import Experiment

# The quantize rule's reports under a results folder.
QUANTIZE_REPORTS = "quantize/*/*.json"


def bandwidth_gb_s(path: str | Path | None) -> float | None:
    if not path or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text()).get("gb_s_median")


def build_frames(
    result_paths: list[str | Path],
    chains: dict[str, list[str]],
    *,
    bandwidth_json: str | Path | None = None,
    tolerate_flags: list[str] | tuple[str, ...] = (),
    link_json: str | Path | None = None,
    profile_paths: list[str | Path] = (),
    quantize_paths: list[str | Path] = (),
    steps: dict[str, list[str]] | None = None,
    headline: list[dict] = (),
    specs: dict | None = None,
) -> dict[str, pl.DataFrame]:
    """Every analysis frame from result files: the core ones, then each optional analysis's
    (speedsplit/output/analyses; `specs` by analysis name). Refuses (ResultError) a corrupt
    or truncated result. The keyword arguments after the files' are analyses.analysis_spec's."""
    results = [read_result(p) for p in result_paths]
    for res, path in zip(results, result_paths):
        if why := plausible.reasons(res):
            print(f"speedsplit: {path}: implausible, in no factor: {'; '.join(why)}", file=sys.stderr)
    runs = f.runs_frame(results)
    f.check_one_machine(runs)
    cells = f.with_mbu(f.cells_frame(runs, tolerate_flags), bandwidth_gb_s(bandwidth_json))
    by_throughput = ch.attribution_frame(runs, chains, tolerate_flags)
    attribution = answer.with_headline(answer.with_steps(by_throughput, steps or {}), list(headline))
    why = mechanism_frame(runs, chains, tolerate_flags)
    frames = {
        "runs": runs,
        "cells": cells,
        "attribution": attribution,
        "mechanism": why,
        "answer": answer.with_why(answer.sentences(attribution, chains, cells), why, attribution),
        "crossover": ch.crossover_frame(attribution),
        "stability": ch.stability_frame(attribution),
        "calibration": calibration_frame(results),
        "timeline": tl.timeline_frame(
            {(r.model, r.stack, r.topology, r.cell, r.run): Path(p) for r, p in zip(results, result_paths)},
            tl.choose(attribution, runs, chains),
        ),
    }
    basis = analyses.Basis(
        runs=runs,
        cells=cells,
        by_throughput=by_throughput,
        chains=chains,
        tolerate_flags=tuple(tolerate_flags),
        steps=steps or {},
        link_json=Path(link_json) if link_json else None,
        profile_paths=tuple(Path(p) for p in profile_paths),
        quantize_paths=tuple(Path(p) for p in quantize_paths),
        results=tuple(results),
        attribution=attribution,
    )
    frames |= analyses.build(basis, specs or {})
    said = frames["answer"]
    said = answer.beside(said, "quality", quality.by_chain(frames), ["model", "topology", "chain"])
    priced = cost.by_chain(frames["cost"], chains) if "cost" in frames else {}
    said = answer.beside(said, "cost", priced, ["chain", "model", "topology", "cell"])
    kernel_why = step_time.by_chain(frames["step_time_changes"]) if "step_time_changes" in frames else {}
    said = answer.beside(said, "why_kernels", kernel_why, ["chain", "model", "topology", "cell"])
    frames["answer"] = said
    return frames


def write_tables(result_paths: list[str | Path], out_dir: str | Path, **kwargs) -> None:
    """The frames (build_frames, same keyword arguments) as results/tables/{name}.parquet,
    .csv and attribution.md, the folder replaced whole: a table an earlier run's analyses wrote
    and this one's do not is not left for the report to read."""
    frames = build_frames(result_paths, **kwargs)
    with atomic_dir(out_dir) as tmp:
        formats.write_frames(frames, tmp, markdown=("attribution",))


def evidence_frames(folder: str | Path) -> tuple[dict[str, pl.DataFrame], Experiment]:
    """An evidence folder's tables built from its raw results as its evidence.yaml says (its
    configs named from the repository's root, two folders above it), and its config: a folder
    commits its tables as CSV only (docs/evidence/rebuild_tables.py)."""
    import yaml

    folder = Path(folder)
    how = yaml.safe_load((folder / "evidence.yaml").read_text())
    cfg = cfgmod.load(*[folder.parents[2] / c for c in how["config"]])
    frames = build_frames(
        sorted(folder.glob(how["results"])),
        bandwidth_json=folder / how["bandwidth"],
        link_json=folder / how["link"] if how.get("link") else None,
        profile_paths=sorted(folder.glob(how["profiles"])) if how.get("profiles") else [],
        quantize_paths=sorted(folder.glob(f"results/{QUANTIZE_REPORTS}")),
        **analyses.analysis_spec(cfg),
    )
    return frames, cfg


def read_tables(tables_dir: str | Path) -> dict[str, pl.DataFrame]:
    """Every table written under tables_dir, by name."""
    return {p.stem: formats.read_frame(p) for p in sorted(Path(tables_dir).glob("*.parquet"))}


def charts(frames: dict[str, pl.DataFrame], chains: list[str], kernel_reference: str | None = None) -> dict:
    """Every chart: the core ones, then each optional analysis's."""
    return plots.core_charts(frames, chains, kernel_reference) | analyses.charts(frames)


def write_plots(
    tables_dir: str | Path, chains: list[str], out_dir: str | Path, kernel_reference: str | None = None
) -> None:
    with atomic_dir(out_dir) as tmp:
        for name, chart in charts(read_tables(tables_dir), chains, kernel_reference).items():
            plots.save(chart, tmp / name)


def _link_matrix(link_json: str | Path | None) -> str | None:
    """The GPU topology matrix the link control recorded (nvidia-smi topo -m), if any."""
    if not link_json:
        return None
    data = json.loads(Path(link_json).read_text())
    return data.get("topology_matrix") or data.get("topology_matrix_absent")


def write_report(
    out: str | Path,
    *,
    config: dict,
    result_paths: list[str | Path],
    tables_dir: str | Path,
    plots_dir: str | Path,
    link_json: str | Path | None = None,
) -> None:
    frames = read_tables(tables_dir)
    report.build(
        out,
        config=config,
        provenance=read_result(result_paths[0]).provenance if result_paths else None,
        frames=frames,
        svgs={p.stem: p for p in sorted(Path(plots_dir).glob("*.svg"))},
        sections=analyses.sections(frames, {"link_matrix": _link_matrix(link_json)}),
        answers=analyses.answers(frames),
    )


def config_meets_results(config: Experiment, stacks: set[str]) -> list[str]:
    """How the config's chains meet the stacks these results hold: a line per chain missing
    some of its stacks, one for chains with none; ConfigError where no chain names any stack
    measured (the config is not the one they were measured with)."""
    measured = sorted(stacks)
    chains = config.chains
    if chains and not any(s in measured for chain in chains.values() for s in chain):
        raise ConfigError(
            f"the config's chains ({', '.join(chains)}) name none of the stacks these results hold "
            f"({', '.join(measured)}): give the config they were measured with (--configfile)"
        )
    out, unmeasured = [], []
    for name, chain in chains.items():
        missing = [s for s in chain if s not in measured]
        if len(missing) == len(chain):
            unmeasured.append(name)
        elif missing:
            out.append(f"chain {name}: no results of {', '.join(missing)}; its factors through them are undefined")
    if unmeasured:
        out.append(f"chains with no stack measured here, not in the tables: {', '.join(unmeasured)}")
    return out


def aggregate_folders(config: Experiment, folders: list[str | Path], out: str | Path) -> Path:
    """Tables, plots and report (under `out`) from the results folders of one machine, each
    holding bench/, hardware/ and profile/ as the workflow writes them; the report's path."""
    folders = [Path(x) for x in folders]
    paths = sorted({str(p) for d in folders for p in d.glob("bench/**/run*.json")})
    if not paths:
        raise SystemExit(f"speedsplit: no result files under {', '.join(f'{d}/bench' for d in folders)}")

    def first(name: str) -> Path | None:
        return next((d / name for d in folders if (d / name).is_file()), None)

    for line in config_meets_results(config, {read_result(p).stack for p in paths}):
        print(f"speedsplit: {line}", file=sys.stderr)
    out = Path(out)
    link = first("hardware/link.json")
    write_tables(
        paths,
        out / "tables",
        bandwidth_json=first("hardware/bandwidth.json"),
        link_json=link,
        profile_paths=sorted({str(p) for d in folders for p in d.glob("profile/**/*.json")}),
        quantize_paths=sorted({str(p) for d in folders for p in d.glob(QUANTIZE_REPORTS)}),
        **analyses.analysis_spec(config),
    )
    write_plots(out / "tables", list(config.chains), out / "plots", gridmod.kernel_reference(config))
    write_report(
        out / "report.html",
        config=config.filled(),
        result_paths=paths,
        tables_dir=out / "tables",
        plots_dir=out / "plots",
        link_json=link,
    )
    return out / "report.html"
