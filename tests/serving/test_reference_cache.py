"""The reference server's KV cache (speedsplit/serving/reference_cache.py): hits of known size on
the card and on the host, whole blocks, the last prompt token always computed, LRU eviction
from the card to the host; and the server charging, saying and counting them."""

import urllib.request

import pytest

from speedsplit.serving import reference
from speedsplit.serving.reference_cache import BLOCK_TOKENS, KvTiers
from speedsplit.serving.reference_speed import Speed


def seq(tag: int, n: int) -> list[int]:
    return [tag * 10_000 + i for i in range(n)]


def test_a_returning_prompt_hits_its_conversation_in_whole_blocks_short_of_its_last_token():
    kv = KvTiers(card_tokens=1000)
    assert kv.lookup(seq(1, 100)) == (0, 0)
    kv.store(seq(1, 100 + 20))  # its prompt and its answer
    # the next turn: the conversation so far (120 tokens), then 50 new
    assert kv.lookup(seq(1, 120) + seq(2, 50)) == (112, 0)  # 7 whole blocks of the 120 shared
    assert kv.lookup(seq(1, 32)) == (16, 0)  # a prompt wholly held: its last token is computed again
    assert (kv.queries, kv.hits) == (100 + 170 + 32, 112 + 16)
    assert BLOCK_TOKENS == 16


def test_what_the_card_evicts_the_host_holds_and_what_neither_holds_is_computed():
    kv = KvTiers(card_tokens=300, host_tokens=300)
    for tag in (1, 2, 3):
        kv.store(seq(tag, 160))  # the card holds one sequence of 160: 1 and 2 go to the host, 1 then out
    assert list(kv.card) == [2] and list(kv.host) == [1]  # keys in store order: sequence 3 and sequence 2
    assert (kv.card_held, kv.host_held) == (160, 160)  # the tiers' running totals
    assert kv.lookup(seq(3, 160) + [7]) == (160, 0)
    assert kv.lookup(seq(2, 100) + [7]) == (0, 96)
    assert kv.lookup(seq(1, 100) + [7]) == (0, 0)  # dropped from the host too
    assert (kv.host_queries, kv.host_hits) == (1 + 101 + 101, 96)  # past the card's hit only


def test_a_used_sequence_is_the_last_evicted():
    kv = KvTiers(card_tokens=100)
    kv.store(seq(1, 40))
    kv.store(seq(2, 40))
    kv.lookup(seq(1, 40) + [7])  # 1 used: 2 is now the least recently used
    kv.store(seq(3, 40))
    assert list(kv.card) == [0, 2]  # keys in store order: 1 (0) and 3 (2) kept


@pytest.mark.serial
def test_the_server_charges_says_and_counts_its_hits():
    """A returning turn's held tokens cost no prefill (card) or load at the offload rate (host),
    its usage says them, and its /metrics count them as vLLM's counters do."""
    from speedsplit.probes import loadgen
    from speedsplit.probes.loadspec import SessionRun

    speed = Speed(ttft_s=0.02, itl_s=0.001, prefill_tok_s=2000, prefix_cache_tokens=10_000)
    url = reference.serve_in_thread(reference.make_app(speed))
    first = " ".join(f"p{i}" for i in range(200))
    more = [[" " + " ".join(f"q{i}" for i in range(50))]]
    run = SessionRun(due_s=[0.0], first=[" " + first], first_tokens=[200], more=more, asked=[[8, 8]], think_s=[[0.0]])
    spec = loadgen.LoadSpec(urls=[url], model="m", prompts=[], users=1, prompt_tokens=200, output_tokens=8,
                            warmup_requests=0, sessions=run, count_tokens=lambda t: len(t.split()))  # fmt: skip
    _, records = loadgen.run(spec)
    one, two = sorted((r for r in records if r.phase == "measured"), key=lambda r: r.index)
    assert (one.cached_tokens, one.prompt_tokens) == (0, 200)
    assert two.prompt_tokens == 258 and two.cached_tokens == 208 and two.offloaded_tokens == 0  # 13 blocks of 208
    # A sleep is never shorter than asked, and a loaded machine makes it longer: each TTFT is at
    # least its charge and nearer it than the charge of the other answer (all 258 tokens prefilled).
    charged, uncached = 0.02 + 50 / 2000, 0.02 + 258 / 2000
    assert 0.02 + 200 / 2000 <= one.first_token - one.sent < 0.02 + 200 / 2000 + 0.05
    assert charged <= two.first_token - two.sent < (charged + uncached) / 2
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    counts = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if "prefix_cache" in line}
    assert counts == {"vllm:prefix_cache_queries_total": 458, "vllm:prefix_cache_hits_total": 208}  # no host tier
