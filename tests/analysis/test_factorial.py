"""The confound factorial on constructed data with known effects: runtime factors, main effects
and interaction on the log scale, and an operational number that telescopes exactly."""

import math

import pytest
from records import fake_result, write_result

from speedsplit.analysis import factorial as F
from speedsplit.analysis import frames as T
from speedsplit.core.record import read_result
from speedsplit.output import aggregate

SPEC = {"users": 64, "workload": "wide", "fast": "vllm-fp16", "low": "hf-b8", "high": "hf-b64"}
SPEC["sampling"] = ["greedy", "ancestral"]
# median output tok/s of each (stack, sampling)
TRUE = {
    ("vllm-fp16", "greedy"): 1000.0,
    ("vllm-fp16", "ancestral"): 900.0,
    ("hf-b8", "greedy"): 100.0,
    ("hf-b8", "ancestral"): 50.0,
    ("hf-b64", "greedy"): 200.0,
    ("hf-b64", "ancestral"): 150.0,
}


@pytest.fixture
def paths(tmp_path):
    out = []
    for (stack, sampling), rate in TRUE.items():
        for run, wobble in enumerate((0.98, 1.0, 1.02)):  # median = the true rate
            res = fake_result(stack, 64, run, rate * wobble, sampling=sampling)
            out.append(write_result(tmp_path / f"{stack}-{sampling}-{run}.json", res))
    return out


def rows(frame):
    return {r["name"]: r for r in frame.iter_rows(named=True)}


def test_effects_and_decomposition_from_known_rates(paths):
    r = rows(F.factorial_frame(T.runs_frame([read_result(p) for p in paths]), SPEC))
    assert r["R(low, greedy)"]["value"] == pytest.approx(10.0) and r["R(high, ancestral)"]["value"] == pytest.approx(
        6.0
    )
    # L(low,g)=ln 10, L(high,g)=ln 5, L(low,a)=ln 18, L(high,a)=ln 6
    assert r["ceiling"]["log_value"] == pytest.approx(math.log(6.0) / 2)
    assert r["sampling"]["log_value"] == pytest.approx(math.log(108 / 50) / 2)
    assert r["interaction"]["log_value"] == pytest.approx(math.log(1.5))
    assert r["operational"]["value"] == pytest.approx(20.0) and r["matched"]["value"] == pytest.approx(5.0)
    assert r["batch ceiling"]["value"] == pytest.approx(2.0)
    assert r["sampling (HF, low ceiling)"]["value"] == pytest.approx(2.0)
    parts = r["matched"]["log_value"] + r["batch ceiling"]["log_value"] + r["sampling (HF, low ceiling)"]["log_value"]
    assert parts == pytest.approx(r["operational"]["log_value"])  # the decomposition is exact
    for row in r.values():
        assert row["lo"] <= row["value"] <= row["hi"]
    assert {row["kind"] for row in r.values()} == {"runtime_factor", "effect", "decomposition"}


def test_a_missing_group_leaves_the_factorial_undefined_with_the_reason(paths):
    kept = [p for p in paths if "hf-b64-ancestral" not in p.name]
    frame = F.factorial_frame(T.runs_frame([read_result(p) for p in kept]), SPEC)
    assert frame.height == 1 and frame["kind"][0] == "undefined"
    assert frame["note"][0] == "hf-b64 at ancestral: no clean run"


def test_the_tables_carry_it_when_the_config_asks(paths, tmp_path):
    frames = aggregate.build_frames(paths, {}, specs={"factorial": SPEC})
    assert rows(frames["factorial"])["operational"]["value"] == pytest.approx(20.0)
    assert "factorial" not in aggregate.build_frames(paths, {})


def test_the_report_shows_it(paths, tmp_path):
    from conftest import REPO

    from speedsplit.planning import config as C

    aggregate.write_tables(paths, tmp_path / "tables", chains={}, specs={"factorial": SPEC})
    (tmp_path / "plots").mkdir()
    aggregate.write_report(
        tmp_path / "report.html",
        config=C.load(REPO / "config/config.yaml").filled(),
        result_paths=paths,
        tables_dir=tmp_path / "tables",
        plots_dir=tmp_path / "plots",
    )
    html = (tmp_path / "report.html").read_text()
    assert "The operational number's confounds" in html and "sampling (HF, low ceiling)" in html
