"""Prompts built from a trace's blocks share exactly the tokens the trace says they share."""

import pytest

from speedsplit.models.checkpoint import ModelError, synthesize
from speedsplit.models.prompts import block_prompts, load_tokenizer, prompts_of


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """The tiny shape with a tokenizer learnt from the library's sources (two training steps:
    the prompts need its tokenizer, not its weights)."""
    out = tmp_path_factory.mktemp("coder") / "tiny"
    synthesize("tiny", out, weights="trained", training={"steps": 2, "seq_len": 32, "batch": 2, "warmup_steps": 1})
    return out


def test_requests_sharing_blocks_share_exactly_those_tokens(tiny_model):
    tok = load_tokenizer(tiny_model)
    reqs = [(40, (0, 1, 2, 3)), (37, (0, 1, 5, 6)), (12, (0, 9)), (40, (7, 8, 2, 3))]
    texts = block_prompts(tok, reqs, block_tokens=10, seed=3)
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert [len(x) for x in ids] == [40, 37, 12, 40]
    assert ids[0][:20] == ids[1][:20] and ids[0][20:30] != ids[1][20:30]  # blocks 0, 1 shared, then not
    assert ids[2][:10] == ids[0][:10] and ids[3][20:40] == ids[0][20:40]  # a block is its tokens anywhere
    assert block_prompts(tok, reqs, 10, seed=3) == texts and block_prompts(tok, reqs, 10, seed=4) != texts


def test_code_prompts_are_held_out_code_of_exact_lengths(coder, tiny_model):
    from speedsplit.models.corpus import stdlib_corpus

    tok = load_tokenizer(coder)
    held_out = stdlib_corpus(train_bytes=0, held_out_bytes=400_000).held_out
    texts = prompts_of(coder, [64, 64, 30], seed=5, text="code")
    assert [len(tok.encode(t, add_special_tokens=False)) for t in texts] == [64, 64, 30]
    assert all(t in held_out for t in texts) and len(set(texts)) == 3
    assert prompts_of(coder, [64, 64, 30], seed=5, text="code") == texts  # the same on every stack
    assert prompts_of(coder, [64, 64, 30], seed=6, text="code") != texts
    with pytest.raises(ModelError, match="spells .* of held-out code as an unknown token"):
        prompts_of(tiny_model, [64], seed=5, text="code")  # a word-level vocabulary of random words


def test_a_code_edit_prompt_is_a_passage_then_its_start_again(coder):
    from speedsplit.models.prompts import EDIT_SEPARATOR, edit_split

    tok = load_tokenizer(coder)
    sep = tok.encode(EDIT_SEPARATOR, add_special_tokens=False)
    passage, repeat = edit_split(100, len(sep), output_tokens=40)
    assert passage + len(sep) + repeat == 100 and passage - repeat >= 40 and repeat >= (100 - len(sep)) // 4
    (text,) = prompts_of(coder, [100], seed=1, text="code-edit", output_tokens=40)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 100
    assert ids[passage : passage + len(sep)] == sep and ids[passage + len(sep) :] == ids[:repeat]
    # an answer longer than the room: the repeat keeps a quarter of it
    assert edit_split(100, len(sep), output_tokens=500)[1] == (100 - len(sep)) // 4
