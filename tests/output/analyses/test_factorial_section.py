"""The confound factorial as an analysis: when the config turns it on, the table it builds from the
runs of its one cell (runtime factors, effects, and the operational number decomposed), its
first-screen answer and its report section (output/analyses/factorial.py)."""

import math

import polars as pl
import pytest
from records import fake_result

from speedsplit.analysis import frames as F
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import factorial as X
from speedsplit.planning import config as C

SPEC = {"enabled": True, "users": 64, "workload": "wide", "fast": "vllm-fp16", "low": "hf-b8", "high": "hf-b64"}
SPEC["sampling"] = ["greedy", "ancestral"]
# Each (stack, sampling)'s output tok/s (geometric mean over its runs).
RATE = {
    ("vllm-fp16", "greedy"): 1000.0,
    ("vllm-fp16", "ancestral"): 900.0,
    ("hf-b8", "greedy"): 100.0,
    ("hf-b8", "ancestral"): 50.0,
    ("hf-b64", "greedy"): 200.0,
    ("hf-b64", "ancestral"): 150.0,
}
WOBBLE = (0.5, 1.0, 2.0)  # each group's runs: log2 -1, 0, 1 about its rate (sd 1)
# Each group apart (unpaired), Welch. Two groups (every R, every decomposition row): standard error
# √(2/3) in log2, df 4, t(0.975, 4) = 2.7764: K4 = 2^(2.7764 √(2/3)) = 4.813. ceiling = (high's
# two groups - low's two) / 2: standard error √(4 / 4 / 3) = 1/√3, df 8, t(0.975, 8) = 2.3060:
# K8 = 2^(2.3060 / √3). interaction (±1 on those four): twice ceiling's error, the same df: K8².
# sampling = fast(o) - fast(m) + (low(m) + high(m) - low(o) - high(o)) / 2: standard error
# √(2/3 + 4 / 4 / 3) = 1, df 8: 2^2.3060.
K4 = 2 ** (2.7764451051977987 * math.sqrt(2 / 3))
K8 = 2 ** (2.306004135204166 / math.sqrt(3))
SAMPLING_K = 2**2.306004135204166


def runs_of(rate=RATE, wobble=WOBBLE, users=64, workload="wide", status="ok", flags=()) -> list:
    return [
        fake_result(stack, users, run, v * w, sampling=sampling, workload=workload, status=status, flags=flags)
        for (stack, sampling), v in rate.items()
        for run, w in enumerate(wobble)
    ]


def measured(results, spec=SPEC, tolerate_flags=()) -> dict[str, pl.DataFrame]:
    """The analysis's table, as aggregate builds it from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs)
    return X.build(Basis(runs, cells, pl.DataFrame(), chains={}, tolerate_flags=tolerate_flags, spec=spec))


def rows(frames) -> dict[str, dict]:
    return {r["name"]: r for r in frames["factorial"].iter_rows(named=True)}


def test_the_config_turns_it_on_and_its_spec_names_the_workload():
    off = C.load()
    assert not X.ANALYSIS.enabled(off) and X.ANALYSIS.spec(off) is None and "factorial" not in table_names(off)
    on = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"factorial": {"enabled": True, "users": 8}}))
    assert X.ANALYSIS.enabled(on) and "factorial" in table_names(on)
    spec = X.ANALYSIS.spec(on)  # the grid's first cell's workload
    assert spec == {
        "enabled": True,
        "users": 8,
        "workload": "wide",
        "fast": "vllm-fp16",
        "low": "hf-generate",
        "high": "hf-generate-b64",
        "sampling": ["greedy", "ancestral"],
    }
    assert X.ANALYSIS.charts({"factorial": pl.DataFrame()}) == {}  # no chart of its own


def test_without_a_spec_nothing_is_built_and_a_missing_table_says_nothing():
    assert measured(runs_of(), spec=None) == {}
    assert X.section({}, {}) == "" and X.answer({}) == ""
    assert X.answer({"factorial": pl.DataFrame(schema={"kind": pl.Utf8})}) == ""


def test_the_runtime_factors_effects_and_decomposition_from_known_rates():
    """L(low, greedy) = ln 10, L(high, greedy) = ln 5, L(low, ancestral) = ln 18, L(high,
    ancestral) = ln 6: ceiling (ln 10 + ln 18 - ln 5 - ln 6) / 2 = ln √6, sampling (ln 18 + ln 6 -
    ln 10 - ln 5) / 2 = ln √2.16, interaction ln 18 - ln 6 - ln 10 + ln 5 = ln 1.5; operational
    1000 / 50 = 20 = matched 1000 / 200 = 5 x batch ceiling 200 / 100 = 2 x sampling 100 / 50 = 2."""
    r = rows(measured(runs_of()))
    assert list(r) == [
        "R(low, greedy)",
        "R(high, greedy)",
        "R(low, ancestral)",
        "R(high, ancestral)",
        "ceiling",
        "sampling",
        "interaction",
        "operational",
        "matched",
        "batch ceiling",
        "sampling (HF, low ceiling)",
    ]
    expected = {
        "R(low, greedy)": (10, K4),
        "R(high, greedy)": (5, K4),
        "R(low, ancestral)": (18, K4),
        "R(high, ancestral)": (6, K4),
        "ceiling": (math.sqrt(6), K8),
        "sampling": (math.sqrt(2.16), SAMPLING_K),
        "interaction": (1.5, K8**2),
        "operational": (20, K4),
        "matched": (5, K4),
        "batch ceiling": (2, K4),
        "sampling (HF, low ceiling)": (2, K4),
    }
    for name, (value, k) in expected.items():
        row = r[name]
        assert (row["value"], row["lo"], row["hi"]) == pytest.approx((value, value / k, value * k)), name
        assert row["log_value"] == pytest.approx(math.log(value)) and row["note"] == ""
        assert (row["users"], row["workload"]) == (64, "wide")
    kinds = {name: row["kind"] for name, row in r.items()}
    assert [kinds[n] for n in ("R(low, greedy)", "ceiling", "interaction", "operational", "matched")] == [
        "runtime_factor",
        "effect",
        "effect",
        "decomposition",
        "decomposition",
    ]
    parts = sum(r[n]["log_value"] for n in ("matched", "batch ceiling", "sampling (HF, low ceiling)"))
    assert parts == pytest.approx(r["operational"]["log_value"])  # the decomposition multiplies exactly


def test_the_answer_says_the_operational_number_as_the_product_of_its_parts():
    """operational 20× [20 / K4, 20 K4] = [4.16, 96.3]; matched 5× [1.04, 24.1]; 2× [0.416, 9.63]."""
    line = (
        "At 64 users (wide): operational runtime factor 20× [4.16, 96.3] = matched 5× [1.04, 24.1] × "
        "batch ceiling 2× [0.416, 9.63] × sampling (HF, low ceiling) 2× [0.416, 9.63]"
    )
    html = X.answer(measured(runs_of()))
    assert html == f"<h3>The operational number, decomposed</h3><p class='headline'>{line}</p>"


def test_the_section_tabulates_every_row():
    html = X.section(measured(runs_of()), {})
    assert html.startswith("<h2>The operational number's confounds</h2>\n<p class='note'>The runtime factor")
    head = "<th>users</th><th>workload</th><th>kind</th><th>name</th><th>value</th><th>lo</th><th>hi</th>"
    assert head + "<th>log_value</th><th>note</th></tr>" in html and html.count("<tr><td>64</td>") == 11
    assert "<tr><td>64</td><td>wide</td><td>decomposition</td><td>operational</td><td>20</td><td>4.155</td>" in html


def test_one_run_a_group_gives_factors_without_intervals_and_says_so():
    frames = measured(runs_of(wobble=(1.0,)))
    r = rows(frames)
    assert r["operational"]["value"] == pytest.approx(20.0) and r["interaction"]["value"] == pytest.approx(1.5)
    assert {(row["lo"], row["hi"]) for row in r.values()} == {(None, None)}
    assert {row["note"] for row in r.values()} == {"a group has one run: no interval"}
    line = (
        "At 64 users (wide): operational runtime factor 20× = matched 5× × batch ceiling 2× × "
        "sampling (HF, low ceiling) 2×"
    )
    assert X.answer(frames) == f"<h3>The operational number, decomposed</h3><p class='headline'>{line}</p>"


def test_a_group_with_no_clean_run_leaves_it_undefined_the_section_says_why_and_the_answer_nothing():
    """hf-b64's server died in every ancestral run; vllm-fp16's greedy runs measured the wrong kernel."""
    died = {k: v for k, v in RATE.items() if k == ("hf-b64", "ancestral")}
    flagged = {k: v for k, v in RATE.items() if k == ("vllm-fp16", "greedy")}
    rest = {k: v for k, v in RATE.items() if k not in died and k not in flagged}
    results = runs_of(rest) + runs_of(died, status="server_died") + runs_of(flagged, flags=["kernel_mismatch"])
    frames = measured(results)
    (row,) = frames["factorial"].iter_rows(named=True)
    why = "vllm-fp16 at greedy: no clean run; hf-b64 at ancestral: no clean run"
    assert (row["kind"], row["name"], row["value"], row["note"]) == ("undefined", "factorial", None, why)
    assert (row["users"], row["workload"]) == (64, "wide")
    assert X.answer(frames) == ""
    assert f"<td>undefined</td><td>factorial</td><td>—</td><td>—</td><td>—</td><td>—</td><td>{why}</td>" in X.section(
        frames, {}
    )


def test_a_flagged_group_counts_where_the_flag_is_tolerated():
    """vllm-fp16's greedy runs flagged short_measurement: out unless the flag is tolerated."""
    flagged = {("vllm-fp16", "greedy"): RATE[("vllm-fp16", "greedy")]}
    rest = {k: v for k, v in RATE.items() if k not in flagged}
    results = runs_of(rest) + runs_of(flagged, flags=["short_measurement"])
    assert rows(measured(results))["factorial"]["note"] == "vllm-fp16 at greedy: no clean run"
    tolerated = rows(measured(results, tolerate_flags=("short_measurement",)))
    assert tolerated["operational"]["value"] == pytest.approx(20.0)


def test_only_the_specs_cell_counts():
    """The same stacks at 8 users and on another workload, at other speeds, move nothing."""
    other = {k: v * (3.0 if k[0] == "hf-b8" else 1.0) for k, v in RATE.items()}
    results = runs_of() + runs_of(other, users=8) + runs_of(other, workload="narrow")
    r = rows(measured(results))
    assert r["operational"]["value"] == pytest.approx(20.0) and r["batch ceiling"]["value"] == pytest.approx(2.0)
    assert {(row["users"], row["workload"]) for row in r.values()} == {(64, "wide")}
    eight = rows(measured(results, SPEC | {"users": 8}))
    assert eight["operational"]["value"] == pytest.approx(1000 / 150)  # hf-b8 three times as fast there
