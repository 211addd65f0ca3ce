"""What the server of known speed says (speedsplit/serving/reference_answers.py): answers set by
hand, the same on every server for the same prompt, so that a chain of reference stacks has
known quality truths (their use: tests/analysis/test_quality_truth.py)."""

import math
import zlib

import pytest

from speedsplit.serving.reference_answers import DIVERGED, Answers, agreement

PROMPTS = [f"prompt {i}" for i in range(200)]


def test_an_answer_is_its_positions_unless_its_prompt_diverges():
    plain = Answers()
    assert [plain.token("any", i) for i in range(3)] == [(0, " t0"), (1, " t1"), (2, " t2")]
    every = Answers(diverge_every=1, diverge_at=2)
    assert [every.token("any", i) for i in range(4)] == [
        (0, " t0"),
        (1, " t1"),
        (DIVERGED + 2, " u2"),
        (DIVERGED + 3, " u3"),
    ]
    assert every.token("any", 3, diverges=False) == (3, " t3")  # the caller's answer wins


def test_the_diverging_share_is_chosen_by_the_prompts_text_the_same_everywhere():
    one_in_four = Answers(diverge_every=4)
    chosen = [p for p in PROMPTS if one_in_four.diverges(p)]
    assert chosen == [p for p in PROMPTS if zlib.crc32(p.encode()) % 4 == 0]
    assert 0.15 < len(chosen) / len(PROMPTS) < 0.35
    assert not any(Answers().diverges(p) for p in PROMPTS)


def test_a_scored_prompt_has_its_perplexity_and_its_tops():
    ids = [7, 8, 9, 10]
    lps, tops = Answers(nll=1.5).scores(ids, top=3)
    assert lps == [-1.5] * 3 and math.exp(-sum(lps) / len(lps)) == pytest.approx(math.exp(1.5))
    assert tops[0] == {8: -1.5, DIVERGED + 9: -2.5, DIVERGED + 10: -3.5}  # itself on top, then a nat apart
    waved, _ = Answers(nll=1.0, nll_wave=0.5).scores(ids, top=1)
    assert waved == [-1.5, -2.0, -1.0]  # positions 1, 2, 3: + 0.5 x (j % 3)


def test_another_token_tops_it_where_its_id_and_place_say_so():
    answers = Answers(nll=1.0, other_top_every=3)
    _, tops = answers.scores([0, 2, 5, 3], top=1)
    # (id + position) % 3 == 0 at (2, 1) and (3, 3): there a token half a nat above it
    assert tops[0] == {2: -1.0, -3: -0.5} and tops[2] == {3: -1.0, -4: -0.5}
    assert tops[1] == {5: -1.0}
    assert [answers.tops_another(t, j) for t, j in ((2, 1), (5, 2), (3, 3))] == [True, False, True]


def test_two_servers_agree_where_neither_diverges():
    same = agreement(Answers(), Answers(), PROMPTS, 8)
    assert same == (1.0, 8.0)
    some = Answers(diverge_every=4, diverge_at=3)
    share, first = agreement(Answers(), some, PROMPTS, 8)
    diverging = sum(some.diverges(p) for p in PROMPTS) / len(PROMPTS)
    assert share == pytest.approx(1 - diverging)
    assert first == pytest.approx((1 - diverging) * 8 + diverging * 3)  # the first difference at diverge_at
