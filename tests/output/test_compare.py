"""`speedsplit compare A B`: two result sets side by side, ratios B / A with intervals; each
side on one machine, the two sides on any."""

import pytest
from conftest import REPO
from records import fake_result, write_result

from speedsplit.core.record import read_result
from speedsplit.output import compare

CHAINS = {"study": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}


def write_side(root, speeds, gpu="Test CPU"):
    for stack, tok_s in speeds.items():
        for run in (0, 1):
            res = fake_result(stack, 8, run, tok_s * (1 + 0.01 * run))
            res.provenance.hardware.host_cpu = gpu
            write_result(root / f"bench/tiny/{stack}/tp1/u8-wide-greedy/run{run}.json", res)
    return root


def test_b_against_a_gives_each_stack_and_factor_as_a_ratio(tmp_path):
    a = write_side(tmp_path / "a", {"hf-fp16": 100.0, "vllm-fp16": 1000.0, "vllm-marlin": 1200.0})
    b = write_side(tmp_path / "b", {"hf-fp16": 100.0, "vllm-fp16": 1500.0, "vllm-marlin": 1500.0}, gpu="Other CPU")
    said = compare.compare(a, b, CHAINS, tmp_path / "out")
    assert said[0].startswith(f"A = {a}: CPU: Test CPU") and said[1].startswith(f"B = {b}: CPU: Other CPU")
    line = next(s for s in said if s.startswith("vllm-fp16/hf-fp16"))
    assert "A 10×, B 15×, B/A 1.5× [1.46, 1.54]" in line  # runs 1% apart on each side: t over 4 groups of 2
    line = next(s for s in said if s.startswith("vllm-marlin/vllm-fp16"))
    assert "A 1.2×, B 1×, B/A 0.833×" in line
    assert any(s.startswith("vllm-fp16 at u8-wide-greedy (tiny, tp1): output tok/s A 1005, B 1507") for s in said)
    page = (tmp_path / "out" / "compare.html").read_text()
    assert "Test CPU" in page and "Other CPU" in page and (tmp_path / "out/tables/compare_factors.csv").is_file()


def test_runs_a_side_leaves_out_are_said_with_their_causes(tmp_path):
    """A stack whose every run failed on B has no ratio: the lines say which runs were left out
    and why, instead of the stack vanishing without a word."""
    a = write_side(tmp_path / "a", {"hf-fp16": 100.0, "vllm-fp16": 1000.0})
    b = write_side(tmp_path / "b", {"hf-fp16": 100.0})
    for run in (0, 1):
        res = fake_result("vllm-fp16", 8, run, None, status="server_died")
        write_result(b / f"bench/tiny/vllm-fp16/tp1/u8-wide-greedy/run{run}.json", res)
    said = compare.compare(a, b, CHAINS, tmp_path / "out")
    assert (
        "Left out on B (2): vllm-fp16 at u8-wide-greedy run0: server_died; vllm-fp16 at u8-wide-greedy run1: server_died"
        in said
    )
    assert not any(s.startswith("Left out on A") for s in said)
    assert not any(s.startswith("vllm-fp16 at u8-wide-greedy (tiny, tp1)") for s in said)  # no ratio of it


def test_a_cell_of_one_name_but_another_load_on_each_side_is_said(tmp_path):
    a = write_side(tmp_path / "a", {"hf-fp16": 100.0, "vllm-fp16": 1000.0})
    b = write_side(tmp_path / "b", {"hf-fp16": 100.0, "vllm-fp16": 1500.0})
    for path in (b / "bench/tiny/vllm-fp16").rglob("run*.json"):
        res = read_result(path)
        res.job.cell.requests_per_user = 8
        write_result(path, res)
    said = compare.compare(a, b, CHAINS, tmp_path / "out")
    warning = (
        "warning: u8-wide-greedy (tiny) is another load on each side: requests_per_user 2 vs 8 (A vs B; "
        "vllm-fp16): its ratios set two experiments side by side"
    )
    assert said[2] == warning and warning in (tmp_path / "out/compare.html").read_text()
    assert not any(s.startswith("warning") for s in compare.compare(a, a, CHAINS, tmp_path / "out2"))


def test_a_side_mixing_machines_or_holding_no_result_is_one_line(tmp_path):
    a = write_side(tmp_path / "a", {"hf-fp16": 100.0})
    write_side(tmp_path / "a2", {"vllm-fp16": 100.0}, gpu="Other CPU")
    (tmp_path / "a2/bench/tiny/vllm-fp16").rename(tmp_path / "a/bench/tiny/vllm-fp16")
    with pytest.raises(SystemExit, match=r"a: results measured on 2 kinds of hardware"):
        compare.compare(a, a, CHAINS, tmp_path / "out")
    with pytest.raises(SystemExit, match=r"no result files under .*empty/bench"):
        compare.compare(tmp_path / "empty", a, CHAINS, tmp_path / "out")


def test_each_step_says_its_why_on_each_side(tmp_path):
    """Under each factor, each side's why: as its client and engine saw it, and kernel by kernel
    where that side profiled both stacks (here the same H100 folder on both sides)."""
    import polars as pl

    ev = REPO / "docs/evidence/h100-2026-12-06-why"
    said = compare.compare(ev, ev, {"study": ["vllm-fp16", "vllm-marlin"]}, tmp_path / "out")
    at = next(i for i, s in enumerate(said) if s.startswith("vllm-marlin/vllm-fp16 at u64-h200-wide-greedy"))
    assert [s.split(":")[0] for s in said[at + 1 : at + 5]] == [
        "    why on A, as the client saw it",
        "    why on A, kernel by kernel",
        "    why on B, as the client saw it",
        "    why on B, kernel by kernel",
    ]
    assert "decode step 8.39 → 7.36 ms" in said[at + 2] and said[at + 2].endswith(said[at + 4].split(": ", 1)[1])
    why = pl.read_csv(tmp_path / "out/tables/compare_why.csv")
    assert why.height == 2 and (why["why_kernels_a"] == why["why_kernels_b"]).all()


COMMITTED = {
    # folder under docs/comparisons: (A, B, config files), as each folder's README builds it
    "h200-chain-11-29-vs-11-30": ("h200-2026-11-29-remeasured", "h200-2026-11-30-chain", ["config/h200-smoke.yaml"]),
    "h200-gptq-checkpoint-vs-engine-int4": (
        "h200-2026-12-01-engine-int4",
        "h200-2026-12-01-formats",
        ["config/h200-smoke.yaml", "config/h200-formats.yaml"],
    ),
}


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_comparisons_rebuild(name, tmp_path):
    from speedsplit.planning import config as C

    a, b, configs = COMMITTED[name]
    ev, done = REPO / "docs/evidence", REPO / "docs/comparisons" / name
    cfg = C.load(*[REPO / c for c in configs])
    compare.compare(ev / a, ev / b, cfg.chains, tmp_path)
    for table in ("compare_factors", "compare_stacks"):
        assert (tmp_path / "tables" / f"{table}.csv").read_text() == (done / "tables" / f"{table}.csv").read_text()


def test_every_committed_comparison_is_rebuilt_here():
    assert sorted(p.name for p in (REPO / "docs/comparisons").iterdir() if p.is_dir()) == sorted(COMMITTED)


def test_each_stacks_quality_is_compared_too(tmp_path, tiny_model):
    """A stack probed on both sides: B's perplexity over A's and how many of its continuations
    B says as A did, against reference servers whose answers differ by a known amount."""
    import math

    from speedsplit.core.quality import QualityProbe
    from speedsplit.probes import quality
    from speedsplit.serving import reference as R
    from speedsplit.serving.reference_answers import Answers
    from speedsplit.serving.reference_speed import Speed

    probe = QualityProbe(prompts=8, prompt_tokens=8, output_tokens=12, windows=4, window_tokens=24)
    sides = {}
    for name, answers in (("a", Answers(nll=1.0)), ("b", Answers(nll=1.1, diverge_every=2, diverge_at=3))):
        url = R.serve_in_thread(
            R.make_app(Speed(0.0, 0.0), served_name="m", model_dir=str(tiny_model), answers=answers)
        )
        root = write_side(tmp_path / name, {"vllm-fp16": 1000.0})
        path = root / "bench/tiny/vllm-fp16/tp1/u8-wide-greedy/run0.json"
        res = read_result(path)
        res.quality = quality.run(url, "m", "vllm", probe, tiny_model)
        write_result(path, res)
        sides[name] = (root, res.quality)
    said = compare.compare(sides["a"][0], sides["b"][0], CHAINS, tmp_path / "out")
    line = next(s for s in said if s.startswith("quality of vllm-fp16 (tiny, tp1): "))
    agree = sum(x.ids == y.ids for x, y in zip(sides["a"][1].outputs, sides["b"][1].outputs))
    assert 0 < agree < probe.prompts
    assert f"B/A {math.exp(0.1):.3g}× [{math.exp(0.1):.3g}, {math.exp(0.1):.3g}]" in line
    assert f"{agree}/{probe.prompts} continuations the same (token ids)" in line
    assert (tmp_path / "out/tables/compare_quality.csv").is_file()


def test_each_stacks_task_scores_are_compared_too():
    """A task metric lm-eval scored on both sides (the record's `tasks`): B less A with the interval
    of two independent standard errors; a metric on one side only is not compared."""
    import math

    from speedsplit.core.quality import QualityProbe, QualityRecord, TaskScore

    def rec(value, stderr, extra=()):
        tasks = [TaskScore(task="t", metric="acc,none", value=value, stderr=stderr, samples=60), *extra]
        return {("tiny", "tp1", "vllm-fp16"): QualityRecord(status="ok", probe=QualityProbe(), tasks=tasks)}

    only_b = TaskScore(task="t", metric="acc_norm,none", value=0.5, stderr=0.1, samples=60)
    tasks = compare.tasks_frame(rec(0.30, 0.03), rec(0.35, 0.04, [only_b]))
    (row,) = tasks.iter_rows(named=True)
    half = 1.959963984540054 * math.hypot(0.03, 0.04)
    assert row["metric"] == "acc,none" and math.isclose(row["b_minus_a"], 0.05)
    assert math.isclose(row["lo"], 0.05 - half) and math.isclose(row["hi"], 0.05 + half)
    line = compare.lines(tasks.clear(), tasks.clear(), None, tasks)[0]
    assert line == f"t acc of vllm-fp16 (tiny, tp1): A 0.3, B 0.35, B−A +0.05 [{0.05 - half:+.3g}, {0.05 + half:+.3g}]"


def test_two_sides_of_different_models_say_the_models_differ(tmp_path):
    """Not 'no stack measured cleanly': the two sides measured other models."""
    a = write_side(tmp_path / "a", {"hf-fp16": 100.0, "vllm-fp16": 1000.0})
    b = write_side(tmp_path / "b", {"hf-fp16": 100.0, "vllm-fp16": 1500.0})
    for path in (b / "bench").rglob("run*.json"):
        res = read_result(path)
        res.model = "other"
        write_result(b / "bench/other" / path.relative_to(b / "bench/tiny"), res)
        path.unlink()
    said = compare.compare(a, b, CHAINS, tmp_path / "out")
    assert said[-1] == (
        "nothing to compare: the models differ (A measured tiny; B measured other): "
        "compare two result sets of the same model"
    )


def test_each_side_priced_says_what_a_million_tokens_cost_on_it(tmp_path, capsys):
    from speedsplit import cli
    from speedsplit.analysis.cost import priced_at

    a = write_side(tmp_path / "a", {"hf-fp16": 100.0, "vllm-fp16": 1000.0})
    b = write_side(tmp_path / "b", {"hf-fp16": 100.0, "vllm-fp16": 1500.0}, gpu="Other CPU")
    said = compare.compare(a, b, CHAINS, tmp_path / "out", prices=(priced_at(3.6), priced_at(7.2)))
    # $3.60 an hour over 1005 tok/s; B's hour costs twice A's for 1.5x the tokens: 1.33x the cost
    line = next(s for s in said if s.startswith("cost of vllm-fp16 at u8-wide-greedy"))
    assert "a million output tokens A $0.995, B $1.33, B/A 1.33× [" in line and "(an hour: A $3.6, B $7.2)" in line
    assert (tmp_path / "out/tables/compare_cost.csv").read_text().count("\n") == 3  # header, two stacks
    # one side unpriced: no cost said, the page says why
    said = compare.compare(a, b, CHAINS, tmp_path / "out2", prices=(priced_at(3.6), None))
    assert not any(s.startswith("cost of") for s in said)
    assert "Not priced on both sides." in (tmp_path / "out2/compare.html").read_text()
    # from the command line, a price that is not one is refused in one line
    with pytest.raises(SystemExit):
        cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "o3"), "--card-hour-usd-b", "-1"])
    assert "--card-hour-usd-b: '-1' is not a price in dollars above 0" in capsys.readouterr().err
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "o4"), "--card-hour-usd-a", "3.6",
                     "--card-hour-usd-b", "7.2"]) == 0  # fmt: skip
    assert "cost of vllm-fp16 at u8-wide-greedy" in capsys.readouterr().out
