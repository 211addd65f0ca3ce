"""The model's tokenizer as prompt building needs it (on the `tokenizers` library alone where the
folder has a tokenizer.json), and prompts of an exact length in its tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

from speedsplit.models.checkpoint import ModelError


class FastTokenizer:
    """The few tokenizer calls prompt building needs, on the `tokenizers` library alone
    (importing transformers costs seconds in every benchmark job)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=False)
        self.all_special_ids = [i for i, t in self._tok.get_added_tokens_decoder().items() if t.special]
        unk = getattr(self._tok.model, "unk_token", None)
        self.unk_token_id = self._tok.token_to_id(unk) if unk else None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids


def load_tokenizer(model_dir: str | Path):
    """tokenizer.json through `tokenizers` when there is one, else transformers' AutoTokenizer."""
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        return FastTokenizer(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def exact_prompt(tokenizer, n_tokens: int, rng: random.Random) -> str:
    """A text that the model's tokenizer encodes to exactly n_tokens (no special tokens)."""
    specials = set(tokenizer.all_special_ids)
    vocab = tokenizer.vocab_size
    low = max(specials, default=-1) + 1 if max(specials, default=0) < vocab // 2 else 0
    ids = [rng.randrange(low, vocab) for _ in range(n_tokens)]
    for _ in range(8):
        ids = [i for i in ids if i not in specials]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        got = tokenizer.encode(text, add_special_tokens=False)
        if len(got) == n_tokens:
            return text
        ids = got[:n_tokens] + [rng.randrange(low, vocab) for _ in range(n_tokens - len(got))]
    # A small byte-level vocabulary (a trained tiny model's) merges random neighbours into fewer
    # tokens: grow the prompt a token at a time, keeping a token only where the whole text still
    # encodes back to exactly its tokens.
    ids = []
    for _ in range(20 * n_tokens):
        if len(ids) == n_tokens:
            return tokenizer.decode(ids, skip_special_tokens=True)
        t = rng.randrange(low, vocab)
        if t not in specials and tokenizer.encode(tokenizer.decode(ids + [t]), add_special_tokens=False) == ids + [t]:
            ids.append(t)
    if len(ids) == n_tokens:
        return tokenizer.decode(ids, skip_special_tokens=True)
    raise ModelError(f"could not build a prompt of exactly {n_tokens} tokens with this tokenizer")
