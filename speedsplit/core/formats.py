"""How the analysis frames are shown and stored: parquet (typed, what plots and the report
read), CSV for people and other tools (lists joined), markdown, and the text of values
("—" for a missing number, "none in range" for a crossover that does not happen).
"""

from __future__ import annotations

import html
import io
from pathlib import Path

import polars as pl

from speedsplit.core.results import write_bytes_atomic

# How a list column is joined in CSV and text (reasons read better one per clause).
_JOIN = {"excluded": "; "}


def value_text(v, digits: int = 4) -> str:
    """One value as a table shows it."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:.0f}"
    if isinstance(v, list):
        return ", ".join(value_text(x, digits) for x in v)
    return str(v)


def difference_text(d, lo=None, hi=None) -> str:
    """A signed difference and its interval, where it has one: '+0.017 [-0.1, +0.13]'."""
    if d is None:
        return "—"
    return f"{d:+.3g}" + (f" [{lo:+.3g}, {hi:+.3g}]" if lo is not None and hi is not None else "")


def flat(df: pl.DataFrame) -> pl.DataFrame:
    """List columns joined into text (CSV holds no lists)."""
    lists = [c for c, t in df.schema.items() if isinstance(t, pl.List)]
    return df.with_columns(pl.col(c).cast(pl.List(pl.Utf8)).list.join(_JOIN.get(c, ",")) for c in lists)


def for_people(name: str, df: pl.DataFrame) -> pl.DataFrame:
    """A frame with its numbers put into words where words read better (report, markdown)."""
    if name == "crossover" and df.height:
        return df.select(
            pl.exclude("users_min", "users_max", "crossover_users"),
            pl.format("{}-{}", "users_min", "users_max").alias("users"),
            pl.when(pl.col("crossover_users").is_null())
            .then(pl.lit("none in range"))
            .otherwise(pl.format("{} users", pl.col("crossover_users").round(1)))
            .alias("crossover"),
        )
    return df


def to_markdown(df: pl.DataFrame, digits: int = 3) -> str:
    """A plain markdown table (no extra dependency)."""
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(value_text(v, digits) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join(lines) + "\n"


def write_frames(
    frames: dict[str, pl.DataFrame], out_dir: str | Path, markdown: tuple[str, ...] = (), parquet: bool = True
) -> None:
    """Each frame as {name}.parquet (unless parquet is off) and {name}.csv (and {name}.md for
    those named), atomically."""
    out_dir = Path(out_dir)
    for name, df in frames.items():
        if parquet:
            buf = io.BytesIO()
            df.write_parquet(buf)
            write_bytes_atomic(out_dir / f"{name}.parquet", buf.getvalue())
        write_bytes_atomic(out_dir / f"{name}.csv", flat(df).write_csv().encode())
        if name in markdown:
            write_bytes_atomic(out_dir / f"{name}.md", to_markdown(for_people(name, df)).encode())


def read_frame(path: str | Path) -> pl.DataFrame:
    """A frame written by write_frames, with its types."""
    return pl.read_parquet(path)


def html_table(df: pl.DataFrame, bad_col: str | None = None, max_rows: int = 500) -> str:
    """A frame as an HTML table (rows whose bad_col is set marked bad), at most max_rows."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    rows = []
    for row in df.head(max_rows).iter_rows(named=True):
        cls = ' class="bad"' if bad_col and row.get(bad_col) else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(value_text(v))}</td>" for v in row.values()) + "</tr>")
    more = f'<p class="note">{df.height - max_rows} more rows in the table files.</p>' if df.height > max_rows else ""
    # a table wider than the page scrolls on its own; the page itself never scrolls sideways
    return (
        f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{more}"
    )
