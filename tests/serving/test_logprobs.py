"""Logprobs as our own servers read and answer them (speedsplit/serving/logprobs.py): what a
request asks for, refused in one line where the OpenAI completions API would refuse it, and the
answer's logprobs object as lm-evaluation-harness and the quality probe read it."""

import pytest

from speedsplit.core.errors import BadRequest
from speedsplit.core.quality import ID_PREFIX
from speedsplit.serving import logprobs


def test_a_request_without_logprob_fields_asks_for_none():
    assert logprobs.asked({"prompt": "x"}) == logprobs.Asked(top=None, as_ids=False, echo=False)


def test_a_request_asks_for_top_logprobs_named_by_id_and_its_prompt_echoed():
    got = logprobs.asked({"logprobs": 5, "echo": True, "return_tokens_as_token_ids": True})
    assert got == logprobs.Asked(top=5, as_ids=True, echo=True)
    assert logprobs.asked({"logprobs": 0}).top == 0  # the chosen tokens' own logprobs, no alternatives


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"logprobs": 21}, "logprobs must be an integer from 0 to 20, not 21"),
        ({"logprobs": -1}, "logprobs must be an integer from 0 to 20, not -1"),
        ({"logprobs": True}, "logprobs must be an integer from 0 to 20, not True"),
        ({"logprobs": "5"}, "logprobs must be an integer from 0 to 20, not '5'"),
        ({"echo": "yes", "logprobs": 1}, "echo must be true or false, not 'yes'"),
        ({"return_tokens_as_token_ids": 1}, "return_tokens_as_token_ids must be true or false, not 1"),
        ({"echo": True}, "echo is served with logprobs only (the prompt's scores)"),
    ],
)
def test_a_malformed_field_is_a_bad_request_naming_it(body, said):
    with pytest.raises(BadRequest) as exc:
        logprobs.asked(body)
    assert str(exc.value) == said


def test_the_answer_names_each_token_by_its_text_and_says_where_it_starts():
    texts = {1: "def", 2: " f", 3: "():"}

    def decode(ids):
        return "".join(texts[i] for i in ids)

    out = logprobs.logprobs_object(
        [1, 2, 3], [None, -0.5, -1.25], [None, {2: -0.5, 3: -2.0}, {3: -1.25}], decode, False
    )
    assert out == {
        "tokens": ["def", " f", "():"],
        "token_logprobs": [None, -0.5, -1.25],  # the first prompt token has no logprob (echo)
        "top_logprobs": [None, {" f": -0.5, "():": -2.0}, {"():": -1.25}],
        "text_offset": [0, 3, 5],
    }
    by_id = logprobs.logprobs_object([1, 2], [-0.1, -0.2], [{1: -0.1}, {2: -0.2}], decode, True)
    assert by_id["tokens"] == [f"{ID_PREFIX}1", f"{ID_PREFIX}2"] and by_id["top_logprobs"][1] == {f"{ID_PREFIX}2": -0.2}
    assert by_id["text_offset"] == [0, 3]  # offsets are the text's, whatever the names


def test_the_top_of_a_row_is_its_k_highest_logprobs_by_token_id():
    torch = pytest.importorskip("torch")
    row = torch.log_softmax(torch.tensor([0.0, 3.0, 1.0, 2.0]), dim=-1)
    top = logprobs.top_of(row, 2)
    assert list(top) == [1, 3] and top[1] == pytest.approx(float(row[1])) and top[3] > float(row[2])
