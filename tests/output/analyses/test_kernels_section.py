"""The INT4 kernel sweep as an analysis (output/analyses/kernels.py): when the config turns it on
and which FP16 stack it measures against, the table it builds from the runs (clean runs only), its
first-screen block (a line per cell, fastest kernel first) and its report section."""

import math

import polars as pl
import pytest
from records import fake_result

from speedsplit.analysis import frames as F
from speedsplit.analysis.kernels import SCHEMA
from speedsplit.output.analyses import Basis, analysis_spec, table_names
from speedsplit.output.analyses import kernels as K
from speedsplit.planning import config as C

REF = {"reference": "vllm-fp16"}
# Each stack's output tok/s in runs 0, 1, 2. The reference agrees with itself exactly; Machete
# doubles from run to run (geometric mean 400: 4x the reference); Marlin is 1.5x in every run.
SPEED = {"vllm-fp16": (100, 100, 100), "vllm-gptq-machete": (200, 400, 800), "vllm-marlin": (150, 150, 150)}
KERNEL = {"vllm-gptq-machete": "MacheteLinearKernel", "vllm-marlin": "MarlinLinearKernel"}
# Machete over the reference, each side's runs apart (Welch): the reference has no spread, so
# the interval is Machete's own, log sd ln 2 over 3 runs, t(0.975, 2 df) = 4.3027 standard errors:
# 4x [4 / W, 4 W] with W = 2^(4.3027 / sqrt 3) = 5.595, i.e. [0.715, 22.4].
W = 2 ** (4.302652729749752 / math.sqrt(3))


def run(stack, run, tok, users=8, **kw):
    """Run `run` of a stack at u{users}: an FP16 stack, or a GPTQ one whose engine reported KERNEL."""
    res = fake_result(stack, users, run, None if tok is None else float(tok), **kw)
    variant = "gptq" if stack in KERNEL else "fp16"  # (fake_result's own: gptq for a stack named marlin)
    res.job.stack = res.job.stack.model_copy(update={"variant": variant})
    res.engine.linear_kernel = KERNEL.get(stack)
    return res


def sweep(speed=SPEED, users=8, **kw) -> list:
    return [run(s, r, tok, users, **kw) for s, toks in speed.items() for r, tok in enumerate(toks)]


def measured(results, spec=REF, tolerate=()) -> dict[str, pl.DataFrame]:
    """The analysis's tables, as aggregate builds them from these runs."""
    runs = F.runs_frame(results)
    cells = F.cells_frame(runs, tolerate)
    chains = {"kernel": ["vllm-fp16", "vllm-gptq-machete", "vllm-marlin"]}
    return K.build(
        Basis(runs=runs, cells=cells, by_throughput=pl.DataFrame(), chains=chains, tolerate_flags=tolerate, spec=spec)
    )


def rows(frame: pl.DataFrame) -> dict[tuple[str, str], dict]:
    return {(r["cell"], r["stack"]): r for r in frame.iter_rows(named=True)}


def test_two_gptq_stacks_and_an_fp16_stack_before_them_turn_the_sweep_on_against_that_stack():
    one = C.load()  # the study chain: hf-fp16, vllm-fp16, vllm-marlin (one GPTQ stack: no sweep)
    chain = {"kernel": ["hf-fp16", "vllm-fp16", "vllm-gptq-machete", "vllm-marlin"]}
    two_chains = C.merge(C.read_yaml(C.DEFAULT_CONFIG), {"chains": chain})
    two = C.validate(two_chains)
    assert K.enabled(two) and K.spec(two) == REF and analysis_spec(two)["specs"]["kernels"] == REF
    assert not K.enabled(one) and "kernels" not in analysis_spec(one)["specs"]
    assert "kernels" in table_names(two) and "kernels" not in table_names(one)
    named = C.validate(C.merge(two_chains, {"report": {"kernel_reference": "hf-fp16"}}))
    assert K.spec(named) == {"reference": "hf-fp16"}  # the config's own choice comes first
    # both GPTQ stacks in a chain but only one benchmarked: no sweep
    alone = C.validate(C.merge(two_chains, {"benchmark": {"stacks": ["hf-fp16", "vllm-fp16", "vllm-marlin"]}}))
    assert not K.enabled(alone)


def test_without_a_reference_nothing_is_built_and_there_is_no_section_or_answer():
    assert K.build(Basis(runs=pl.DataFrame(), cells=pl.DataFrame(), by_throughput=pl.DataFrame(), chains={})) == {}
    assert measured(sweep(), spec=None) == {}
    assert K.section({}, {}) == "" and K.answer({}) == ""


def test_each_gptq_stack_over_the_reference_with_the_kernel_its_engine_reported():
    frame = measured(sweep())["kernels"]
    assert frame.schema == pl.Schema(SCHEMA)
    got = rows(frame)
    assert list(got) == [("u8-wide-greedy", "vllm-gptq-machete"), ("u8-wide-greedy", "vllm-marlin")]  # no FP16 row
    machete, marlin = got.values()
    assert (machete["kernel"], machete["reference"], machete["runs_used"]) == ("MacheteLinearKernel", "vllm-fp16", 6)
    assert machete["output_tok_s"] == pytest.approx(400.0)  # (200 x 400 x 800)^(1/3)
    assert (machete["vs_reference"], machete["lo"], machete["hi"]) == pytest.approx((4.0, 4 / W, 4 * W))
    # three runs that agree exactly: an interval of no width, not none
    assert (marlin["vs_reference"], marlin["lo"], marlin["hi"]) == pytest.approx((1.5, 1.5, 1.5))
    assert (marlin["users"], marlin["workload"], marlin["sampling"], marlin["topology"]) == (8, "wide", "greedy", "tp1")


def test_the_answer_is_a_line_per_cell_fastest_kernel_first_and_the_section_shows_the_table():
    frames = measured(sweep() + sweep(users=2, speed={s: v[:1] for s, v in SPEED.items()}))
    html = K.answer(frames)
    assert html == (
        "<h3>INT4 kernels against FP16</h3>"
        # one run a stack at 2 users: a factor with no interval (200 / 100, 150 / 100)
        "<p class='headline'>INT4 over vllm-fp16 at 2 users (wide; tiny, tp1): "
        "MacheteLinearKernel 2×; MarlinLinearKernel 1.5×</p>"
        "<p class='headline'>INT4 over vllm-fp16 at 8 users (wide; tiny, tp1): "
        "MacheteLinearKernel 4× [0.715, 22.4]; MarlinLinearKernel 1.5× [1.5, 1.5]</p>"
    )
    section = K.section(frames, {})
    assert section.startswith("<h2>INT4 kernels</h2>\n<p class='note'>Each GPTQ stack")
    assert "<th>vs_reference</th>" in section and section.count("<tr><td>tiny</td>") == 4
    assert "<td>u2-wide-greedy</td><td>2</td><td>wide</td><td>greedy</td><td>vllm-gptq-machete</td>" in section
    two = rows(frames["kernels"])[("u2-wide-greedy", "vllm-gptq-machete")]
    assert (two["vs_reference"], two["lo"], two["hi"], two["runs_used"]) == (2.0, None, None, 2)


def test_a_kernel_that_changed_between_runs_names_both_and_one_not_reported_is_named_by_its_stack():
    results = sweep()
    results[4].engine.linear_kernel = "ExllamaLinearKernel"  # Machete's run 1
    for res in results[6:]:  # Marlin's engine named no kernel
        res.engine.linear_kernel = None
    frame = measured(results)
    got = rows(frame["kernels"])
    assert got[("u8-wide-greedy", "vllm-gptq-machete")]["kernel"] == "ExllamaLinearKernel, MacheteLinearKernel"
    assert got[("u8-wide-greedy", "vllm-marlin")]["kernel"] is None
    assert "ExllamaLinearKernel, MacheteLinearKernel 4× [0.715, 22.4]; vllm-marlin 1.5× [1.5, 1.5]" in K.answer(frame)


def test_failed_and_flagged_runs_count_in_no_factor_and_a_cell_without_a_clean_reference_has_no_row():
    results = sweep()
    results[5] = run("vllm-gptq-machete", 2, None, status="server_died")  # Machete's 800 is gone: 200, 400
    results[6].flags.append("kernel_mismatch")  # Marlin's run 0 ran another kernel than it asked for
    reference_died = [run(s, 0, tok[0], users=2) for s, tok in SPEED.items()]
    reference_died[0] = run("vllm-fp16", 0, None, users=2, status="server_hung")
    frame = measured(results + reference_died)["kernels"]
    got = rows(frame)
    assert set(got) == {("u8-wide-greedy", "vllm-gptq-machete"), ("u8-wide-greedy", "vllm-marlin")}  # no u2 row
    machete, marlin = got.values()
    assert machete["output_tok_s"] == pytest.approx(math.sqrt(200 * 400)) and machete["runs_used"] == 2 + 3
    assert machete["vs_reference"] == pytest.approx(math.sqrt(8))  # 283 / 100
    assert marlin["runs_used"] == 2 + 3
    tolerated = rows(measured(results, tolerate=("kernel_mismatch",))["kernels"])
    assert tolerated[("u8-wide-greedy", "vllm-marlin")]["runs_used"] == 3 + 3


def test_a_stack_with_no_clean_run_has_no_row_and_one_kernel_left_is_no_sweep_to_answer():
    died = {"vllm-fp16": SPEED["vllm-fp16"], "vllm-gptq-machete": (None, None, None), "vllm-marlin": (150,) * 3}
    results = [
        run(s, r, tok, status="ok" if tok else "server_died") for s, toks in died.items() for r, tok in enumerate(toks)
    ]
    frames = measured(results)
    assert frames["kernels"]["stack"].to_list() == ["vllm-marlin"]
    assert K.answer(frames) == ""  # one kernel is no comparison of kernels
    assert "<td>vllm-marlin</td>" in K.section(frames, {})
    nothing = measured([run("vllm-fp16", 0, None, status="server_died"), run("vllm-marlin", 0, 150)])
    assert nothing["kernels"].height == 0 and nothing["kernels"].schema == pl.Schema(SCHEMA)
    assert K.answer(nothing) == ""
    assert "<p>No GPTQ stack and reference measured together.</p>" in K.section(nothing, {})


def test_cells_that_share_users_and_workload_are_each_a_line_of_their_own():
    """Greedy and sampled at 8 users, and two open-loop rates (no users): four cells, four lines,
    each naming its cell and its own kernels once (they were merged into two lines, every kernel
    said twice)."""
    sampled = sweep(sampling="sampled", speed={s: tuple(2 * v for v in toks) for s, toks in SPEED.items()})
    results = sweep() + sampled
    for rate in (4, 16):
        for res in sweep(users=0, workload="mix", arrival={"pattern": "poisson", "rate_rps": rate, "requests": 10}):
            res.cell = res.job.cell.name = f"r{rate}-mix-greedy"
            results.append(res)
    frames = measured(results)
    assert frames["kernels"]["cell"].unique(maintain_order=True).to_list() == [
        "r4-mix-greedy", "r16-mix-greedy", "u8-wide-greedy", "u8-wide-sampled",
    ]  # fmt: skip
    said = "MacheteLinearKernel 4× [0.715, 22.4]; MarlinLinearKernel 1.5× [1.5, 1.5]</p>"
    html = K.answer(frames)
    assert html.count("<p class='headline'>") == 4
    for cell in ("r4-mix-greedy", "r16-mix-greedy", "u8-wide-greedy", "u8-wide-sampled"):
        assert f"<p class='headline'>INT4 over vllm-fp16 at {cell} (tiny, tp1): {said}" in html
    # a cell alone at its users and workload is said as before
    assert "at 8 users (wide; tiny, tp1)" in K.answer(measured(sweep()))
