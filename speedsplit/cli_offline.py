"""`speedsplit bundle`, `host` and `pack` (speedsplit/cli.py lists them): what travels between
here and a GPU host without network: the install set, the steps it runs there, the results back.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path


def _python_version(text: str) -> str:
    """The host's Python as major.minor (its wheels' tags and its requirements' markers follow)."""
    if not re.fullmatch(r"[0-9]+\.[0-9]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version as major.minor (3.12)")
    return text


def _part_mib(text: str) -> float:
    """The largest part: a size in MiB of a byte or more (argparse says which option it was given to)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 2**-20 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in MiB above 0")
    return value


def _bundle_args(p):
    p.add_argument(
        "--requirements",
        nargs="+",
        default=["requirements/gpu.txt"],
        help="what the host must be able to run (several files: resolved together, e.g. an add-on's after the base's)",
    )
    p.add_argument("--have", metavar="FREEZE", help="the host's `pip freeze`: what it has already")
    p.add_argument("--python-version", type=_python_version, default="3.12", help="the host's Python (major.minor)")
    p.add_argument("--out", default="bundle", help="the folder to write (parts, SHA256SUMS, install.py)")
    p.add_argument("--part-mib", type=_part_mib, help="the largest part, in MiB (default 58, bundle.PART_MIB)")
    p.add_argument("--omit", metavar="FILE", help="'package: why' lines: left out on purpose (fnmatch patterns)")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR", help="wheels built elsewhere")
    p.add_argument("--lock", metavar="FILE", help="name==version pins taken where a requirement allows them")


def _bundle(args) -> int:
    from speedsplit.core.errors import UserError
    from speedsplit.offline import bundle

    named = [("--requirements", f) for f in args.requirements]
    named += [(flag, f) for flag, f in (("--have", args.have), ("--omit", args.omit), ("--lock", args.lock)) if f]
    for flag, f in named:  # one line naming the flag, before any wheel is fetched
        if not Path(f).is_file():
            raise UserError(f"{flag} {f}: no such file")
    target = bundle.Target(args.python_version, find_links=tuple(args.find_links))
    part_mib = args.part_mib or bundle.PART_MIB
    bundle.build(args.requirements, args.out, target, args.have, part_mib, args.omit, args.lock)
    return 0


def _host_args(p):
    p.add_argument("action", choices=["install", "run", "status"], help="install a bundle; run steps; how they stand")
    p.add_argument("--bundle", help="install: the bundle's folder")
    p.add_argument("--target", help="install: into this folder (put it on PYTHONPATH) instead of this Python")
    p.add_argument(
        "--rehearse", action="store_true", help="install: into --target for the bundle's Python, from another"
    )
    p.add_argument("--steps", help="run: the file whose 'steps:' to run (an evidence folder's evidence.yaml)")
    p.add_argument("--project", default=".", help="run, status: the workflow's folder (the bundle's project)")
    p.add_argument("--site", help="run: the folder the bundle was installed into (--target)")
    p.add_argument("--pack", metavar="OUT", help="status: also write the results so far to OUT/results.tar.gz")


def _host(args) -> int:
    from speedsplit.core.errors import UserError
    from speedsplit.offline import host, steps

    if args.action == "install":
        if not args.bundle:
            raise UserError("speedsplit host install needs --bundle DIR")
        try:
            host.install(args.bundle, args.target, args.rehearse)
        except host.BundleError as exc:
            raise UserError(str(exc)) from None
    elif args.action == "run":
        if not args.steps:
            raise UserError("speedsplit host run needs --steps FILE")
        steps.start(args.steps, args.project, args.site)
    else:
        print("\n".join(steps.status_lines(args.project)))
        if args.pack:
            print(f"packed: {steps.pack(args.project, args.pack)}")
    return 0


def _pack_args(p):
    p.add_argument("--results", required=True, metavar="DIR", help="a results folder to make compact (evidence)")


def _pack(args) -> int:
    from pydantic import ValidationError

    from speedsplit.core.errors import UserError
    from speedsplit.core.requestlog import pack

    if not Path(args.results).is_dir():
        raise UserError(f"no results folder at {args.results} (--results names a folder of request records)")
    found = sorted(p for p in Path(args.results).rglob("run*.requests.jsonl*") if p.suffix in (".jsonl", ".gz"))
    runs: dict[Path, list[Path]] = {}  # a run's .jsonl and .jsonl.gz would pack to one file, the last one's
    for p in found:
        runs.setdefault(p.with_name(p.name.split(".requests.")[0]), []).append(p)
    for run, forms in runs.items():
        if len(forms) > 1:
            raise UserError(f"{' and '.join(map(str, forms))} are both {run.name}'s request records: keep one")
    before = sum(p.stat().st_size for p in found)
    after = 0
    for p in found:
        try:
            after += pack(p).stat().st_size
        except ValidationError as exc:
            e = exc.errors()[0]
            at = ".".join(str(k) for k in e["loc"])
            raise UserError(f"{p} holds no request records ({at + ': ' if at else ''}{e['msg']})") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"{p} cannot be packed ({exc})") from None
    print(f"{len(found)} request files: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, every record read back equal")
    return 0


# name: (what it answers, its flags, its run), as speedsplit/cli.py's COMMANDS, which ends with them.
COMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "bundle": (
        "What must travel to a GPU host without network? (the wheels it lacks, in checked parts)",
        _bundle_args,
        _bundle,
    ),
    "host": ("On that host: install a bundle, run an evidence folder's steps, see how they stand", _host_args, _host),
    "pack": (
        "How do results travel and get committed small? (request records as columnar parquet, lossless)",
        _pack_args,
        _pack,
    ),
}
