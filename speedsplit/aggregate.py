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
from speedsplit.analysis import formats
from speedsplit.analysis import frames as f
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
    bandwidth_json: str | Path | None = None,
    tolerate_flags: list[str] | tuple[str, ...] = (),
) -> dict[str, pl.DataFrame]:
    """Every analysis frame from result files; refuses (ResultError) a corrupt or truncated one."""
    runs = f.runs_frame([read_result(p) for p in result_paths])
    attribution = f.attribution_frame(runs, chains, tolerate_flags)
    return {
        "runs": runs,
        "cells": f.with_mbu(f.cells_frame(runs), bandwidth_gb_s(bandwidth_json)),
        "attribution": attribution,
        "crossover": f.crossover_frame(attribution),
        "stability": f.stability_frame(attribution),
    }


def write_tables(
    result_paths: list[str | Path],
    chains: dict[str, list[str]],
    out_dir: str | Path,
    bandwidth_json: str | Path | None = None,
    tolerate_flags: list[str] | tuple[str, ...] = (),
) -> None:
    """The frames as results/tables/{name}.parquet, .csv and attribution.md."""
    frames = build_frames(result_paths, chains, bandwidth_json, tolerate_flags)
    formats.write_frames(frames, out_dir, markdown=("attribution",))


def read_tables(tables_dir: str | Path) -> dict[str, pl.DataFrame]:
    return {name: formats.read_frame(Path(tables_dir) / f"{name}.parquet") for name in TABLES}


def write_plots(tables_dir: str | Path, chains: list[str], out_dir: str | Path) -> None:
    frames = read_tables(tables_dir)
    with atomic_dir(out_dir) as tmp:
        for name, chart in plots.all_charts(frames["cells"], frames["attribution"], chains).items():
            plots.save(chart, tmp / name)


def write_report(
    out: str | Path, *, config: dict, result_paths: list[str | Path], tables_dir: str | Path, plots_dir: str | Path
) -> None:
    report.build(
        out,
        config=config,
        provenance=read_result(result_paths[0]).provenance if result_paths else None,
        svgs={p.stem: p for p in sorted(Path(plots_dir).glob("*.svg"))},
        **read_tables(tables_dir),
    )


def main(argv: list[str] | None = None) -> None:
    from speedsplit import config as cfgmod

    p = argparse.ArgumentParser(description="Tables, plots and report from result files.")
    p.add_argument("--config", action="append", default=[], help="config file(s) merged over config/config.yaml")
    p.add_argument("--results", action="append", required=True, help="glob of result files (quote it; repeatable)")
    p.add_argument("--bandwidth", default=None, help="bandwidth JSON written by the bandwidth rule")
    p.add_argument("--out", default="results", help="folder for tables/, plots/ and report.html")
    args = p.parse_args(argv)
    cfg = cfgmod.load(*args.config)
    paths = sorted({x for pattern in args.results for x in glob.glob(pattern, recursive=True) if x.endswith(".json")})
    if not paths:
        raise SystemExit(f"no result files match {' '.join(args.results)}")
    out = Path(args.out)
    write_tables(paths, cfg["chains"], out / "tables", args.bandwidth, cfg["analysis"]["tolerate_flags"])
    write_plots(out / "tables", list(cfg["chains"]), out / "plots")
    write_report(
        out / "report.html", config=cfg, result_paths=paths, tables_dir=out / "tables", plots_dir=out / "plots"
    )
    print(f"report: {(out / 'report.html').resolve()}")


if __name__ == "__main__":
    main()
