"""The truth tier: the whole workflow on servers of known speed (tests/config/truth.yaml), every
number set beside its truth (speedsplit/output/truth.py). A measuring path that drifts or an
interval that misses the truth fails here. It runs alone (marker serial): another worker's load
takes the client's CPU from under it, and a client that waits 70 ms for a core reads its first
token 70 ms late. The faults: test_truth_faults.py."""

import shutil

import polars as pl
import pytest
from conftest import REPO, run_snakemake

from speedsplit.output import truth
from speedsplit.core.formats import read_frame
from speedsplit.output import analyses
from speedsplit.planning import config as C


@pytest.fixture(scope="module")
def truth_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("truth")
    text = (REPO / "tests/config/truth.yaml").read_text()
    for data in ("mooncake-conversation-excerpt.jsonl", "agent-sessions.jsonl"):  # the workflow's folder is wd
        shutil.copy(REPO / "tests/data" / data, wd / data)
        text = text.replace(f"tests/data/{data}", str(wd / data))
    (wd / "truth.yaml").write_text(text)
    out = run_snakemake(["--configfile", "truth.yaml", "--cores", "2", "--resources", "gpu=2"], wd, timeout=900)
    (wd / "snakemake.out").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    cfg = C.load(wd / "truth.yaml")
    table = truth.compare(sorted((wd / "results/bench").rglob("run*.json")), **analyses.analysis_spec(cfg))
    (wd / "truth.txt").write_text(truth.text(table))
    return wd, table


def _why(wd, table) -> str:
    """What a failure shows first (a CI log keeps its head and its tail): the rows off their
    truth, each off run's requests' TTFTs and the client's stalls, the calibration; then the table."""
    from speedsplit.core.record import read_result
    from speedsplit.core.requestlog import read_requests, requests_path
    from speedsplit.measuring.calibrate import lines

    off = table.filter(~pl.col("within"))
    out = ["off their truth:", truth.text(off), ""]
    for what in off.filter(pl.col("kind") == "run")["what"].unique(maintain_order=True):
        stack, cell, run = what.split()
        for path in (wd / "results/bench").rglob(f"{stack}/*/{cell}/{run}.json"):
            res = read_result(path)
            ttft = [
                round((r.first_token - r.sent) * 1e3, 1)
                for r in read_requests(requests_path(path))
                if r.phase == "measured" and r.first_token is not None
            ]
            out.append(f"{what}: TTFTs {ttft} ms, client's longest stall {res.summary.client_stall_s}")
    cal = next((read_result(p).calibration for p in (wd / "results/bench").rglob("run*.json")), None)
    out += lines(cal) if cal else ["no calibration"]
    return "\n".join(out + ["", (wd / "truth.txt").read_text()])


@pytest.mark.slow
@pytest.mark.snakemake
@pytest.mark.serial
def test_every_run_lands_within_two_percent_of_its_truth(truth_run):
    wd, table = truth_run
    runs = table.filter(pl.col("kind") == "run")
    # 3 chain stacks x (u1, u8, open loop) + the capped one x (u8, open loop) + 2 trace stacks
    # + the five-fold pair x (u1, u6, open loop) + the chunked and the admitting-three at u6; 2 runs, 4 metrics;
    # + 4 session stacks and 2 on a session trace, 2 runs, those 4 and 3 of their own
    assert runs.height == (3 * 3 + 2 + 2 + 2 * 3 + 2) * 2 * 4 + (4 + 2) * 2 * 7
    sessions = {"first-turn TTFT p50", "returning-turn TTFT p50", "session p50"}
    assert set(runs["metric"]) == {"throughput", "TTFT p50", "TPOT p50", "E2E p50"} | sessions
    session_cells = set(runs.filter(pl.col("metric").is_in(sessions))["what"].str.split(" ").list.get(1))
    assert session_cells == {"s2-agent-greedy", "s2-agent-trace-greedy"}
    assert runs["within"].all(), _why(wd, runs)


@pytest.mark.slow
@pytest.mark.snakemake
@pytest.mark.serial
def test_every_factor_within_one_percent_and_the_intervals_hold_the_truth(truth_run):
    wd, table = truth_run
    factors = table.filter(pl.col("kind") == "factor")
    # closed loop (two numbers of users), open loop, a saturated stack, a trace: each has factors
    cells = {w.split()[2] for w in factors["what"]}
    assert {"u1-alone-greedy", "u8-truth-greedy", "r6-traffic-greedy", "x4-trace-greedy", "s2-agent-greedy",
            "s2-agent-trace-greedy"} <= cells  # fmt: skip
    assert any("saturated" in w for w in factors["what"])
    # The trace cell replays 12 requests a run, outputs scaled to a few tokens each: its p99 is
    # its slowest request, and one client hiccup on a 3-token answer moves that request's TPOT
    # by several percent (its TPOT p99 factor was 5.1% off, inside its interval, on a 2-core
    # Xeon, 2.1% on an EPYC). Its tails are judged by their intervals only (below), as are the
    # session trace's (five requests a run: its p99 is its slowest) and the five-fold pair's
    # open loop (20 requests a run: its p99 is its slowest, and the quick side's TTFT of 70 ms
    # moves 2.9% with a client hiccup of 2 ms; one serial run of five on a 2-core EPYC read its
    # TTFT p99 factor 2.63% off, inside its interval [3.90, 6.17]).
    few = (
        pl.col("what").str.contains("x4-trace-greedy")
        | pl.col("what").str.contains("s2-agent-trace-greedy")
        | (pl.col("what").str.contains("fivefold") & pl.col("what").str.contains("r6-traffic-greedy"))
    )
    one_request = few & pl.col("metric").str.ends_with("p99")
    # The five-fold pair's open-loop TTFT median: the quick side's first token (70 ms) is read
    # with the client's own delay under Poisson arrivals, which the calibration (closed loops)
    # takes out to within about a millisecond: 1% of 70 ms. Its factor read 0.23-0.54% off in
    # most serial runs and 1.03% in one (its interval [4.72, 5.24] holding 5): held within 2%.
    open_ttft = (
        pl.col("what").str.contains("fivefold")
        & pl.col("what").str.contains("r6-traffic-greedy")
        & (pl.col("metric") == "TTFT p50")
    )
    assert factors.filter(open_ttft & ((pl.col("measured") / pl.col("truth") - 1).abs() > 0.02)).is_empty()
    assert factors.filter(~pl.col("within") & ~one_request & ~open_ttft).is_empty(), _why(
        wd, table.filter(~one_request & ~open_ttft)
    )
    judged = factors.filter(pl.col("covered").is_not_null())
    assert judged.height == factors.height  # two runs a stack: every factor has its interval
    assert judged["covered"].sum() >= truth.COVERAGE * judged.height, (wd / "truth.txt").read_text()
    # the study's chain as the config made it: at one user 2.0 x 1.25 = 2.5; at eight the users
    # join over 0.35 s (ramp 0.4 s, 50 ms apart), which no stack speeds up: each throughput
    # factor is (0.35 s + two requests on the slower) / (0.35 s + two on the faster)
    e2e = {"ref-slow": 0.8 + 23 * 0.02, "ref-mid": 0.4 + 23 * 0.01, "ref-fast": 0.32 + 23 * 0.008}
    ramped = {s: 0.35 + 2 * t for s, t in e2e.items()}
    at_eight = [ramped["ref-slow"] / ramped["ref-mid"], ramped["ref-mid"] / ramped["ref-fast"]]
    at_eight.append(at_eight[0] * at_eight[1])
    for cell, want in (("u1-alone-greedy", [2.0, 1.25, 2.5]), ("u8-truth-greedy", at_eight)):
        rows = factors.filter(pl.col("what").str.starts_with(f"attribution study {cell}"))
        assert sorted(rows["truth"].to_list()) == pytest.approx(sorted(want), rel=1e-9), cell
    # 1.5 s a request against 0.3 s: five-fold at one user, the fast side's requests short
    # enough that the client's milliseconds are a percent of them (taken out: within 1%)
    five = factors.filter(pl.col("what") == "attribution fivefold u1-alone-greedy total")
    assert five["truth"].to_list() == pytest.approx([5.0], rel=1e-9)
    assert set(factors.filter(pl.col("what").str.contains("admits-three u6"))["within"]) == {True}
    # agent sessions: at 1,000 prompt tokens a second, a returning turn (its conversation so far
    # in its prompt) loses more to prefill than a first turn of 200 tokens (0.8 / 1.0)
    agent = factors.filter(pl.col("what") == "traffic prefill s2-agent-greedy total")
    truths = dict(zip(agent["metric"], agent["truth"]))
    assert truths["first-turn TTFT p50"] == pytest.approx(0.8 / 1.0, rel=1e-9)
    assert truths["returning-turn TTFT p50"] < truths["first-turn TTFT p50"] < 1
    # a card's prefix cache, then KV-cache offload: the card holds one first turn's conversation,
    # never a longer one, so a third turn finds its conversation only on the host
    kv = factors.filter(pl.col("what") == "traffic kv s2-agent-greedy ref-offload/ref-cache")
    truths = dict(zip(kv["metric"], kv["truth"]))
    assert truths["first-turn TTFT p50"] == pytest.approx(1.0, rel=1e-9) and truths["returning-turn TTFT p50"] > 1.05


@pytest.mark.slow
@pytest.mark.snakemake
@pytest.mark.serial
def test_every_step_says_why_within_two_percent_of_its_truth(truth_run):
    """The client-level mechanism (analysis/mechanism.py): a closed loop's factor is its
    latency's (in flight unchanged), an open loop's latency moves what is in flight; the time
    saved splits into the first token's and the decode's shares, each on its truth."""
    wd, table = truth_run
    why = table.filter(pl.col("kind") == "mechanism")
    assert why["within"].all(), _why(wd, why)
    study = why.filter(pl.col("what") == "mechanism study u1-alone-greedy ref-mid/ref-slow")
    truths = dict(zip(study["metric"], study["truth"]))
    # 1.26 s -> 0.63 s a request: 0.4 s of the 0.63 s saved before the first token, 0.23 s after
    assert truths["latency factor"] == pytest.approx(2.0, rel=1e-9)
    assert truths["TTFT share"] == pytest.approx(0.4 / 0.63, rel=1e-9)
    assert truths["decode share"] == pytest.approx(0.23 / 0.63, rel=1e-9)
    assert truths["in-flight factor"] == pytest.approx(1.0, abs=0.01)
    # the engine level: each request alone, one step a token, twice the steps a second
    assert truths["step-rate factor"] == pytest.approx(2.0, rel=1e-9)
    assert truths["tokens-a-step factor"] == pytest.approx(1.0, rel=1e-9)
    # open loop: the arrivals set the throughput (but for the last answers' ends), so in flight
    # falls nearly as the latency does: 1.16x the throughput for 2.0x the latency
    open_loop = why.filter(pl.col("what") == "mechanism study r6-traffic-greedy ref-mid/ref-slow")
    got = dict(zip(open_loop["metric"], open_loop["truth"]))
    assert got["latency factor"] == pytest.approx(2.0, rel=1e-9) and got["in-flight factor"] < 0.7
    # a speculative step's mechanism: ref-chunky drafts 4 tokens a step and accepts 17 of 24
    spec = why.filter(pl.col("what").str.starts_with("mechanism coalesced") & (pl.col("metric") == "acceptance"))
    assert spec.height and spec["truth"].to_list() == pytest.approx([17 / 24] * spec.height, rel=1e-9)
    # the answer says why beside every sentence, step by step
    answer = read_frame(wd / "results/tables/answer.parquet")
    assert answer.height and all(w and " end to end (" in w for w in answer["why"])


@pytest.mark.slow
@pytest.mark.snakemake
@pytest.mark.serial
def test_tokens_are_counted_from_the_text_where_the_stream_has_no_running_count(truth_run):
    """ref-quick sends usage in its last chunk only: every request's tokens are its text's,
    counted again with the model's tokenizer, and agree with usage; ref-chunky's four tokens a
    chunk are counted whole, and its runs say how many a chunk carried (its ITL is a chunk's)."""
    from speedsplit.core.record import read_result
    from speedsplit.core.requestlog import read_requests, requests_path

    wd, _ = truth_run
    seen = set()
    for path in (wd / "results/bench").rglob("run*.json"):
        res = read_result(path)
        if res.stack not in ("ref-quick", "ref-chunky") or res.cell.startswith("r"):
            continue
        seen.add(res.stack)
        records = [r for r in read_requests(requests_path(path)) if r.phase == "measured"]
        assert res.status == "ok" and not res.flags, (res.stack, res.cell, res.flags)
        assert all(r.text_tokens == r.output_tokens == r.usage_tokens == 24 for r in records)
        if res.stack == "ref-quick":
            assert {r.stream_count for r in records} == {"chunks"} and res.summary.tokens_per_chunk == 1.0
        else:
            assert {r.stream_count for r in records} == {"running"}
            assert res.summary.tokens_per_chunk == pytest.approx(24 / 7)  # 1, 4, 4, 4, 4, 4, 3
            assert res.summary.itl_s.median == pytest.approx(4 * 0.008, abs=0.002)
    assert seen == {"ref-quick", "ref-chunky"}


@pytest.mark.slow
@pytest.mark.snakemake
@pytest.mark.serial
def test_the_run_records_its_calibration_and_every_table_says_what_its_intervals_cover(truth_run):
    wd, _ = truth_run
    cal = read_frame(wd / "results/tables/calibration.parquet")
    assert sorted(cal["users"]) == [1, 1, 16] and (cal["ceiling_tok_s"] > 0).all()
    # the one user once more, its first tokens 400 ms away (as long as a 1-user cell's here)
    assert sorted(cal.filter(pl.col("users") == 1)["wait_s"]) == pytest.approx([0.05, 0.4])
    assert (cal["carried_ttft_s"] >= 0).all() and (cal["carried_ttft_s"] < 0.05).all()  # milliseconds
    assert cal["runs"].min() == len(list((wd / "results/bench").rglob("run*.json")))
    for name in ("attribution", "traffic_factors"):
        table = read_frame(wd / f"results/tables/{name}.parquet")
        # rows with a value (a chain's row at a cell one of its stacks skips has none)
        intervals = set(table.filter(pl.col("value").is_not_null())["interval"])
        assert all(i.startswith("95% t over runs") and "client's calibrated offset" in i for i in intervals), intervals
    assert set(read_frame(wd / "results/tables/cells.parquet")["interval"]) == {"95% t over runs"}
