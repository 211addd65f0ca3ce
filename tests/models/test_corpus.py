"""The text every machine has (models/corpus.py): the Python library's sources, split by file
into what a model trains on and what it is scored on, the same on every machine with the same
library."""

import zlib
from pathlib import Path

from speedsplit.models import corpus
from speedsplit.models.corpus import HELD_OUT_EVERY, stdlib_corpus


def test_a_file_is_wholly_in_one_part_and_the_held_out_part_is_one_file_in_ten():
    c = stdlib_corpus(train_bytes=300_000, held_out_bytes=100_000)
    assert 0 < len(c.train) <= 300_000 and 0 < len(c.held_out) <= 100_000
    assert c.identity["chars"] == {"train": len(c.train), "held_out": len(c.held_out)}
    root = Path(c.identity["roots"][0])
    # every held-out file's path hashes to the held-out tenth, and its text is not in training
    held = [f for f in corpus._files(root) if zlib.crc32(f.relative_to(root).as_posix().encode()) % HELD_OUT_EVERY == 0]
    first = held[0].read_text(encoding="utf-8", errors="replace")
    assert c.held_out.startswith(first[:2000]) and first[:2000] not in c.train
    assert c.identity["files"]["held_out"] < c.identity["files"]["train"]


def test_the_same_library_gives_the_same_text_and_its_identity_says_what_it_is():
    a, b = stdlib_corpus(50_000, 20_000), stdlib_corpus(50_000, 20_000)
    assert (a.train, a.held_out, a.identity) == (b.train, b.held_out, b.identity)
    assert a.identity["corpus"] == "python-stdlib" and len(a.identity["roots"]) == 1
    assert set(a.identity["sha256"]) == {"train", "held_out"}
    # the held-out part alone (what code prompts are cut from) reads no training text
    alone = stdlib_corpus(train_bytes=0, held_out_bytes=20_000)
    assert alone.train == "" and alone.held_out == a.held_out


def test_installed_adds_the_installed_packages_sources_beside_the_library():
    c = stdlib_corpus(200_000, 20_000, installed=True)
    assert c.identity["corpus"] == "python-installed" and len(c.identity["roots"]) > 1
    assert any(Path(r).name in ("site-packages", "dist-packages") for r in c.identity["roots"][1:])
    assert c.train != stdlib_corpus(200_000, 20_000).train  # the packages' files mixed in among the library's
