"""The reference server's KV cache (speedsplit/serving/reference.py): a prefix cache on the card
and, behind it, a host tier that takes what the card evicts, as vLLM's prefix cache and its
KV-cache offload do. Sizes are in tokens, hits in whole blocks.

A request looks its prompt up when it gets its slot: the card's hit is the longest prefix it
shares with a sequence the card holds, the host's what a host sequence adds beyond that (both
cut to whole blocks, and short of the whole prompt: its last token is always computed, as
vLLM's is). When the request ends, its sequence (prompt and answer) is stored on the card, the
least recently used sequences evicted to the host until the card's sequences fit, and the
host's least recently used dropped until its own fit. The server charges a prompt's tokens at
its prefill rate but for the card's hits (free) and the host's (at the offload rate:
reference_speed.Speed.first_token_s), says both in its usage, and counts them as vLLM's
prefix-cache and external prefix-cache counters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BLOCK_TOKENS = 16  # a hit is whole blocks, as vLLM's default block size makes it


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _blocks(tokens: int) -> int:
    return tokens - tokens % BLOCK_TOKENS


@dataclass
class KvTiers:
    """A card tier of card_tokens and a host tier of host_tokens (0: none), LRU each."""

    card_tokens: int
    host_tokens: int = 0
    card: OrderedDict[int, tuple[int, ...]] = field(default_factory=OrderedDict)
    host: OrderedDict[int, tuple[int, ...]] = field(default_factory=OrderedDict)
    stored: int = 0  # sequences stored so far (their keys)
    card_held: int = 0  # tokens each tier holds now
    host_held: int = 0
    # vLLM's counters: prompt tokens looked up and found on the card; looked up past the card's
    # hit and found on the host
    queries: int = 0
    hits: int = 0
    host_queries: int = 0
    host_hits: int = 0

    def lookup(self, ids: list[int]) -> tuple[int, int]:
        """A prompt's tokens found on the card and (beyond those) on the host; the sequences
        that gave them count as used now."""
        prompt = tuple(ids)
        most = max(len(prompt) - 1, 0)
        card = self._best(self.card, prompt, most)
        host = self._best(self.host, prompt, most) if self.host_tokens else (0, None)
        on_card = card[0]
        on_host = max(0, host[0] - on_card)
        self.queries += len(prompt)
        self.hits += on_card
        if self.host_tokens:
            self.host_queries += len(prompt) - on_card
            self.host_hits += on_host
        return on_card, on_host

    @staticmethod
    def _best(tier: OrderedDict, prompt: tuple[int, ...], most: int) -> tuple[int, int | None]:
        best, key = 0, None
        for k, seq in tier.items():
            n = _blocks(min(_shared(prompt, seq), most))
            if n > best:
                best, key = n, k
        if key is not None:
            tier.move_to_end(key)
        return best, key

    def store(self, ids: list[int]) -> None:
        """A finished request's sequence (prompt and answer) onto the card, evicting to the host."""
        self.card[self.stored] = tuple(ids)
        self.card_held += len(ids)
        self.stored += 1
        while self.card_held > self.card_tokens and self.card:
            key, seq = self.card.popitem(last=False)
            self.card_held -= len(seq)
            if self.host_tokens and len(seq) <= self.host_tokens:
                self.host[key] = seq
                self.host_held += len(seq)
        while self.host_held > self.host_tokens and self.host:
            self.host_held -= len(self.host.popitem(last=False)[1])
