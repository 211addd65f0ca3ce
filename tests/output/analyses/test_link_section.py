"""The interconnect control as an analysis (output/analyses/link.py): when the config turns it on,
the table it builds from the link rule's results/hardware/link.json (a row per pair, mode and
payload, the decode-sized ones marked), its chart and its report section."""

import json

import polars as pl
import pytest

from speedsplit.measuring.link import MIB, decode_payloads, payload_sizes
from speedsplit.output.analyses import Basis, table_names
from speedsplit.output.analyses import link as L
from speedsplit.planning import config as C

# One decode step's activation at 4 and 16 users of a 128-wide model: 4 x 128 x 2 = 1 KiB and
# 4 KiB; payloads from 1 KiB doubling to 1 MiB (11 of them).
DECODE = decode_payloads([4, 16], [128])
SIZES = payload_sizes(DECODE, MIB)


def latency_us(mode: str, nbytes: int) -> float:
    """A call's latency: peer-to-peer 10 µs and 1 µs a KiB; through the host, twice that."""
    return (1 if mode == "p2p" else 2) * (10.0 + nbytes / 1024)


def measurement(pair: str, mode: str, nbytes: int) -> dict:
    """A row as measure_pair returns it: bandwidth from the latency, the bus's the same for two
    ranks (ring all-reduce: 2 (n - 1) / n = 1)."""
    us = latency_us(mode, nbytes)
    algbw = nbytes / (us / 1e6) / 1e9
    return {"pair": pair, "mode": mode, "bytes": nbytes, "iterations": 200, "latency_us": us} | {
        "algbw_gb_s": algbw,
        "busbw_gb_s": algbw,
    }


def link_json(tmp_path, pairs=("0,1",), modes=("p2p", "no_p2p"), backend="nccl", **extra) -> str:
    """results/hardware/link.json as the link rule writes it (measuring/link.run)."""
    doc = {"platform": "cuda" if backend == "nccl" else "cpu", "payload_bytes": SIZES, "decode_payload_bytes": DECODE}
    doc |= {"backend": backend, "devices": sorted({d for p in pairs for d in p.split(",")})}
    doc["measurements"] = [measurement(p, m, b) for p in pairs for m in modes for b in SIZES]
    doc |= {"topology_matrix": "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X "} | extra
    path = tmp_path / "link.json"
    path.write_text(json.dumps(doc))
    return path


def built(path) -> dict[str, pl.DataFrame]:
    return L.build(
        Basis(runs=pl.DataFrame(), cells=pl.DataFrame(), by_throughput=pl.DataFrame(), chains={}, link_json=path)
    )


def html_rows(html: str) -> int:
    return html.count("<tr><td>")


def test_link_control_turns_the_analysis_on():
    plain = C.load()
    on = C.validate(C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"link_control": {"enabled": True}}))
    assert L.ANALYSIS.enabled(on) and not L.ANALYSIS.enabled(plain)
    assert "link" in table_names(on) and "link" not in table_names(plain)


def test_without_the_link_results_nothing_is_built_and_there_is_no_section_or_chart():
    assert built(None) == {}
    assert L.section({}, {}) == "" and L.charts({}) == {}


def test_a_row_per_pair_mode_and_payload_with_the_decode_sized_ones_marked(tmp_path):
    """1 MiB p2p: 10 + 1024 = 1034 µs, 1048576 B / 1034 µs = 1.0141 GB/s; through the host 2068 µs."""
    link = built(link_json(tmp_path))["link"]
    assert link.columns == [
        "backend", "pair", "mode", "bytes", "iterations", "latency_us", "algbw_gb_s", "busbw_gb_s", "decode_sized",
    ]  # fmt: skip
    assert link.height == 2 * 11 and set(link["backend"]) == {"nccl"}
    assert link.filter(pl.col("decode_sized"))["bytes"].to_list() == [1024, 4096, 1024, 4096]  # p2p, then no_p2p
    big = {r["mode"]: r for r in link.filter(pl.col("bytes") == MIB).iter_rows(named=True)}
    assert (big["p2p"]["latency_us"], big["no_p2p"]["latency_us"]) == (1034.0, 2068.0)
    assert big["p2p"]["busbw_gb_s"] == pytest.approx(MIB / 1034e-6 / 1e9) == pytest.approx(1.014097, rel=1e-6)
    assert big["no_p2p"]["busbw_gb_s"] == pytest.approx(big["p2p"]["busbw_gb_s"] / 2)


def test_the_section_tabulates_the_decode_sized_payloads_and_the_cards_topology(tmp_path):
    frames = built(link_json(tmp_path))
    html = L.section(frames, {"link_matrix": "GPU0\tNV18 <- NVLink"})
    assert html.startswith("<h2>Interconnect control</h2>\n<p class='note'>All-reduce between two ranks")
    table = html.split("<details>")[0]
    assert table.count("<tr><td>nccl</td>") == 4  # the decode-sized payloads only: 2 sizes x 2 modes
    # 1 KiB p2p: 11 µs, 1024 B / 11 µs = 0.0931 GB/s
    assert "<tr><td>nccl</td><td>0,1</td><td>p2p</td><td>1024</td><td>200</td><td>11</td><td>0.09309</td>" in table
    assert "<td>4096</td><td>200</td><td>28</td>" in table  # 4 KiB through the host: 2 x (10 + 4) µs
    assert "<pre>GPU0\tNV18 &lt;- NVLink</pre></details>" in html  # the matrix as printed, escaped
    assert "<pre>—</pre>" in L.section(frames, {}) and "<pre>—</pre>" in L.section(frames, {"link_matrix": None})


def test_the_chart_draws_latency_and_bus_bandwidth_against_the_payload_in_mib_per_pair_and_mode(tmp_path):
    charts = L.charts(built(link_json(tmp_path, pairs=("0,1", "0,2", "1,2"))))
    spec = charts["link"].to_dict()
    assert spec["title"]["text"] == "Interconnect control: all-reduce between two ranks (nccl)"
    latency, busbw = spec["hconcat"]
    assert (latency["encoding"]["y"]["field"], busbw["encoding"]["y"]["field"]) == ("latency_us", "busbw_gb_s")
    for panel in (latency, busbw):
        enc = panel["encoding"]
        assert (enc["x"]["field"], enc["color"]["field"], enc["detail"]["field"]) == ("mib", "mode", "pair")
        assert enc["x"]["scale"] == enc["y"]["scale"] == {"type": "log"}
    (data,) = spec["datasets"].values()
    assert len(data) == 3 * 2 * 11  # every payload, not only the decode-sized ones
    assert sorted({r["mib"] for r in data})[:2] == [1 / 1024, 2 / 1024] and max(r["mib"] for r in data) == 1.0


def test_on_a_cpu_the_two_host_processes_over_gloo_are_one_pair_in_one_mode(tmp_path):
    path = link_json(tmp_path, pairs=("cpu,cpu",), modes=("host",), backend="gloo", topology_matrix=None)
    frames = built(path)
    assert set(frames["link"]["mode"]) == {"host"} and frames["link"].height == 11
    assert L.charts(frames)["link"].to_dict()["title"]["text"].endswith("between two ranks (gloo)")
    assert html_rows(L.section(frames, {})) == 2  # 1 KiB and 4 KiB


def test_a_link_file_without_measurements_is_an_empty_table_and_no_chart(tmp_path):
    frames = built(link_json(tmp_path, pairs=()))
    assert frames["link"].height == 0 and frames["link"].schema["decode_sized"] == pl.Boolean
    assert L.charts(frames) == {}
    assert html_rows(L.section(frames, {})) == 0 and "<th>latency_us</th>" in L.section(frames, {})
