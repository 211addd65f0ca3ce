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

from speedsplit import plots, report
from speedsplit.analysis import tables as t
from speedsplit.results import atomic_dir

TABLES = ("runs", "cells", "attribution", "crossover", "stability")


def bandwidth_gb_s(path: str | Path | None) -> float | None:
    if not path or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text()).get("gb_s_median")


def write_tables(
    result_paths: list[str | Path],
    chains: dict[str, list[str]],
    out_dir: str | Path,
    bandwidth_json: str | Path | None = None,
    tolerate_flags: list[str] | tuple[str, ...] = (),
) -> dict[str, Path]:
    out_dir = Path(out_dir)
    runs = t.runs_frame(result_paths)
    cells = t.with_mbu(t.cells_frame(runs), bandwidth_gb_s(bandwidth_json))
    attribution = t.attribution_frame(runs, chains, tolerate_flags)
    paths = {name: out_dir / f"{name}.csv" for name in TABLES}
    t.write_table(runs, paths["runs"])
    t.write_table(cells, paths["cells"], parquet=out_dir / "cells.parquet")
    t.write_table(attribution, paths["attribution"], markdown=out_dir / "attribution.md")
    t.write_table(t.crossover_frame(attribution), paths["crossover"])
    t.write_table(t.stability_frame(attribution), paths["stability"])
    return paths


def write_plots(cells_csv: str | Path, attribution_csv: str | Path, chains: list[str], out_dir: str | Path) -> None:
    cells, attribution = t.read_table(cells_csv), t.read_table(attribution_csv)
    with atomic_dir(out_dir) as tmp:
        for name, chart in plots.all_charts(cells, attribution, chains).items():
            plots.save(chart, tmp / name)


def write_report(
    out: str | Path, *, config: dict, result_paths: list[str | Path], tables_dir: str | Path, plots_dir: str | Path
) -> None:
    tables_dir = Path(tables_dir)
    frames = {name: t.read_table(tables_dir / f"{name}.csv") for name in TABLES}
    report.build(
        out,
        config=config,
        result_paths=result_paths,
        svgs={p.stem: p for p in sorted(Path(plots_dir).glob("*.svg"))},
        **frames,
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
    tables = write_tables(paths, cfg["chains"], out / "tables", args.bandwidth, cfg["analysis"]["tolerate_flags"])
    write_plots(tables["cells"], tables["attribution"], list(cfg["chains"]), out / "plots")
    write_report(
        out / "report.html", config=cfg, result_paths=paths, tables_dir=out / "tables", plots_dir=out / "plots"
    )
    print(f"report: {(out / 'report.html').resolve()}")


if __name__ == "__main__":
    main()
