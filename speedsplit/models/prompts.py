"""The prompts a run sends, the same for every stack, and the model's tokenizer as building
them needs it (on the `tokenizers` library alone where the folder has a tokenizer.json).

Distinct prompts of exact lengths (`prompts_of`, from `exact_prompt`), and, for trace replay,
ones that share exactly the tokens a trace says they share (`block_prompts`): each prompt block
(a trace's hash id) is the same run of tokens wherever it appears, so requests with a common
first k blocks have a common first k blocks of tokens and a server's prefix cache sees what the
trace recorded. Built from "word" tokens (one whole word each, most with a leading space) that
decode and encode back to themselves in any order, so the text sent is exactly those tokens.

A workload may ask for prompts of held-out code instead (`text`, PROMPT_TEXTS): `code`, windows
of the Python library's held-out files (code a model trained on the library's other files has
never seen); `code-edit`, such a window followed by its own first part again, as a request to
rewrite a file would send: an answer that goes on copying repeats the prompt's text, which is
what speculative decoding by prompt lookup (n-gram) drafts from.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import get_args

from speedsplit.core.specs import PromptText
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


@functools.lru_cache(maxsize=8)
def _tokenizer(model_dir: str):
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        return FastTokenizer(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def load_tokenizer(model_dir: str | Path):
    """tokenizer.json through `tokenizers` when there is one, else transformers' AutoTokenizer
    (loaded once per folder: a run's prompts and its text counts share it)."""
    return _tokenizer(str(model_dir))


def token_counter(model_dir: str | Path):
    """How many tokens the model's tokenizer makes of a text (no special tokens added)."""
    tok = load_tokenizer(model_dir)
    return lambda text: len(tok.encode(text, add_special_tokens=False))


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


PROMPT_TEXTS = get_args(PromptText)
HELD_OUT_BYTES = 400_000  # of the library's held-out files: about 100,000 tokens to cut prompts from
EDIT_SEPARATOR = "\n\n"  # between a code-edit prompt's passage and the start of its copy


def prompts_of(
    tokenizer_dir, lengths: list[int], seed: int, text: PromptText = "random", output_tokens: int = 0
) -> list[str]:
    """Distinct prompts of exactly these lengths in tokens, from the seed alone: random words,
    or held-out code (`text`: PROMPT_TEXTS; a code-edit prompt leaves output_tokens of its
    passage to copy where its length allows)."""
    tok = load_tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    if text == "random":
        return [exact_prompt(tok, n, rng) for n in lengths]
    if text not in PROMPT_TEXTS:
        raise ValueError(f"unknown prompt text {text!r} (known: {', '.join(PROMPT_TEXTS)})")
    ids = _held_out_ids(str(tokenizer_dir))
    if text == "code":
        return [_code_prompt(tok, ids, n, 0, [], rng) for n in lengths]
    sep = tok.encode(EDIT_SEPARATOR, add_special_tokens=False)
    return [_code_prompt(tok, ids, *edit_split(n, len(sep), output_tokens), sep, rng) for n in lengths]


@functools.lru_cache(maxsize=4)
def _held_out_ids(model_dir: str) -> tuple[int, ...]:
    """The library's held-out files (models/corpus.py: one file in ten, never trained on) in
    the model's tokens."""
    from speedsplit.models.corpus import stdlib_corpus

    text = stdlib_corpus(train_bytes=0, held_out_bytes=HELD_OUT_BYTES).held_out
    tok = load_tokenizer(model_dir)
    ids = tuple(tok.encode(text, add_special_tokens=False))
    unknown = sum(i == tok.unk_token_id for i in ids) if tok.unk_token_id is not None else 0
    if unknown > len(ids) // 100:
        raise ModelError(
            f"the model's tokenizer ({model_dir}) spells {unknown / len(ids):.0%} of held-out code as an unknown "
            "token: code prompts need a tokenizer that covers code (a trained or downloaded model's)"
        )
    return ids


def edit_split(n_tokens: int, separator_tokens: int, output_tokens: int) -> tuple[int, int]:
    """A code-edit prompt's passage and repeated start (tokens) in n_tokens: the passage long
    enough that output_tokens of it are left to copy after the repeat where that fits, the
    repeat at least a quarter of the room (the cue that the passage is being written again)."""
    room = n_tokens - separator_tokens
    if room < 2:
        raise ModelError(f"a code-edit prompt needs more than {separator_tokens + 1} tokens (asked: {n_tokens})")
    passage = min(-(-(room + output_tokens) // 2), room - max(1, room // 4))
    return passage, room - passage


def _code_prompt(tokenizer, ids: tuple[int, ...], passage: int, repeat: int, sep: list[int], rng: random.Random) -> str:
    """A window of passage tokens of held-out code, then sep and the window's first repeat
    tokens again (none: the window alone), at a random place where its text encodes back to
    exactly those tokens."""
    n_tokens = passage + len(sep) + repeat
    if passage >= len(ids):
        raise ModelError(f"the held-out code has {len(ids)} tokens, too few for a prompt of {n_tokens}")
    for _ in range(200):
        start = rng.randrange(len(ids) - passage)
        window = list(ids[start : start + passage])
        want = window + sep + window[:repeat]
        text = tokenizer.decode(want, skip_special_tokens=True)
        if tokenizer.encode(text, add_special_tokens=False) == want:
            return text
    raise ModelError(f"no window of the held-out code of {n_tokens} tokens encodes back to itself with this tokenizer")


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
