"""How frames are shown and stored (speedsplit/core/formats.py): a value's text, a difference
with its interval, lists joined for CSV, the words a reader gets instead of numbers, markdown and
HTML tables, and every file a frame is written to read back as it was."""

import polars as pl
import pytest

from speedsplit.core import formats


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "—"),
        (1.23456, "1.235"),
        (0.000123456, "0.0001235"),
        (123456.7, "123457"),  # large numbers whole, never 1.235e+05
        (3, "3"),
        ("vllm-fp16", "vllm-fp16"),
        ([1.5, None, "x"], "1.5, —, x"),
    ],
)
def test_a_value_reads_as_a_table_shows_it(value, text):
    assert formats.value_text(value) == text


def test_a_difference_is_signed_and_carries_its_interval_where_it_has_one():
    assert formats.difference_text(0.0172, -0.1, 0.134) == "+0.0172 [-0.1, +0.134]"
    assert formats.difference_text(-0.5) == "-0.5"
    assert formats.difference_text(0.2, -0.1, None) == "+0.2"  # half an interval is none
    assert formats.difference_text(None, 0, 1) == "—"


def test_csv_joins_lists_and_reasons_read_one_per_clause():
    df = pl.DataFrame({"users": [[1, 2]], "excluded": [["flagged a", "flagged b"]], "n": [3]})
    out = formats.flat(df)
    assert out.row(0) == ("1,2", "flagged a; flagged b", 3)


def test_a_crossover_reads_as_words():
    df = pl.DataFrame(
        {"users_min": [1, 2], "users_max": [64, 32], "crossover_users": [12.34, None], "chain": ["a", "b"]}
    )
    out = formats.for_people("crossover", df)
    assert out.columns == ["chain", "users", "crossover"]
    assert out.rows() == [("a", "1-64", "12.3 users"), ("b", "2-32", "none in range")]
    assert formats.for_people("cells", df).equals(df)  # other tables as they are


def test_markdown_and_html_tables():
    df = pl.DataFrame({"stack": ["a<b", "c"], "tok_s": [1234.5678, None], "bad": [True, False]})
    assert (
        formats.to_markdown(df)
        == "| stack | tok_s | bad |\n|---|---|---|\n| a<b | 1.23e+03 | True |\n| c | — | False |\n"
    )
    page = formats.html_table(df, bad_col="bad", max_rows=1)
    assert "<th>stack</th>" in page and "<td>a&lt;b</td>" in page and '<tr class="bad">' in page
    assert "<td>c</td>" not in page and "1 more rows in the table files." in page


def test_written_frames_read_back_with_their_types(tmp_path):
    df = pl.DataFrame({"excluded": [["a", "b"]], "value": [1.5], "users_min": [1], "users_max": [8]})
    df = df.with_columns(crossover_users=pl.lit(None, pl.Float64))  # as the analysis types it
    formats.write_frames({"crossover": df}, tmp_path, markdown=("crossover",))
    assert formats.read_frame(tmp_path / "crossover.parquet").equals(df)
    assert (tmp_path / "crossover.csv").read_text().splitlines()[1].startswith("a; b,1.5")
    assert "none in range" in (tmp_path / "crossover.md").read_text()
    formats.write_frames({"runs": df}, tmp_path, parquet=False)
    assert (tmp_path / "runs.csv").exists() and not (tmp_path / "runs.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "crossover.csv",
        "crossover.md",
        "crossover.parquet",
        "runs.csv",
    ]
