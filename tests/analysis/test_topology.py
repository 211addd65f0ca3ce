"""Topology comparisons on constructed runs with known ratios."""

import statistics

import polars as pl
import pytest
from records import fake_result, write_result

from speedsplit.output import aggregate, plots

# output tok/s per run: tp2 is 1.5x tp1 (efficiency 0.75); 2x1 is 1.8x tp1 on the wide cell
# and 1.2x on the narrow one, so it beats tp2 wide (1.2x) and loses narrow (0.8x).
SPEEDS = {
    ("tp1", 1, 1): {64: [1000.0, 1010.0, 990.0], 8: [200.0, 202.0, 198.0]},
    ("tp2", 2, 1): {64: [1500.0, 1515.0, 1485.0], 8: [300.0, 303.0, 297.0]},
    ("2x1", 1, 2): {64: [1800.0, 1818.0, 1782.0], 8: [240.0, 242.4, 237.6]},
}


@pytest.fixture()
def frames(tmp_path):
    paths = []
    for (topo, tp, n), by_users in SPEEDS.items():
        for users, speeds in by_users.items():
            for run, tok_s in enumerate(speeds):
                res = fake_result("vllm-fp16", users, run, tok_s, topology=topo, tp=tp, instances=n)
                paths.append(write_result(tmp_path / f"{topo}-{users}-{run}.json", res))
    return aggregate.build_frames(paths, {})


def row(scaling, users, comparison):
    return scaling.filter((pl.col("users") == users) & (pl.col("comparison") == comparison)).row(0, named=True)


def test_scaling_factors_efficiency_and_winners(frames):
    s = frames["scaling"]
    tp = row(s, 64, "tp2 / tp1")
    assert tp["kind"] == "tensor_parallel" and tp["value"] == pytest.approx(1.5)
    assert tp["efficiency"] == pytest.approx(0.75) and tp["lo"] <= 1.5 <= tp["hi"] and tp["winner"] == "tp2"
    inst = row(s, 64, "2x1 / tp1")
    assert inst["kind"] == "instances" and inst["efficiency"] == pytest.approx(0.9)
    wide, narrow = row(s, 64, "2x1 / tp2"), row(s, 8, "2x1 / tp2")
    assert wide["kind"] == "instances_vs_tensor_parallel" and wide["efficiency"] is None
    assert wide["value"] == pytest.approx(1.2) and wide["winner"] == "2x1"
    assert narrow["value"] == pytest.approx(0.8) and narrow["winner"] == "tp2"
    assert s.height == 2 * 3 and set(s["runs_used"]) == {6}


def test_per_gpu_and_per_user_rates(frames):
    t = frames["topologies"].filter(pl.col("users") == 64)
    by = {r["topology"]: r for r in t.iter_rows(named=True)}
    gm = statistics.geometric_mean  # values over runs
    assert by["tp2"]["gpus"] == 2 and by["tp2"]["tok_s_per_gpu"] == pytest.approx(gm(SPEEDS["tp2", 2, 1][64]) / 2)
    assert by["2x1"]["tok_s_per_user"] == pytest.approx(gm(SPEEDS["2x1", 1, 2][64]) / 64)


def test_an_open_loop_cell_has_no_rate_per_user(tmp_path):
    """Its load has no users (0): the per-user rate is empty, not infinity (five evidence
    folders' topologies tables held inf there)."""
    from speedsplit.analysis.topology import topology_frame

    arrival = {"pattern": "poisson", "rate_rps": 4.0, "requests": 10}
    runs = [fake_result("vllm-fp16", 0, run, 100.0, workload="mix", arrival=arrival) for run in (0, 1)]
    paths = [write_result(tmp_path / f"r{res.run}.json", res) for res in runs]
    t = topology_frame(aggregate.build_frames(paths, {})["cells"])
    assert t["tok_s_per_gpu"].to_list()[0] > 0 and t.select(pl.selectors.starts_with("tok_s_per_user")).row(0) == (
        None,
        None,
        None,
    )


def test_a_topology_without_a_clean_run_leaves_its_factor_undefined(tmp_path):
    paths = [
        write_result(tmp_path / "a.json", fake_result("vllm-fp16", 8, 0, 100.0)),
        write_result(
            tmp_path / "b.json", fake_result("vllm-fp16", 8, 0, None, status="startup_failed", topology="tp2", tp=2)
        ),
    ]
    s = aggregate.build_frames(paths, {})["scaling"]
    assert s["value"].to_list() == [None] and s["note"].to_list() == ["tp2: no clean run"]
    assert s["excluded"].to_list() == [["tp2 run0: startup_failed"]]


def test_topology_charts_render(frames, tmp_path):
    charts = aggregate.charts(frames, [])
    for name in ("topologies", "scaling"):
        out = plots.save(charts[name], tmp_path / name)
        assert "<svg" in out["svg"].read_text()[:500]


def test_packing_shares_of_the_wall_time(tmp_path):
    """Two cards over 100 s: card 0 starts a server for 20 s then measures 50 s; card 1 measures 25 s."""
    from records import fake_result

    from speedsplit.core.record import Timing

    a = fake_result("vllm-fp16", 8, 0, 100.0)
    a.server.devices, a.server.reused, a.server.startup_s, a.server.lease_wait_s = ["0"], False, 20.0, 0.0
    a.timing = Timing(job_start=1000.0, load_start=1020.0, load_end=1070.0, job_end=1071.0)
    b = fake_result("vllm-fp16", 8, 1, 100.0)
    b.server.devices, b.server.reused = ["1"], True
    b.timing = Timing(job_start=1050.0, load_start=1070.0, load_end=1095.0, job_end=1100.0)
    paths = [write_result(tmp_path / "a.json", a), write_result(tmp_path / "b.json", b)]
    p = {r["device"]: r for r in aggregate.build_frames(paths, {})["packing"].iter_rows(named=True)}
    assert p["0"]["wall_s"] == 100.0 and p["0"]["measuring_share"] == pytest.approx(0.5)
    assert p["0"]["starting_share"] == pytest.approx(0.2) and p["1"]["starting_s"] == 0.0
    assert p["all"]["measuring_share"] == pytest.approx(75 / 200)
    # a skipped capacity level held no card: its '(none)' row is no card of 'all'
    c = fake_result("vllm-fp16", 16, 0, None, status="skipped")
    c.server = None
    c.timing = Timing(job_start=1090.0, job_end=1091.0)
    paths.append(write_result(tmp_path / "c.json", c))
    p = {r["device"]: r for r in aggregate.build_frames(paths, {})["packing"].iter_rows(named=True)}
    assert set(p) == {"0", "1", "(none)", "all"} and p["all"]["measuring_share"] == pytest.approx(75 / 200)


def test_packing_counts_no_time_between_runs_measured_apart(tmp_path):
    """A second run added to the folder an hour later: the hour is nobody's wall time."""
    from records import fake_result

    from speedsplit.core.record import Timing

    paths = []
    for i, t0 in enumerate((1000.0, 1000.0 + 3600.0)):
        r = fake_result("vllm-fp16", 8, i, 100.0)
        r.server.devices, r.server.reused, r.server.startup_s, r.server.lease_wait_s = ["0"], False, 10.0, 0.0
        r.timing = Timing(job_start=t0, load_start=t0 + 10.0, load_end=t0 + 40.0, job_end=t0 + 50.0)
        paths.append(write_result(tmp_path / f"r{i}.json", r))
    p = {r["device"]: r for r in aggregate.build_frames(paths, {})["packing"].iter_rows(named=True)}
    assert p["0"]["wall_s"] == 100.0  # two runs of 50 s
    assert p["0"]["measuring_share"] == pytest.approx(0.6) and p["0"]["starting_share"] == pytest.approx(0.2)
