"""The pieces the charts are built from (speedsplit/output/chart_parts.py): 1-2-5 log ticks with 1
among them, a cell's panel label, a title naming model and hardware, ratios with their bars."""

import polars as pl
import pytest

from speedsplit.output import chart_parts


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.3, 4.0, [0.5, 1.0, 2.0]),
        (1.5, 30.0, [1.0, 2.0, 5.0, 10.0, 20.0]),  # 1 although below the range: a reader places it
        (0.001, 0.004, [0.001, 0.002, 1.0]),
    ],
)
def test_log_ticks_are_one_two_five_and_one(low, high, ticks):
    assert chart_parts.log_ticks(low, high) == pytest.approx(ticks)


def test_a_cell_label_and_a_title_naming_model_and_hardware():
    assert chart_parts.cell_label(64, "h200-wide", "tp1") == "64 users, h200-wide (tp1)"
    cells = pl.DataFrame({"model": ["b", "a", "b"], "hardware": ["H200", "H200", "H100"]})
    t = chart_parts.title("Throughput", cells).to_dict()
    assert t["text"] == "Throughput" and t["anchor"] == "start"
    assert t["subtitle"] == ["model: a, b | hardware: H100; H200", chart_parts.ERRORBARS]
    assert chart_parts.title("Share", pl.DataFrame({"x": [1]}), intervals=False).to_dict()["subtitle"] == [
        "model:  | hardware: "
    ]


def test_ratios_vs_users_draw_a_line_and_its_interval_on_log_axes():
    df = pl.DataFrame({"users": [1, 8], "value": [1.2, 1.5], "lo": [1.1, 1.3], "hi": [1.3, 1.7]})
    spec = chart_parts.ratios_vs_users(df, "speedup", chart_parts.RATIO_TIPS).to_dict()
    line, bars = spec["layer"]
    assert line["mark"]["type"] == "line" and bars["mark"]["type"] == "errorbar"
    for layer in (line, bars):  # both against users on a log axis
        assert layer["encoding"]["x"]["field"] == "users" and layer["encoding"]["x"]["scale"] == {"type": "log"}
    assert (line["encoding"]["y"]["field"], line["encoding"]["y"]["title"]) == ("value", "speedup")
    assert line["encoding"]["y"]["scale"] == {"type": "log"}
    assert bars["encoding"]["y"]["field"] == "lo" and bars["encoding"]["y2"]["field"] == "hi"
