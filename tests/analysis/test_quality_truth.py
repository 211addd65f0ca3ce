"""Quality figures against answers of known quality: a chain of reference servers whose answers
diverge at known places and who score text at known perplexities (serving/reference_answers.py).
Each quality number of the chain comes out at its truth, through the real probe and servers."""

import math

import pytest

from speedsplit.analysis import quality as Q
from speedsplit.core.quality import QualityProbe
from speedsplit.models.tokenizer import load_tokenizer
from speedsplit.probes import quality
from speedsplit.serving import reference as R
from speedsplit.serving.reference_answers import Answers, agreement
from speedsplit.serving.reference_speed import Speed

PROBE = QualityProbe(prompts=16, prompt_tokens=12, output_tokens=24, windows=6, window_tokens=40)
ANSWERS = {
    "ref-a": Answers(nll=1.0),
    "ref-b": Answers(diverge_every=3, diverge_at=5, nll=1.005),
    "ref-c": Answers(diverge_every=2, diverge_at=11, nll=1.5),
}


@pytest.fixture(scope="module")
def probed(tiny_model):
    records = {}
    for name, answers in ANSWERS.items():
        url = R.serve_in_thread(
            R.make_app(Speed(0.0, 0.0), served_name="m", model_dir=str(tiny_model), answers=answers)
        )
        records[("tiny", "tp1", name)] = (quality.run(url, "m", "vllm", PROBE, tiny_model), "trained")
    return records


def prompts(tiny_model) -> list[str]:
    """The prompts the probe sent, rebuilt as it builds them."""
    tok = load_tokenizer(tiny_model)
    text, _ = quality.held_out_text(PROBE, tiny_model)
    windows, _ = quality.windows_of(text, tok, PROBE)
    return [tok.decode(w[: PROBE.prompt_tokens]) for w in windows[: PROBE.prompts]]


def test_each_stack_says_what_it_serves_and_its_perplexity(probed):
    stacks = Q.stacks_frame(probed)
    assert stacks["serves_token_ids"].to_list() == ["yes"] * 3
    assert stacks["serves_prompt_logprobs"].to_list() == ["yes"] * 3
    for row in stacks.iter_rows(named=True):
        truth = math.exp(ANSWERS[row["stack"]].nll)
        assert row["perplexity"] == pytest.approx(truth, rel=1e-12)
        assert row["perplexity_lo"] == pytest.approx(truth) and row["perplexity_hi"] == pytest.approx(truth)
        assert row["windows"] == PROBE.windows and row["tokens_scored"] == PROBE.windows * (PROBE.window_tokens - 1)


def test_every_step_of_the_chain_lands_on_its_truth(probed, tiny_model):
    chain = list(ANSWERS)
    steps = Q.steps_frame(probed, {"refs": chain}, {"refs": ["b", "c"]}, None, gate=0.99)
    sent = prompts(tiny_model)
    assert steps.height == 2
    for row in steps.iter_rows(named=True):
        a, b = ANSWERS[row["from_stack"]], ANSWERS[row["to_stack"]]
        share, first = agreement(a, b, sent, PROBE.output_tokens)
        assert 0 < share < 1, "the test's prompts must include diverging and agreeing ones"
        assert row["compared_by"] == "token ids" and row["prompts"] == PROBE.prompts
        assert row["agreement"] == pytest.approx(share) and row["first_divergence"] == pytest.approx(first)
        assert row["agreement_lo"] <= share <= row["agreement_hi"]
        assert row["first_divergence_lo"] <= first <= row["first_divergence_hi"]
        assert row["perplexity_ratio"] == pytest.approx(math.exp(b.nll - a.nll), rel=1e-9)
        assert row["next_token_agreement"] == 1.0
    gate = {r["to_stack"]: r for r in steps.iter_rows(named=True)}
    # the reference is the chain's first stack: ref-b keeps 99.5% of its quality, ref-c 60.7%
    assert gate["ref-b"]["reference"] == "ref-a" and gate["ref-b"]["gate_basis"] == "perplexity"
    assert gate["ref-b"]["quality_share"] == pytest.approx(math.exp(-0.005)) and gate["ref-b"]["passes"]
    assert gate["ref-c"]["quality_share"] == pytest.approx(math.exp(-0.5)) and not gate["ref-c"]["passes"]
    line = Q.step_line(gate["ref-c"])
    assert line.startswith("c: ") and "perplexity +" in line and "FAILS the 99% gate" in line


def test_a_stack_that_serves_no_logprobs_is_compared_by_its_text(probed):
    """Where one side has no token ids (transformers serve), both sides' texts re-tokenized."""
    (a, wa), (b, wb) = probed[("tiny", "tp1", "ref-a")], probed[("tiny", "tp1", "ref-b")]
    blind = b.model_copy(deep=True)
    for o in blind.outputs:
        o.ids, o.top = None, None
    blind.windows = []
    steps = Q.steps_frame(
        {("tiny", "tp1", "a"): (a, wa), ("tiny", "tp1", "b"): (blind, wb)}, {"c": ["a", "b"]}, {}, None, 0.99
    )
    row = steps.row(0, named=True)
    assert row["compared_by"] == "texts re-tokenized"
    assert row["perplexity_ratio"] is None and row["gate_basis"] == "agreement"
