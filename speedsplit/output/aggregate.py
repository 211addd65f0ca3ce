"""Result files -> tables -> plots -> report: the three aggregation steps the workflow's
tables, plots and report rules run, also as one command for results gathered from another
machine or a cluster:

    speedsplit aggregate --configfile config/h200-smoke.yaml --results gpu-host/results --out here
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from speedsplit.analysis import OPTIONAL_TABLES, TABLES, answer, capacity, factorial, topology
from speedsplit.analysis import frames as f
from speedsplit.core import formats
from speedsplit.core.record import read_result
from speedsplit.core.results import atomic_dir
from speedsplit.output import plots, report
from speedsplit.planning import config as cfgmod


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
    factorial_spec: dict | None = None,
    steps: dict[str, list[str]] | None = None,
    headline: list[dict] = (),
    capacity_spec: dict | None = None,
) -> dict[str, pl.DataFrame]:
    """Every analysis frame from result files (and the link control's, if given); refuses
    (ResultError) a corrupt or truncated result. The keyword arguments after the files'
    are config.analysis_spec's."""
    runs = f.runs_frame([read_result(p) for p in result_paths])
    f.check_one_machine(runs)
    cells = f.with_mbu(f.cells_frame(runs), bandwidth_gb_s(bandwidth_json))
    by_throughput = f.attribution_frame(runs, chains, tolerate_flags)
    attribution = answer.with_headline(answer.with_steps(by_throughput, steps or {}), list(headline))
    frames = {
        "runs": runs,
        "cells": cells,
        "attribution": attribution,
        "answer": answer.sentences(attribution, chains),
        "crossover": f.crossover_frame(attribution),
        "stability": f.stability_frame(attribution),
        "topologies": topology.topology_frame(cells),
        "scaling": topology.scaling_frame(runs, tolerate_flags),
        "packing": topology.packing_frame(runs),
    }
    if link_json:
        frames["link"] = topology.link_frame(json.loads(Path(link_json).read_text()))
    if profile_paths:
        frames["coordination"] = topology.coordination_frame([json.loads(Path(p).read_text()) for p in profile_paths])
    if factorial_spec:
        frames["factorial"] = factorial.factorial_frame(runs, factorial_spec, tolerate_flags)
    if capacity_spec:
        frames["capacity"] = capacity.capacity_frame(runs, capacity_spec)
    # The chains in output tokens per joule, where NVML's energy counter was read (else no rows).
    if runs["tokens_per_joule"].drop_nulls().len():
        energy = f.attribution_frame(runs, chains, tolerate_flags, metric="tokens_per_joule")
    else:
        energy = by_throughput.clear()  # same columns, no bootstrap over chains with nothing to divide
    frames["energy"] = answer.with_steps(energy, steps or {})
    return frames


def write_tables(result_paths: list[str | Path], out_dir: str | Path, **kwargs) -> None:
    """The frames (build_frames, same keyword arguments) as results/tables/{name}.parquet,
    .csv and attribution.md."""
    formats.write_frames(build_frames(result_paths, **kwargs), out_dir, markdown=("attribution",))


def read_tables(tables_dir: str | Path) -> dict[str, pl.DataFrame]:
    """Every table of TABLES, and the optional ones (link) where they were written."""
    tables = {name: formats.read_frame(Path(tables_dir) / f"{name}.parquet") for name in TABLES}
    for name in OPTIONAL_TABLES:
        if (Path(tables_dir) / f"{name}.parquet").exists():
            tables[name] = formats.read_frame(Path(tables_dir) / f"{name}.parquet")
    return tables


def write_plots(
    tables_dir: str | Path, chains: list[str], out_dir: str | Path, kernel_reference: str | None = None
) -> None:
    frames = read_tables(tables_dir)
    with atomic_dir(out_dir) as tmp:
        charts = plots.all_charts(
            frames["cells"],
            frames["attribution"],
            chains,
            frames["topologies"],
            frames["scaling"],
            frames.get("link"),
            kernel_reference,
            frames.get("capacity"),
        )
        for name, chart in charts.items():
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
    report.build(
        out,
        config=config,
        provenance=read_result(result_paths[0]).provenance if result_paths else None,
        svgs={p.stem: p for p in sorted(Path(plots_dir).glob("*.svg"))},
        link_matrix=_link_matrix(link_json),
        **read_tables(tables_dir),
    )


def aggregate_folders(config: dict, folders: list[str | Path], out: str | Path) -> Path:
    """Tables, plots and report (under `out`) from the results folders of one machine, each
    holding bench/, hardware/ and profile/ as the workflow writes them; the report's path."""
    folders = [Path(x) for x in folders]
    paths = sorted({str(p) for d in folders for p in d.glob("bench/**/run*.json")})
    if not paths:
        raise SystemExit(f"speedsplit: no result files under {', '.join(f'{d}/bench' for d in folders)}")

    def first(name: str) -> Path | None:
        return next((d / name for d in folders if (d / name).is_file()), None)

    out = Path(out)
    link = first("hardware/link.json")
    try:
        write_tables(
            paths,
            out / "tables",
            bandwidth_json=first("hardware/bandwidth.json"),
            link_json=link,
            profile_paths=sorted({str(p) for d in folders for p in d.glob("profile/**/*.json")}),
            **cfgmod.analysis_spec(config),
        )
    except f.MixedHardware as exc:
        raise SystemExit(f"speedsplit: {exc}") from None
    write_plots(out / "tables", list(config["chains"]), out / "plots", cfgmod.kernel_reference(config))
    write_report(
        out / "report.html",
        config=config,
        result_paths=paths,
        tables_dir=out / "tables",
        plots_dir=out / "plots",
        link_json=link,
    )
    return out / "report.html"
