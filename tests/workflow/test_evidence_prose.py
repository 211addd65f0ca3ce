"""The figures an evidence README quotes from its tables are the figures its tables hold.

Every README under docs/evidence/<folder>/ is read against the CSVs in that folder's tables/,
every docs/comparisons/<folder>/README.md against its tables/. A README is read in units, each
markdown table row alone and otherwise each paragraph; a unit that names another evidence or
comparison folder (`../h200-2026-11-30-chain/`, `docs/evidence/...`, `../comparisons/...`) is
read against that folder's tables too, and a table row against those its table's caption (the
paragraph just before the table) names. docs/evidence/README.md, the index, has no tables of its
own: each unit is read against the folders it names (every folder's where it names none).
Two kinds of figure are checked:

(a) a value with its interval, written `1.39× [1.37, 1.41]`, `1.39x [1.37, 1.41]`, `B/A 1.03
    [1.01, 1.06]`, `6,275 [5,815, 6,771]` or, across a markdown table's columns, `8.08 | [5.72,
    13.5]`: some row of some table must hold a triple that rounds to all three printed numbers.
    The triples: (value, lo, hi), (b_over_a, lo, hi), (vs_reference, lo, hi), (log_share,
    share_lo, share_hi), and (X, X_lo, X_hi) for every column X with _lo and _hi companions
    (cells.csv's metrics, efficiency, ...).
(b) a bare factor, a number written immediately before × or x and then a character that is not
    a letter or digit (`2.63×`, `1.5×.`, `0.54x,`): some numeric cell of some table must round
    to it. Topology and size tokens are not factors: `2x1`, `4x1`, `h200x2`, `x2-conversation`
    and `512 x 256` (a space before the x) do not match.

Rounding: a number printed with k decimals matches a table value v where |v - printed| <=
0.5 * 10^-k (plus a tiny epsilon); thousands separators are dropped (`8,732` is 8732).

Exempt: figures that do not come from the tables (a quoted log line, a probe's output) are
kept out of the check by putting them in a fenced code block, in an inline code span, or on a
blockquote line starting with `> `. A ratio a README works out itself from two figures (one
KV cache's tokens over another's, a table value over an external reference) is not a table's
factor and is written in words ("2.28 times"), so × and x mark the tables' factors only.
Percentages, seconds and other units are not checked.
"""

from __future__ import annotations

import csv
import math
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO

EVIDENCE = REPO / "docs/evidence"
COMPARISONS = REPO / "docs/comparisons"
FOLDERS = sorted(p for p in EVIDENCE.iterdir() if p.is_dir()) + sorted(p for p in COMPARISONS.iterdir() if p.is_dir())

NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# a value, an optional × or x, an optional markdown column break, and [lo, hi]
INTERVAL = re.compile(rf"(?<![\w.,/])({NUM})(?:\s?[×x])?(?:\s?\|)?\s?\[({NUM}),\s?({NUM})\]")
# a number immediately followed by × or x and then no letter or digit
FACTOR = re.compile(rf"(?<![\w.,/])({NUM})[×x](?!\w)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
TRIPLES = (("value", "lo", "hi"), ("b_over_a", "lo", "hi"), ("vs_reference", "lo", "hi"))
TRIPLES += (("log_share", "share_lo", "share_hi"),)


@dataclass
class Tables:
    """Every numeric cell of a folder's tables, sorted, and every (value, lo, hi)-like triple."""

    values: list[float] = field(default_factory=list)
    triples: list[tuple[float, float, float]] = field(default_factory=list)

    def add(self, other: Tables) -> None:
        self.values = sorted(self.values + other.values)
        self.triples += other.triples


def number(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def read_tables(folder: Path) -> Tables:
    t = Tables()
    for path in sorted((folder / "tables").glob("*.csv")):
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            triples = [tr for tr in TRIPLES if all(c in cols for c in tr)]
            triples += [(c, f"{c}_lo", f"{c}_hi") for c in cols if f"{c}_lo" in cols and f"{c}_hi" in cols]
            for row in reader:
                t.values += [v for v in map(number, row.values()) if isinstance(v, float)]
                for tr in triples:
                    vals = [number(row[c] or "") for c in tr]
                    if all(v is not None for v in vals):
                        t.triples.append(tuple(vals))
    t.values.sort()
    return t


def printed(text: str) -> tuple[float, float]:
    """A printed number and half its last digit's place."""
    text = text.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return float(text), 0.5 * 10.0**-decimals


def rounds_to(v: float, text: str) -> bool:
    p, half = printed(text)
    return abs(v - p) <= half + 1e-9 * max(1.0, abs(p))


def in_values(values: list[float], text: str) -> bool:
    p, half = printed(text)
    i = bisect_left(values, p - half - 1e-9 * max(1.0, abs(p)))
    return i < len(values) and rounds_to(values[i], text)


@dataclass(frozen=True)
class Figure:
    line: int
    text: str  # as printed
    numbers: tuple[str, ...]  # (value, lo, hi) or (value,)


def units(readme: str):
    """The README in units a figure is read in: each markdown table row alone, else each
    paragraph; as (lines, text naming its folders), lines as (line number, raw line), fenced
    blocks and blockquote lines left out. A table row's naming text is the row and its table's
    caption (the paragraph just before the table)."""
    para: list[tuple[int, str]] = []
    caption = ""
    fenced = False
    for n, line in enumerate(readme.splitlines(), 1):
        if FENCE.match(line) or fenced or line.lstrip().startswith(">"):
            fenced = fenced != bool(FENCE.match(line))
            if para:  # a fenced block or a blockquote ends a paragraph
                yield para, "\n".join(t for _, t in para)
                caption, para = "\n".join(t for _, t in para), []
            continue
        if line.lstrip().startswith("|"):
            if para:
                yield para, "\n".join(t for _, t in para)
                caption, para = "\n".join(t for _, t in para), []
            yield [(n, line)], line + "\n" + caption
        elif not line.strip():
            if para:
                yield para, "\n".join(t for _, t in para)
                caption, para = "\n".join(t for _, t in para), []
        else:
            if not para:
                caption = ""
            para.append((n, line))
    if para:
        yield para, "\n".join(t for _, t in para)


def figures(lines: list[tuple[int, str]]):
    """The figures of a unit's lines, inline code left out; a figure may run over a line break."""
    text = "\n".join(CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line) for _, line in lines)
    starts = [0]
    for _, line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)

    def line_of(offset: int) -> int:
        return lines[bisect_right(starts, offset) - 1][0]

    covered = []
    for m in INTERVAL.finditer(text):
        covered.append(m.span())
        yield Figure(line_of(m.start()), " ".join(m.group(0).split()), m.groups())
    for m in FACTOR.finditer(text):
        if not any(a <= m.start() < b for a, b in covered):
            yield Figure(line_of(m.start()), m.group(0), (m.group(1),))


def holds(t: Tables, fig: Figure) -> bool:
    if len(fig.numbers) == 3:
        return any(all(rounds_to(v, s) for v, s in zip(tr, fig.numbers)) for tr in t.triples)
    return in_values(t.values, fig.numbers[0])


def mismatches(readme: str, tables_for) -> tuple[list[str], int]:
    """The figures no table holds (as 'line N: figure'), and how many figures were checked.
    tables_for(text) gives the Tables a unit (paragraph or table row) of that text is read
    against."""
    bad, checked = [], 0
    for unit, naming in units(readme):
        figs = list(figures(unit))
        if not figs:
            continue
        t = tables_for(naming)
        for fig in figs:
            checked += 1
            if not holds(t, fig):
                bad.append(f"line {fig.line}: {fig.text!r}")
    return bad, checked


_TABLES: dict[Path, Tables] = {}
_TABLES_OF: dict[tuple[Path, ...], Tables] = {}


def tables(folder: Path) -> Tables:
    if folder not in _TABLES:
        _TABLES[folder] = read_tables(folder)
    return _TABLES[folder]


NAMED = re.compile(r"(comparisons/)?(h[12]00[\w.-]*)/")
BY_NAME = {(p.parent.name, p.name): p for p in FOLDERS}


def named_folders(text: str) -> list[Path]:
    """The evidence and comparison folders a text names (`../h200-.../`, `docs/evidence/h100-.../`,
    `../comparisons/h200-.../`)."""
    out = []
    for m in NAMED.finditer(text):
        p = BY_NAME.get(("comparisons" if m.group(1) else "evidence", m.group(2)))
        if p and p not in out:
            out.append(p)
    return out


def read_against(own: Path | None):
    """A unit is read against its README's folder's tables and those of every folder it names
    (the index, docs/evidence/README.md, has no tables: a unit naming no folder is read against
    every folder's)."""

    def tables_for(text: str) -> Tables:
        folders = ([own] if own else []) + [p for p in named_folders(text) if p != own]
        if not folders:
            folders = FOLDERS
        key = tuple(folders)
        if key not in _TABLES_OF:
            t = Tables()
            for p in folders:
                t.add(tables(p))
            _TABLES_OF[key] = t
        return _TABLES_OF[key]

    return tables_for


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_readme_figures_come_from_the_folders_tables(folder):
    bad, checked = mismatches((folder / "README.md").read_text(), read_against(folder))
    assert not bad, f"{folder.relative_to(REPO)}/README.md quotes figures no table it reads holds: {bad}"
    assert checked or folder.name == "h200-2026-12-01-engine-int4", f"{folder.name}: no figure found to check"


def test_the_evidence_index_quotes_the_folders_it_names():
    bad, checked = mismatches((EVIDENCE / "README.md").read_text(), read_against(None))
    assert not bad, f"docs/evidence/README.md quotes figures the folders it names do not hold: {bad}"
    assert checked


def test_the_check_reports_a_figure_its_tables_do_not_hold(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables/attribution.csv").write_text("factor,value,lo,hi\nruntime,10.634,10.131,11.162\n")
    (tmp_path / "tables/cells.csv").write_text(
        "stack,output_tok_s,output_tok_s_lo,output_tok_s_hi\nfp8,8732.1,7832.8,9734.6\n"
    )
    t = read_tables(tmp_path)
    readme = "\n".join(
        [
            "# fake",
            "runtime 10.6× [10.1, 11.2] and 8,732 [7,833, 9,735] tok/s;",  # both held
            "runtime 10.6× [10.5, 10.7] (old interval)",  # not held: line 3
            "FP8 1.39x, on 2x1, 4x1 and h200x2 at 512 x 256 (x2-conversation)",  # 1.39 not held: line 4
            "```",
            "runtime 9.99× [9.9, 9.9]",  # fenced: exempt
            "```",
            "> quoted log: 7.77x",  # blockquote: exempt
            "rounding: 10.63× holds, 10.64x does not",  # line 9
            "",
            "a figure over a line break: 10.6×",
            "[10.1, 11.3]",  # not held: reported at line 11, where it starts
        ]
    )
    bad, checked = mismatches(readme, lambda text: t)
    assert checked == 7
    assert bad == [
        "line 3: '10.6× [10.5, 10.7]'",
        "line 4: '1.39x'",
        "line 9: '10.64x'",
        "line 11: '10.6× [10.1, 11.3]'",
    ]
