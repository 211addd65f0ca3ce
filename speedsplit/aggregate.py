"""Result files -> tables -> plots -> report: the three aggregation steps the workflow's
tables, plots and report rules run, also as one command for results gathered from another
machine or a cluster:

    python -m speedsplit.aggregate --config config/h200-smoke.yaml \
        --results 'results/bench/**/run*.json' --bandwidth results/hardware/bandwidth.json --out results
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import polars as pl

from speedsplit import plots, report
from speedsplit.analysis import answer, capacity, factorial, formats
from speedsplit.analysis import frames as f
from speedsplit.analysis import topology
from speedsplit.record import read_result
from speedsplit.results import atomic_dir

TABLES = formats.TABLES


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
    for name in formats.OPTIONAL_TABLES:
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


def main(argv: list[str] | None = None) -> None:
    from speedsplit import config as cfgmod

    p = argparse.ArgumentParser(description="Tables, plots and report from result files.")
    p.add_argument("--config", action="append", default=[], help="config file(s) merged over config/config.yaml")
    p.add_argument("--results", action="append", required=True, help="glob of result files (quote it; repeatable)")
    p.add_argument("--bandwidth", default=None, help="bandwidth JSON written by the bandwidth rule")
    p.add_argument("--link", default=None, help="link control JSON written by the link rule")
    p.add_argument("--profiles", default=None, help="glob of coordination profiles (results/profile/**/*.json)")
    p.add_argument("--out", default="results", help="folder for tables/, plots/ and report.html")
    args = p.parse_args(argv)
    cfg = cfgmod.load(*args.config)
    paths = sorted({x for pattern in args.results for x in glob.glob(pattern, recursive=True) if x.endswith(".json")})
    if not paths:
        raise SystemExit(f"no result files match {' '.join(args.results)}")
    out = Path(args.out)
    profiles = sorted(glob.glob(args.profiles, recursive=True)) if args.profiles else []
    try:
        write_tables(
            paths,
            out / "tables",
            bandwidth_json=args.bandwidth,
            link_json=args.link,
            profile_paths=profiles,
            **cfgmod.analysis_spec(cfg),
        )
    except f.MixedHardware as exc:
        raise SystemExit(f"speedsplit: {exc}") from None
    write_plots(out / "tables", list(cfg["chains"]), out / "plots", cfgmod.kernel_reference(cfg))
    write_report(
        out / "report.html",
        config=cfg,
        result_paths=paths,
        tables_dir=out / "tables",
        plots_dir=out / "plots",
        link_json=args.link,
    )
    print(f"report: {(out / 'report.html').resolve()}")


if __name__ == "__main__":
    main()
