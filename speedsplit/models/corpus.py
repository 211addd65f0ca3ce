"""A text every machine has without a download: the Python standard library's own sources (code,
comments, docstrings), split by file into what a model trains on and what it is scored on; for a
bigger model, the installed packages' sources beside them (`training.corpus: installed`).

The split is by a hash of each file's path, so a file is wholly in one part; which files there
are depends on the Python version, which the corpus's identity names.
"""

from __future__ import annotations

import hashlib
import platform
import site
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_EVERY = 10  # one file in ten is held out
# Folders left out: tests (much generated or repeated text), third-party packages, the IDE, the
# codec tables (long runs of hex), demos.
SKIPPED = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "encodings", "turtledemo"}


@dataclass(frozen=True)
class Corpus:
    train: str
    held_out: str
    identity: dict  # what it is made of: Python version, files and a digest of each part


def _files(root: Path) -> list[Path]:
    """The library's .py files, in an order that mixes its packages (a hash of the path) but is
    the same on every machine with the same library."""
    files = [f for f in root.rglob("*.py") if not SKIPPED & set(f.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda f: (zlib.crc32(f.relative_to(root).as_posix().encode()), f.as_posix()))


def _roots(installed: bool) -> list[Path]:
    """The standard library's folder and, installed, every folder of installed packages."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    if installed:
        found = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        roots += sorted({Path(p).resolve() for p in found if Path(p).is_dir()} - {roots[0].resolve()})
    return roots


def stdlib_corpus(train_bytes: int = 4_000_000, held_out_bytes: int = 400_000, installed: bool = False) -> Corpus:
    """Up to train_bytes of the library for training and held_out_bytes held out; installed:
    of the library and the installed packages' sources, their files mixed (a bigger model
    trained on the library alone, 8 MB on Python 3.12, learnt it by heart)."""
    roots = _roots(installed)
    parts: dict[str, list[str]] = {"train": [], "held_out": []}
    room = {"train": train_bytes, "held_out": held_out_bytes}
    counts = {"train": 0, "held_out": 0}
    files = [(f, f.relative_to(root).as_posix()) for root in roots for f in _files(root)]
    files.sort(key=lambda fr: (zlib.crc32(fr[1].encode()), fr[0].as_posix()))
    for f, rel in files:
        part = "held_out" if zlib.crc32(rel.encode()) % HELD_OUT_EVERY == 0 else "train"
        if room[part] <= 0:
            if all(v <= 0 for v in room.values()):
                break
            continue
        text = f.read_text(encoding="utf-8", errors="replace")[: room[part]]
        parts[part].append(text)
        room[part] -= len(text)
        counts[part] += 1
    train, held_out = "\n\n".join(parts["train"])[:train_bytes], "\n\n".join(parts["held_out"])[:held_out_bytes]
    if (train_bytes and not train) or (held_out_bytes and not held_out):
        raise FileNotFoundError(f"the Python standard library at {roots[0]} has no sources to train on")
    identity = {
        "corpus": "python-installed" if installed else "python-stdlib",
        "roots": [str(r) for r in roots],
        "python": platform.python_version(),
        "files": counts,
        "chars": {"train": len(train), "held_out": len(held_out)},
        "sha256": {
            "train": hashlib.sha256(train.encode()).hexdigest()[:16],
            "held_out": hashlib.sha256(held_out.encode()).hexdigest()[:16],
        },
    }
    return Corpus(train=train, held_out=held_out, identity=identity)
