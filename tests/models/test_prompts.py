"""Prompts built from a trace's blocks share exactly the tokens the trace says they share."""

from speedsplit.models.prompts import block_prompts, load_tokenizer


def test_requests_sharing_blocks_share_exactly_those_tokens(tiny_model):
    tok = load_tokenizer(tiny_model)
    reqs = [(40, (0, 1, 2, 3)), (37, (0, 1, 5, 6)), (12, (0, 9)), (40, (7, 8, 2, 3))]
    texts = block_prompts(tok, reqs, block_tokens=10, seed=3)
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert [len(x) for x in ids] == [40, 37, 12, 40]
    assert ids[0][:20] == ids[1][:20] and ids[0][20:30] != ids[1][20:30]  # blocks 0, 1 shared, then not
    assert ids[2][:10] == ids[0][:10] and ids[3][20:40] == ids[0][20:40]  # a block is its tokens anywhere
    assert block_prompts(tok, reqs, 10, seed=3) == texts and block_prompts(tok, reqs, 10, seed=4) != texts
