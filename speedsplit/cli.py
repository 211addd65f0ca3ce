"""`speedsplit <command>`: the workflow's questions that need no Snakemake run, one command.

Snakemake runs the measurements (`snakemake --cores all --resources gpu=4`); these commands
answer around it: how long a grid takes before it runs, what a run found, which runs failed
(and re-measure them), tables and report for results gathered on another machine. Flags are
named alike across commands and like Snakemake's: `--configfile` (config files merged over the
embedded default, in order) and `--results` (a workflow's results folder). The commands that
carry the workflow to a GPU host without network and its results back (bundle, host, pack) are
speedsplit/cli_offline.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

from speedsplit import cli_offline

if TYPE_CHECKING:
    from speedsplit.planning.experiment import Experiment

RESULTS_HELP = "the workflow's results folder (default: results)"


def _configfile(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--configfile",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="config file(s) merged over config/config.yaml in order, as `snakemake --configfile`",
    )


def _results(p: argparse.ArgumentParser, help: str = RESULTS_HELP) -> None:
    p.add_argument("--results", default="results", metavar="DIR", help=help)


def _results_folder(path: str) -> str:
    """A results folder that is there (else one line naming it): a command that reads one must
    not answer 'nothing failed' about a folder that does not exist."""
    from speedsplit.core.errors import UserError

    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"no results folder at {folder} (--results names the folder the workflow wrote)")
    if not (folder / "bench").is_dir() and not (folder / "tables").is_dir():
        raise UserError(f"{folder} is no results folder: it holds neither bench/ nor tables/")
    return path


def _load_config(paths: list[str]) -> Experiment:
    from speedsplit.planning import config

    return config.load(*paths)  # a ConfigError is one line (main)


# --- the commands: each adds its flags and runs; its help says what it answers ----------------


def _estimate_args(p):
    _configfile(p)
    _results(p, "take measured rates from this results folder's runs (default: results)")
    p.add_argument(
        "--platform",
        choices=["cpu", "cuda"],
        help="where the jobs will run (default: the config's platform; 'auto' asks this machine, "
        "so on a login host without GPUs price a GPU grid with --platform cuda, as profiles/slurm sets)",
    )


def _estimate(args) -> int:
    from speedsplit.planning import estimate

    config = _load_config(args.configfile)
    if args.platform:
        config.platform = args.platform
    print(
        estimate.report(
            config,
            estimate.job_estimates(
                config, f"{args.results}/bench/**/run*.json", f"{args.results}/hardware/bandwidth.json"
            ),
        )
    )
    return 0


def _aggregate_args(p):
    _configfile(p)
    p.add_argument(
        "--results",
        action="append",
        metavar="DIR",
        help="results folder(s) holding bench/, hardware/ and profile/ (repeatable; default: results)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for tables/, plots/ and report.html (default: the first --results)",
    )


def _aggregate(args) -> int:
    from speedsplit.output import aggregate

    folders = args.results or ["results"]
    out = aggregate.aggregate_folders(_load_config(args.configfile), folders, args.out or folders[0])
    print(f"report: {out.resolve()}")
    return 0


def _dollars(text: str) -> float:
    """A price: a number above 0 (argparse says which option it was given to)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a price in dollars above 0")
    return value


def _compare_args(p):
    _configfile(p)
    p.add_argument("a", metavar="A", help="the baseline: a results folder (bench/ inside) or an evidence folder")
    p.add_argument("b", metavar="B", help="the one set against it")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for tables/ and compare.html")
    for side, what in (("a", "A's"), ("b", "B's")):
        p.add_argument(
            f"--card-hour-usd-{side}",
            type=_dollars,
            metavar="USD",
            help=f"dollars an hour for one of {what} cards (else the config's analysis.cost prices both sides)",
        )


def _compare(args) -> int:
    from speedsplit.analysis import cost
    from speedsplit.output import compare

    config = _load_config(args.configfile)
    analysis = config.analysis
    spec = analysis.cost.model_dump(mode="json") if analysis.cost.priced() else None
    prices = tuple(
        cost.priced_at(usd) if usd is not None else spec for usd in (args.card_hour_usd_a, args.card_hour_usd_b)
    )
    for line in compare.compare(args.a, args.b, config.chains, args.out, tuple(analysis.tolerate_flags), prices):
        print(line)
    print(f"report: {(Path(args.out) / 'compare.html').resolve()}")
    return 0


def _failed_args(p):
    _results(p)
    p.add_argument("--flagged", action="store_true", help="also runs that carry an honesty flag")
    p.add_argument("--rerun", action="store_true", help="move them aside so that snakemake re-measures them")
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER, help="after --: snakemake's arguments for the rerun")


def _failed(args) -> int:
    from speedsplit.output import failed

    extra = args.snakemake_args
    return failed.run(
        _results_folder(args.results), args.flagged, args.rerun, extra[1:] if extra[:1] == ["--"] else extra or None
    )


def _summary_args(p):
    _results(p)


def _summary(args) -> int:
    from speedsplit.output import summary

    return 1 if summary.close_run(_results_folder(args.results)) else 0


def _check_report_args(p):
    p.add_argument("report", nargs="?", default="results/report.html", help="the report (default: results/report.html)")
    p.add_argument("--png", default=None, help="where to save the first screen")


def _check_report(args) -> int:
    from speedsplit.output import report

    return report.check_first_screen(args.report, args.png)


def _ceiling_args(p):
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--requests-per-user", type=int, default=2)
    p.add_argument(
        "--highest-measured",
        type=float,
        default=None,
        help="highest output tok/s any cell measured (default: the maximum of the results folder's cells table)",
    )
    _results(p)


def _ceiling(args) -> int:
    from speedsplit.measuring import calibrate
    from speedsplit.output.compare import highest_measured
    from speedsplit.serving.reference_speed import Speed

    highest, source = args.highest_measured, "given"
    if highest is None:
        source = f"{args.results}/tables/cells.parquet"
        highest = highest_measured(source)
    with calibrate.reference_server(Speed(ttft_s=0.0, itl_s=0.0)) as url:
        top = calibrate.ceiling(url, args.users, args.output_tokens, args.requests_per_user)
    print(f"load generator ceiling: {top:.0f} output tok/s ({args.users} users x {args.output_tokens} tokens)")
    if highest:
        print(f"highest measured cell ({source}): {highest:.0f} tok/s; ceiling / highest = {top / highest:.1f}x")
    return 0


def _calibrate_args(p):
    p.add_argument(
        "--users", type=int, nargs="+", default=[1, 16], help="numbers of users to measure at (default: 1 16)"
    )
    p.add_argument("--out", default=None, metavar="FILE", help="write the calibration here (JSON) as well")


def _calibrate(args) -> int:
    from speedsplit.measuring import calibrate

    calibrate.run(args.out, args.users)
    return 0


def _truth_args(p):
    _configfile(p)
    _results(p)
    p.add_argument("--csv", default=None, metavar="FILE", help="write the table here as well")


def _truth(args) -> int:
    from speedsplit.output import truth

    table = truth.compare_results(args.results, args.configfile)
    if table.is_empty():
        print(f"speedsplit: no run of a reference stack under {args.results}/bench", file=sys.stderr)
        return 1
    print(truth.text(table))
    if args.csv:
        table.write_csv(args.csv)
    return 0 if truth.holds(table) else 1


def _schema_args(p):
    p.add_argument(
        "--config", action="store_true", help="the config's schema (docs/config-schema.json) instead of a result's"
    )


def _schema(args) -> int:
    import json

    from speedsplit.core.record import json_schema
    from speedsplit.planning.config import load_schema

    print(json.dumps(load_schema() if args.config else json_schema(), indent=2, sort_keys=True))
    return 0


def _fidelity_args(p):
    p.add_argument("--url", required=True, help="a running vLLM server's base URL")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="the model's tokenizer folder")
    p.add_argument("--rate", type=float, required=True, help="requests per second (Poisson)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each tool, alternating")


def _fidelity(args) -> int:
    from speedsplit.probes import fidelity

    rows = fidelity.compare(
        args.url,
        args.model,
        args.tokenizer,
        args.rate,
        args.requests,
        args.prompt_tokens,
        args.output_tokens,
        args.reps,
    )
    for key, ratio in fidelity.ratios(rows).items():
        print(f"{key}: speedsplit / vllm bench serve = {ratio:.4f} (medians over {args.reps} repetitions)")
    return 0


# name: (what it answers, its flags, its run). loadgen and peakmem take their own arguments.
COMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "estimate": ("How long will this grid take, before it runs? (per job and per lane)", _estimate_args, _estimate),
    "summary": (
        "What did the last run find: the answers, the failed runs and why, the report",
        _summary_args,
        _summary,
    ),
    "failed": ("Which runs failed, and why? --rerun moves them aside and re-measures them", _failed_args, _failed),
    "aggregate": (
        "Where did the speedup come from, for results measured elsewhere? (tables, plots, report)",
        _aggregate_args,
        _aggregate,
    ),
    "compare": (
        "Did B get faster than A, and where? (two result sets side by side, ratios with intervals)",
        _compare_args,
        _compare,
    ),
    "check-report": (
        "Does the report's first screen render every figure? (headless Chromium)",
        _check_report_args,
        _check_report,
    ),
    "ceiling": ("Can the load generator drive more than the fastest cell measured?", _ceiling_args, _ceiling),
    "calibrate": (
        "How much time does the load generator add on this host? (against a server of known speed)",
        _calibrate_args,
        _calibrate,
    ),
    "truth": (
        "Did the reference stacks measure as fast as they are? (every run and factor against its truth)",
        _truth_args,
        _truth,
    ),
    "schema": ("What does a result file (or, --config, a config) hold? (its JSON Schema)", _schema_args, _schema),
    "fidelity": (
        "Does speedsplit's Poisson mode agree with `vllm bench serve --request-rate` on a server?",
        _fidelity_args,
        _fidelity,
    ),
    **cli_offline.COMMANDS,
}
PASSTHROUGH = {
    "loadgen": (
        "Drive a running OpenAI-compatible server with the workflow's load generator",
        "speedsplit.probes.loadgen",
    ),
    "peakmem": (
        "A command's time and peak memory, every process it starts: peakmem -- CMD",
        "speedsplit.probes.peakmem",
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speedsplit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="command", required=True)
    for name, (answers, add, run) in COMMANDS.items():
        c = sub.add_parser(name, help=answers, description=answers)
        add(c)
        c.set_defaults(run=run)
    for name, (answers, _) in PASSTHROUGH.items():
        sub.add_parser(name, help=answers, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    from speedsplit.core.errors import UserError, one_line

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in PASSTHROUGH:
            import importlib

            return importlib.import_module(PASSTHROUGH[argv[0]][1]).main(argv[1:]) or 0
        args = parser().parse_args(argv)
        return args.run(args)
    except UserError as exc:  # a mistake in what was given: one line naming it
        print(one_line(exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
