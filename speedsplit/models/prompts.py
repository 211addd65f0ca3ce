"""The prompts a run sends, the same for every stack: distinct ones of exact lengths
(`prompts_of`), and, for trace replay, ones that share exactly the tokens a trace says they share: each prompt block (a trace's
hash id) is the same run of tokens wherever it appears, so requests with a common first k
blocks have a common first k blocks of tokens and a server's prefix cache sees what the trace
recorded. Built from "word" tokens (one whole word each, most with a leading space) that
decode and encode back to themselves in any order, so the text sent is exactly those tokens.
"""

from __future__ import annotations

import random

from speedsplit.models.checkpoint import ModelError
from speedsplit.models.tokenizer import exact_prompt, load_tokenizer


def prompts_of(tokenizer_dir, lengths: list[int], seed: int) -> list[str]:
    """Distinct prompts of exactly these lengths in tokens, from the seed alone."""
    tok = load_tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    return [exact_prompt(tok, n, rng) for n in lengths]


def word_ids(tokenizer, rng: random.Random, want: int = 2048) -> list[int]:
    """Up to `want` token ids, each a whole word that encodes back to itself alone; any
    sequence of them decodes to a text that encodes back to the same sequence (checked)."""
    specials = set(tokenizer.all_special_ids)
    order = list(range(tokenizer.vocab_size))
    rng.shuffle(order)
    spaced, plain = [], []
    for i in order:
        if i in specials:
            continue
        text = tokenizer.decode([i])
        word = text.lstrip(" ")
        if not word.isalnum() or len(text) - len(word) > 1:
            continue
        if tokenizer.encode(text, add_special_tokens=False) != [i]:
            continue
        (spaced if text.startswith(" ") else plain).append(i)
        if len(spaced) >= want:
            break
    for ids in (spaced + plain, spaced):  # word-level vocabularies join with spaces themselves
        if len(ids) >= 16 and _round_trips(tokenizer, [rng.choice(ids) for _ in range(256)]):
            return ids
    raise ModelError("this tokenizer has too few whole-word tokens to build prompts that share blocks exactly")


def _round_trips(tokenizer, ids: list[int]) -> bool:
    return tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def block_prompts(tokenizer, requests: list[tuple[int, tuple[int, ...]]], block_tokens: int, seed: int) -> list[str]:
    """For each (prompt_tokens, block ids): a text of exactly prompt_tokens tokens, made of its
    blocks' tokens in order (the last one cut); a block's tokens depend on (seed, its id) alone."""
    words = word_ids(tokenizer, random.Random(seed))
    cache: dict[int, list[int]] = {}

    def block(h: int) -> list[int]:
        if h not in cache:
            r = random.Random(f"{seed}/{h}")
            cache[h] = [r.choice(words) for _ in range(block_tokens)]
        return cache[h]

    out = []
    for n, blocks in requests:
        ids = [t for h in blocks for t in block(h)][:n]
        if len(ids) < n:  # fewer blocks than tokens (a cut trace): the rest its own
            r = random.Random(f"{seed}/tail/{len(out)}")
            ids += [r.choice(words) for _ in range(n - len(ids))]
        if not _round_trips(tokenizer, ids):
            raise ModelError(f"a prompt of {n} tokens did not encode back to its {n} tokens")
        out.append(tokenizer.decode(ids))
    return out
