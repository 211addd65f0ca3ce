"""A completions body as the HF servers read it (speedsplit/serving/hf_request.py): the tiny
model's own tokenizer, every setting's default and bound, and each body the server refuses with
the one line its 400 answer carries."""

import pytest

from speedsplit.core.errors import BadRequest
from speedsplit.serving.hf_request import DEFAULT_MAX_TOKENS, SEED_LIMIT, parse_request

CONTEXT = 64


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def parse(tokenizer, **body):
    return parse_request({"model": "tiny", "stream": True, "prompt": "hello world", **body}, "tiny", tokenizer, CONTEXT)


def test_a_streamed_text_prompt_takes_every_default(tokenizer):
    req = parse(tokenizer)
    assert req.prompt_ids == tokenizer("hello world")["input_ids"]
    assert (req.max_tokens, req.min_tokens, req.temperature, req.top_p, req.seed) == (
        DEFAULT_MAX_TOKENS,
        0,
        1.0,
        1.0,
        None,
    )
    assert req.asked.top is None and not req.cancelled and req.sent == 0


def test_token_ids_and_a_batch_of_one_are_the_same_prompt(tokenizer):
    ids = tokenizer("hello world")["input_ids"]
    assert parse(tokenizer, prompt=ids).prompt_ids == ids  # as lm-evaluation-harness sends them
    assert parse(tokenizer, prompt=[ids]).prompt_ids == ids
    assert parse(tokenizer, prompt=["hello world"]).prompt_ids == ids


def test_ignore_eos_asks_for_every_token_and_the_answer_fits_the_context(tokenizer):
    req = parse(tokenizer, max_tokens=10, ignore_eos=True, temperature=0, top_p=0.5, seed=SEED_LIMIT - 1)
    assert (req.max_tokens, req.min_tokens, req.temperature, req.top_p) == (10, 10, 0.0, 0.5)
    room = CONTEXT - len(tokenizer("hello world")["input_ids"])
    assert parse(tokenizer, max_tokens=None).max_tokens == min(DEFAULT_MAX_TOKENS, room)
    assert parse(tokenizer, max_tokens=room).max_tokens == room


def test_echo_scoring_is_answered_whole(tokenizer):
    req = parse(tokenizer, stream=False, echo=True, logprobs=1, max_tokens=1)
    assert req.asked.echo and req.asked.top == 1


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"model": "other"}, "unknown model 'other' (this server serves 'tiny')"),
        ({"stream": False}, "only streaming requests are served (stream: true), and echo scoring"),
        ({"echo": True, "logprobs": 1}, "echo scoring is answered whole (stream: false)"),
        ({"prompt": ""}, "prompt must be a non-empty string or a list of token ids (a batch of one at most)"),
        ({"prompt": ["a", "b"]}, "prompt must be a non-empty string or a list of token ids (a batch of one at most)"),
        ({"prompt": [True]}, "prompt must be a non-empty string or a list of token ids (a batch of one at most)"),
        ({"max_tokens": 0}, "max_tokens must be between 1 and "),
        ({"max_tokens": 2.5}, "max_tokens must be an integer, not 2.5"),
        ({"ignore_eos": "yes"}, "ignore_eos must be true or false, not 'yes'"),
        ({"min_tokens": 99, "max_tokens": 4}, "min_tokens must be between 0 and 4, not 99"),
        ({"temperature": float("nan")}, "temperature must be a number, not nan"),
        ({"top_p": 0}, "top_p must be in (0.0, 1.0], not 0"),
        ({"seed": -1}, f"seed must be between 0 and {SEED_LIMIT - 1}, not -1"),
        ({"logprobs": 99}, "logprobs must be an integer from 0 to 20, not 99"),
    ],
)
def test_a_body_the_server_refuses_says_why(tokenizer, body, said):
    with pytest.raises(BadRequest) as exc:
        parse(tokenizer, **body)
    assert str(exc.value).startswith(said)


def test_a_prompt_outside_the_vocabulary_or_the_context_is_refused(tokenizer):
    with pytest.raises(BadRequest, match=rf"outside the vocabulary \(0 to {len(tokenizer) - 1}\)"):
        parse(tokenizer, prompt=[len(tokenizer)])
    with pytest.raises(BadRequest, match=rf"the prompt has {CONTEXT} tokens; the model's context is {CONTEXT}"):
        parse(tokenizer, prompt=[1] * CONTEXT)
    with pytest.raises(BadRequest, match="the body must be a JSON object, not a list"):
        parse_request([], "tiny", tokenizer, CONTEXT)
