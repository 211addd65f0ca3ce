"""Quality figures against answers of known quality: a chain of reference servers whose answers
diverge at known places and who score text at known perplexities (serving/reference_answers.py).
Each quality number of the chain comes out at its truth, through the real probe and servers."""

import math

import polars as pl
import pytest

from speedsplit.analysis import quality as Q
from speedsplit.output.analyses.quality import step_line
from speedsplit.core.quality import QualityProbe
from speedsplit.models.prompts import load_tokenizer
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
    line = step_line(gate["ref-c"])
    assert line.startswith("c: ") and "perplexity +" in line and "FAILS the 99% gate" in line
    # beside the speed, in the answer sentence's words: an interval holding 1 shows no difference
    shown = step_line(gate["ref-c"] | {"speed_factor": 1.72, "speed_factor_lo": 0.808, "speed_factor_hi": 3.75})
    assert shown.startswith("c: 1.72× throughput [0.808, 3.75] (no difference shown); agreement ")
    one = step_line(gate["ref-c"] | {"speed_factor": 1.72, "speed_factor_lo": None, "speed_factor_hi": None})
    assert one.startswith("c: 1.72× throughput [no interval: one run]; ")
    # the answer table carries each chain's line beside its sentences
    from speedsplit.analysis.answer import SENTENCE_SCHEMA, beside
    from speedsplit.output.analyses.quality import by_chain

    said = by_chain({"quality": steps})
    assert list(said) == [("tiny", "tp1", "refs")] and said[("tiny", "tp1", "refs")].startswith("b: ")
    sentences = pl.DataFrame(
        [
            {"chain": c, "model": "tiny", "topology": "tp1", "cell": "u8", "users": 8, "sentence": "s"}
            for c in ("refs", "other")
        ],
        schema=SENTENCE_SCHEMA,
    )
    assert beside(sentences, "quality", said, ["model", "topology", "chain"])["quality"].to_list() == [
        said[("tiny", "tp1", "refs")],
        None,
    ]


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


def test_the_intervals_are_the_textbook_ones():
    assert Q.wilson(3, 10) == pytest.approx((0.3, 0.10779, 0.60322), abs=1e-5)
    assert Q.wilson(16, 16)[1:] == pytest.approx((0.80639, 1.0), abs=1e-5)
    assert Q.mean_t([1.0, 2.0, 3.0]) == pytest.approx((2.0, -0.48414, 4.48414), abs=1e-5)
    assert Q.mean_t([1.0, 2.0, 3.0], 0.0, 4.0) == pytest.approx((2.0, 0.0, 4.0), abs=1e-5)  # clamped
    assert Q.mean_t([0.5]) == (0.5, None, None)


def test_a_top_token_that_moves_and_a_perplexity_that_varies_land_on_their_truth(probed, tiny_model):
    """Against ref-a, ref-d names another top token wherever (token + position) % 5 == 0 and
    scores each token 0.2 + 0.3 x (position % 3) nats worse: next-token agreement is the mean of
    the windows' shares of the other positions, each window its own (an interval of some width),
    and the perplexity ratio is exp of the mean difference."""
    d = Answers(nll=1.2, nll_wave=0.3, other_top_every=5)
    url = R.serve_in_thread(R.make_app(Speed(0.0, 0.0), served_name="m", model_dir=str(tiny_model), answers=d))
    a, _ = probed[("tiny", "tp1", "ref-a")]
    rd = quality.run(url, "m", "vllm", PROBE, tiny_model)
    shares, diffs = [], []
    for w in rd.windows:
        moved = [d.tops_another(t, j) for j, t in enumerate(w.ids[1:], start=1)]
        shares.append(1 - sum(moved) / len(moved))
        diffs += [0.2 + 0.3 * (j % 3) for j in range(1, len(w.ids))]
    share, lo, hi = Q.next_token_agreement(a, rd)
    assert share == pytest.approx(sum(shares) / len(shares)) and lo < share < hi <= 1.0
    assert Q.perplexity_ratio(a, rd)[0] == pytest.approx(math.exp(sum(diffs) / len(diffs)))


@pytest.mark.serial
def test_a_server_that_stops_answering_is_asked_nothing_more(tiny_model):
    """A connection refused (the server gone): one request says so, the rest are not sent, and
    the probe returns at once with its reasons, never a hang or an exception."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = quality.run(f"http://127.0.0.1:{port}", "m", "vllm", PROBE, tiny_model, timeout_s=5.0)
    assert rec.status == "error" and rec.outputs[0].error.startswith("the server did not answer")
    assert all(o.error.startswith("not asked: the server did not answer") for o in rec.outputs[1:])
    assert all(w.error.startswith("not asked") for w in rec.windows) and rec.seconds < 5


def test_a_stop_signal_ends_the_probe(tiny_model):
    """SIGTERM while the probe waits for an answer (the job is being stopped): the probe does not
    swallow it. The server sends it on the probe's third request."""
    import os
    import signal

    from aiohttp import web

    from speedsplit.core import procs

    seen = []

    @web.middleware
    async def stop_the_client(request, handler):
        seen.append(request.path)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return await handler(request)

    app = R.make_app(Speed(0.0, 0.0), served_name="m", model_dir=str(tiny_model))
    app.middlewares.append(stop_the_client)
    url = R.serve_in_thread(app)
    with procs.stop_on_signals(), pytest.raises(procs.Stop):
        quality.run(url, "m", "vllm", PROBE, tiny_model)
    assert len(seen) == 3  # nothing asked after the stop


def test_a_lossless_step_fails_its_gate_on_any_continuation_that_differs(probed):
    """A speculative stack (lossless: true) must answer greedily as the stack before it: ref-b
    diverges from ref-a on a known share of the prompts, a copy of ref-a on none."""
    records = {**probed, ("tiny", "tp1", "ref-same"): probed[("tiny", "tp1", "ref-a")]}
    steps = Q.steps_frame(
        records,
        {"spec": ["ref-a", "ref-b"], "same": ["ref-a", "ref-same"]},
        {},
        None,
        gate=0.5,
        lossless={"ref-b", "ref-same"},
    )
    rows = {r["to_stack"]: r for r in steps.iter_rows(named=True)}
    b = rows["ref-b"]
    differ = b["prompts"] - b["agree"]
    assert differ > 0 and b["lossless"] is False and b["passes"] is False
    assert b["note"].startswith(f"NOT LOSSLESS: {differ} of 16 greedy continuations differ from ref-a's")
    assert rows["ref-same"]["lossless"] is True and rows["ref-same"]["passes"] is True


def test_a_lossless_step_is_judged_by_its_answers_not_by_wrong_prompt_scores(probed, tiny_model):
    """A speculative server whose greedy answers are ref-a's token for token but whose prompt
    logprobs are wrong (scored at NLL 3.0 a token for ref-a's 1.0, as vLLM's OpenAI server with a
    draft model and CUDA graphs scored a trained model's prompts on one H200): its step passes as
    lossless, with ref-a's quality, the ratio kept as measured and a note naming the scores."""
    url = R.serve_in_thread(
        R.make_app(Speed(0.0, 0.0), served_name="m", model_dir=str(tiny_model), answers=Answers(nll=3.0))
    )
    records = {**probed, ("tiny", "tp1", "ref-scores"): (quality.run(url, "m", "vllm", PROBE, tiny_model), "trained")}
    chains = {"spec": ["ref-a", "ref-scores"], "after-c": ["ref-a", "ref-c", "ref-c-spec"]}
    records[("tiny", "tp1", "ref-c-spec")] = probed[("tiny", "tp1", "ref-c")]
    steps = Q.steps_frame(records, chains, {}, None, gate=0.99, lossless={"ref-scores", "ref-c-spec"})
    rows = {r["to_stack"]: r for r in steps.iter_rows(named=True)}
    s = rows["ref-scores"]
    assert s["agree"] == s["prompts"] == 16 and s["lossless"] is True
    assert s["perplexity_ratio"] == pytest.approx(math.exp(2.0), rel=1e-9)
    assert s["gate_basis"] == "lossless" and s["reference"] == "ref-a"
    assert s["quality_share"] == 1.0 and s["passes"] is True
    assert s["note"].endswith(
        f"its prompt scores are wrong, not its answers: perplexity {math.exp(2.0):.4g}x ref-a's on the same "
        "weights with all 16 greedy continuations the same"
    )
    assert step_line(s).endswith("passes the 99% gate (lossless: its greedy answers are ref-a's)")
    # after a step that loses quality, a lossless one keeps the quality of the stack before it
    c, spec = rows["ref-c"], rows["ref-c-spec"]
    assert spec["lossless"] is True and spec["note"] == ""
    assert spec["quality_share"] == c["quality_share"] == pytest.approx(math.exp(-0.5))
    assert spec["reference"] == "ref-a" and spec["passes"] is c["passes"] is False
