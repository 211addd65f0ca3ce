"""The answer first: step names from the stacks, headline cells, the one-sentence
decomposition, the waterfall whose bars add up on the log axis, and what qualifies them."""

import math

import polars as pl
import pytest
from records import fake_result, write_result

from speedsplit.analysis import answer as A
from speedsplit.output import aggregate
from speedsplit.planning import config as C

from speedsplit.planning import grid as G

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
STEPS = {"study": ["runtime", "INT4 weights + kernel"]}
# median output tok/s per (stack, users)
RATES = {("hf-fp16", 2): 50.0, ("vllm-fp16", 2): 400.0, ("vllm-marlin", 2): 500.0}
RATES |= {("hf-fp16", 8): 100.0, ("vllm-fp16", 8): 1200.0, ("vllm-marlin", 8): 1000.0}


@pytest.fixture
def frames(tmp_path):
    paths = []
    for (stack, users), rate in RATES.items():
        for run, wobble in enumerate((0.97, 1.0, 1.03)):
            paths.append(
                write_result(tmp_path / f"{stack}-{users}-{run}.json", fake_result(stack, users, run, rate * wobble))
            )
    return aggregate.build_frames(paths, CHAINS, steps=STEPS)


def test_the_headline_is_the_most_users_by_default_or_the_configured_cells(frames):
    att = frames["attribution"]
    assert set(att.filter("headline")["users"].to_list()) == {8}
    chosen = A.with_headline(att.drop("headline"), [{"users": 2, "workload": "wide"}])
    assert set(chosen.filter("headline")["users"].to_list()) == {2}


def test_the_sentence_states_each_step_with_its_interval_and_the_total(frames):
    (sentence,) = frames["answer"]["sentence"].to_list()
    assert sentence.startswith(
        "study (hf-fp16 → vllm-fp16 → vllm-marlin) at 8 users × 8 in / 16 out tokens, greedy (tiny, tp1): "
    )  # every stack of the chain named, its middle one too
    att = frames["attribution"]
    total = att.filter((att["position"] == 0) & att["headline"]).row(0, named=True)
    assert (
        "runtime 12× [" in sentence
        and "× INT4 weights + kernel (on the CPU: CPUWNA16LinearKernel) 0.833× [" in sentence
    )
    assert sentence.endswith(f"= 10× [{total['lo']:.3g}, {total['hi']:.3g}] (95% intervals over 3 runs a stack).")


def test_the_sentence_says_what_no_difference_means_and_why_one_run_has_no_interval(frames):
    att = frames["attribution"]
    holds_one = att.with_columns(lo=pl.col("value") * 0.5, hi=pl.col("value") * 2.0)
    (said,) = A.sentences(holds_one, CHAINS)["sentence"].to_list()
    assert said.endswith("(95% intervals over 3 runs a stack; no difference shown: the interval holds 1).")
    one_run = att.with_columns(lo=None, hi=None, runs_used=pl.col("runs_used") // 3)
    (said,) = A.sentences(one_run, CHAINS)["sentence"].to_list()
    assert "[no interval: one run]" in said
    assert said.endswith("(one run a stack: no interval; set grid.runs to 2 or more for one).")


def test_the_waterfall_bars_add_up_to_the_total_on_the_log_axis(frames):
    w = A.waterfall_frame(frames["attribution"])
    assert w["bar"].to_list() == ["1. runtime", "2. INT4 weights + kernel", "= total"]
    runtime, quant, total = w.iter_rows(named=True)
    assert (runtime["start"], runtime["end"]) == (1.0, pytest.approx(12.0))
    assert (quant["start"], quant["end"]) == (
        pytest.approx(12.0),
        pytest.approx(10.0),
    )  # it slows down: a bar downwards
    assert quant["direction"] == "slows down" and (total["start"], total["end"]) == (1.0, pytest.approx(10.0))
    lengths = A.log_lengths(w).row(0, named=True)
    assert lengths["factors"] == pytest.approx(lengths["total"]) == pytest.approx(math.log(10.0))
    A.check_adds_up(w)
    broken = w.with_columns(w["end"] * pl.Series([1.0, 1.1, 1.0]))
    with pytest.raises(AssertionError, match="factors"):
        A.check_adds_up(broken)


def test_an_undefined_decomposition_has_no_waterfall_and_is_said(tmp_path):
    paths = [write_result(tmp_path / f"{s}.json", fake_result(s, 8, 0, 100.0)) for s in ("hf-fp16", "vllm-fp16")]
    frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
    assert A.waterfall_frame(frames["attribution"]).height == 0
    # a stack these results never measured: no sentence, one line among the qualifiers
    assert frames["answer"].height == 0 and frames["answer"].columns[-5:] == [
        "sentence",
        "why",
        "quality",
        "cost",
        "why_kernels",
    ]
    (line,) = A.qualifiers(frames["runs"], frames["attribution"])
    assert line == "Chain study is not decomposed at 1 headline cell(s): vllm-marlin not measured here"
    # a stack measured, but with no run that counts: said in the sentence
    paths.append(write_result(tmp_path / "m.json", fake_result("vllm-marlin", 8, 0, 90.0, flags=["kernel_mismatch"])))
    frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
    (sentence,) = frames["answer"]["sentence"].to_list()
    # the factor both of whose stacks counted is given; the total is not
    assert "partial, runtime 1× " in sentence and " measured; no total (" in sentence
    assert "vllm-marlin: no clean run (run0: kernel_mismatch)" in sentence
    lines = A.qualifiers(frames["runs"], frames["attribution"])
    assert any(q.startswith("Not decomposable: chain study") for q in lines)


def test_qualifiers_name_kernel_mismatches_short_runs_and_failed_starts(tmp_path):
    paths = [
        write_result(tmp_path / f"{s}-{r}.json", fake_result(s, 8, r, 100.0 + r))
        for s in CHAINS["study"]
        for r in (0, 1)
    ]
    paths.append(write_result(tmp_path / "k.json", fake_result("vllm-marlin", 8, 2, 90.0, flags=["kernel_mismatch"])))
    paths.append(write_result(tmp_path / "s.json", fake_result("vllm-fp16", 8, 2, 90.0, flags=["short_measurement"])))
    paths.append(write_result(tmp_path / "f.json", fake_result("hf-fp16", 8, 2, None, status="startup_failed")))
    frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
    text = "\n".join(A.qualifiers(frames["runs"], frames["attribution"]))
    assert "ran another kernel than the one asked for" in text and "vllm-marlin u8-wide-greedy run2" in text
    assert "measured for less than" in text and "vllm-fp16 u8-wide-greedy run2" in text
    assert "did not complete" in text and "startup_failed" in text
    assert "skipped" not in text
    paths.append(write_result(tmp_path / "c.json", fake_result("vllm-fp16", 96, 0, None, status="skipped")))
    frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
    lines = A.qualifiers(frames["runs"], frames["attribution"])
    assert "1 capacity level(s) not measured, past the cliff (skipped): vllm-fp16: 96 users" in lines
    assert not any("did not complete" in q and "skipped" in q for q in lines)  # not a failure
    assert "Left out of the headline numbers" in text  # the flagged runs were excluded
    clean = aggregate.build_frames(paths[:6], CHAINS, steps=STEPS)
    assert A.qualifiers(clean["runs"], clean["attribution"]) == []


def test_a_factor_whose_interval_holds_1_says_no_difference_is_shown_and_a_wide_spread_is_said(tmp_path):
    """The demo's INT4 step came out 1.11x [0.81, 1.42] in one run and 0.946x [0.46, 1.5] in the
    next: neither is an answer. And runs 2.3x apart are said on the first screen."""
    spread = {"hf-fp16": (100.0, 101.0), "vllm-fp16": (1000.0, 1010.0), "vllm-marlin": (700.0, 1400.0)}
    paths = [
        write_result(tmp_path / f"{s}-{r}.json", fake_result(s, 8, r, tok_s))
        for s, runs in spread.items()
        for r, tok_s in enumerate(runs)
    ]
    frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
    (sentence,) = frames["answer"]["sentence"].to_list()
    int4 = frames["attribution"].filter(pl.col("step") == "INT4 weights + kernel").row(0, named=True)
    assert int4["lo"] < 1 < int4["hi"]
    # vllm-marlin ran vLLM's CPU kernel here: the step's name says so
    assert (
        f"INT4 weights + kernel (on the CPU: CPUWNA16LinearKernel) 0.985× [{int4['lo']:.3g}, {int4['hi']:.3g}] (no difference shown) ="
        in sentence
    )
    assert "runtime 10× [" in sentence and "runtime 10× [no" not in sentence  # 10x holds no 1: said as it is
    lines = A.qualifiers(frames["runs"], frames["attribution"])
    assert lines == [
        "Runs of 1 stack(s) disagree by more than 25% (run-to-run spread; their factors' intervals are as wide "
        "as that): vllm-marlin at u8-wide-greedy 700-1400 tok/s (2×)"
    ]


def test_runs_that_disagree_say_whether_the_host_itself_moved_under_them(tmp_path):
    """The run records' host speed (a fixed piece of work before and after each load): where the
    runs that disagree saw the host move 1.4x, the spread line says the machine changed; where it
    held within 10%, it says so and that a change within a load is not seen."""
    from speedsplit.core.facts import HostSpeed

    def line(after_ms):
        paths = []
        for s, runs in {
            "hf-fp16": (100.0, 101.0),
            "vllm-fp16": (1000.0, 1010.0),
            "vllm-marlin": (700.0, 1400.0),
        }.items():
            for r, tok_s in enumerate(runs):
                res = fake_result(s, 8, r, tok_s)
                res.host_speed = HostSpeed(before_ms=35.0, after_ms=after_ms if r else 35.0)
                paths.append(write_result(tmp_path / f"{s}-{r}-{after_ms}.json", res))
        frames = aggregate.build_frames(paths, CHAINS, steps=STEPS)
        assert frames["runs"]["host_speed_moved"].to_list() == [1.0, after_ms / 35.0] * 3
        (said,) = A.qualifiers(frames["runs"], frames["attribution"])
        return said

    moved = line(49.0)  # 35 ms -> 49 ms: 1.4x
    assert moved.endswith(
        "vllm-marlin at u8-wide-greedy 700-1400 tok/s (2×). The host's own speed moved up to 1.4× across their "
        "loads (a fixed piece of work timed on the client's core before and after each): the machine changed under them"
    )
    held = line(36.0)  # 1.03x
    assert held.endswith(
        "(2×). The host's own speed was within 10% before and after each of their loads (a fixed piece of work "
        "timed on the client's core; a change within a load is not seen)"
    )


def test_step_names_follow_what_changes_between_the_stacks():
    given = C.load().filled()  # its stacks resolved: each one's whole command line

    def chained(chains: dict):
        """The config with exactly these chains, validated; benchmarking the study's stacks (by
        default every chain's are, and a CPU refuses the offload stack)."""
        benchmark = {**given["benchmark"], "stacks": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}
        return C.validate({**given, "chains": chains, "benchmark": benchmark})

    chains = {
        "study": ["hf-fp16", "vllm-fp16", "vllm-marlin"],
        "format": ["hf-fp16", "vllm-fp16", "vllm-gptq-triton", "vllm-marlin"],
        "hf": ["hf-generate", "hf-fp16", "vllm-fp16"],
        "prefix": ["vllm-fp16-noprefix", "vllm-fp16"],
        "speculative": ["vllm-fp16", "vllm-fp16-ngram"],
        "offload": ["vllm-fp16-noprefix", "vllm-fp16", "vllm-fp16-offload"],
    }
    assert G.chain_steps(chained(chains)) == {
        "study": ["runtime", "INT4 weights + kernel"],
        "format": ["runtime", "INT4 format", "kernel"],
        "hf": ["scheduler", "runtime"],
        "prefix": ["prefix caching"],
        "speculative": ["speculative decoding (ngram)"],
        "offload": ["prefix caching", "KV-cache offload (native)"],
    }
    given["stacks"]["vllm-fp16-noprefix"]["args"] += ["--max-num-seqs", "8"]  # more than the switch: not that step
    cfg = chained(chains)
    assert G.chain_steps(cfg)["prefix"] == ["configuration"]
    assert G.kernel_reference(cfg) == "vllm-fp16"
    # two FP16-to-FP16 steps of one chain never read alike: stock generate() at another batch
    # ceiling is its own step, and steps that would share a name each name their stacks
    chains = {
        "hf": ["hf-generate", "hf-generate-b64", "hf-fp16"],
        "twice": ["vllm-fp16-noprefix", "vllm-fp16", "vllm-fp16-noprefix"],
    }
    steps = G.chain_steps(chained(chains))
    assert steps["hf"] == ["batch ceiling", "scheduler"]
    assert steps["twice"] == [
        "configuration (vllm-fp16-noprefix → vllm-fp16)",
        "configuration (vllm-fp16 → vllm-fp16-noprefix)",
    ]


def test_the_waterfall_draws_each_factors_interval_where_its_bar_ends(frames):
    from speedsplit.output import plots

    w = A.waterfall_frame(frames["attribution"])
    spec = plots.waterfall_chart(w, frames["cells"]).to_dict()
    (data,) = spec["datasets"].values()
    quant = next(r for r in data if r["bar"] == "2. INT4 weights + kernel")
    row = w.filter(pl.col("bar") == "2. INT4 weights + kernel").row(0, named=True)
    assert (quant["end_lo"], quant["end_hi"]) == pytest.approx((row["start"] * row["lo"], row["start"] * row["hi"]))
    whiskers = [m for m in spec["spec"]["layer"] if m["mark"]["type"] == "rule" and "y2" in m["encoding"]]
    assert [(m["encoding"]["y"]["field"], m["encoding"]["y2"]["field"]) for m in whiskers] == [("shown_lo", "shown_hi")]
    assert (quant["shown_lo"], quant["shown_hi"]) == (quant["end_lo"], quant["end_hi"]) and not quant["off_hi"]
    # an interval far wider than the axis (two runs far apart) stops at its edge with an arrow
    wide = w.with_columns(pl.when(pl.col("factor") == "total").then(50.0).otherwise(pl.col("hi")).alias("hi"))
    spec = plots.waterfall_chart(wide, frames["cells"]).to_dict()
    (data,) = spec["datasets"].values()
    total = next(r for r in data if r["bar"] == "= total")
    axis = next(m for m in spec["spec"]["layer"] if m["mark"]["type"] == "bar")["encoding"]["y"]["scale"]["domain"]
    assert total["end_hi"] > axis[1] and total["shown_hi"] == axis[1] and total["off_hi"] == "▲"
    assert any(
        m["mark"]["type"] == "text" and m["encoding"]["text"]["field"] == "off_hi" for m in spec["spec"]["layer"]
    )


def test_the_first_screen_names_the_kernel_each_stack_ran_beside_its_name(frames):
    """vllm-marlin on a CPU runs vLLM's CPU kernel: the name says what was asked, the table what ran."""
    from speedsplit.output.report import headline_stacks

    served = headline_stacks(frames["attribution"], frames["cells"], CHAINS)
    kernels = dict(zip(served["stack"], served["kernel that ran"]))
    assert kernels == {"hf-fp16": "none reported", "vllm-fp16": "none reported", "vllm-marlin": "CPUWNA16LinearKernel"}
