"""One run's requests on a time axis: run 0 of the first chain's stacks at its first headline
cell, measured requests only, by send time (read from committed evidence)."""

import polars as pl
from conftest import REPO

from speedsplit.output.aggregate import evidence_frames
from speedsplit.output.plots import core_charts

EVIDENCE = REPO / "docs" / "evidence"


def test_the_timeline_draws_run_zero_of_the_first_chain_at_its_headline_cell():
    t = evidence_frames(EVIDENCE / "h200-2026-11-30-chain")[0]
    tl = t["timeline"]
    assert tl["stack"].unique(maintain_order=True).to_list() == ["hf-fp16", "vllm-fp16", "vllm-marlin"]
    head = t["attribution"].filter(pl.col("headline") & (pl.col("chain") == "study"))["cell"].to_list()
    (cell,) = tl["cell"].unique().to_list()
    assert cell == head[0] and set(tl["run"]) == {0}
    users = t["runs"].filter(pl.col("cell") == cell)["users"][0]
    assert tl.group_by("stack").len()["len"].to_list() == [users] * 3  # 1 measured request per user
    for _, df in tl.group_by("stack"):
        assert df["sent"].is_sorted() and (df["end"] >= df["first_token"]).all() and df["due"].is_null().all()
    assert {"timeline", "tradeoff"} <= set(core_charts(t, ["study"]))


def test_an_open_loop_timeline_says_when_each_request_was_due():
    tl = evidence_frames(EVIDENCE / "h200-2026-12-01-traffic")[0]["timeline"]
    assert tl.height and tl["due"].is_not_null().all()
    assert (tl["sent"] - tl["due"] < 0.1).all()  # the client kept to its schedule (client_lag would say)
    assert (
        tl.filter(pl.col("stack") == "hf-fp16")["end"].max()
        > 3 * tl.filter(pl.col("stack") == "vllm-fp16")["end"].max()
    )
