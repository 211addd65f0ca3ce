"""The rules of the server of known speed (speedsplit/serving/reference_speed.py): its timing,
chunks, speculative counts, engine clock and faults, what a perfect client measures against
them (expected), and the command line that carries them (the server itself: test_reference.py)."""

import argparse

import pytest

from speedsplit.core.loads import ClosedLoopSettings
from speedsplit.serving.reference_answers import Answers
from speedsplit.serving.reference_speed import (
    EngineClock,
    Expected,
    Faults,
    Speed,
    add_speed_args,
    answers_of,
    argv,
    engine_steps,
    expected,
    parse_argv,
)

MODULE = ["python", "-m", "speedsplit.serving.reference", "--port", "8000", "--model", "m"]


def rows(got: list[Expected]) -> list[tuple]:
    return [(e.user, e.index, e.sent, e.first_token, e.end, e.cached, e.offloaded) for e in got]


def test_a_stream_is_its_first_token_alone_then_chunks_of_tokens_per_chunk_the_last_holding_the_rest():
    speed = Speed(itl_s=0.25, tokens_per_chunk=3)
    # 8 tokens: token 0, then 1-3, 4-6, and 7 left over; gaps 3, 3 and 1 tokens x 0.25 s
    assert speed.chunk_ends(8) == [0, 3, 6, 7] and speed.chunk_gaps_s(8) == [0.75, 0.75, 0.25]
    assert speed.chunk_ends(4) == [0, 3] and speed.chunk_gaps_s(4) == [0.75]  # 1-3: one whole chunk
    assert speed.chunk_ends(5) == [0, 3, 4] and speed.chunk_gaps_s(5) == [0.75, 0.25]
    assert speed.chunk_ends(2) == [0, 1] and speed.chunk_ends(1) == [0] and speed.chunk_gaps_s(1) == []
    assert Speed(tokens_per_chunk=0).chunk_ends(3) == [0, 1, 2]  # 0 is taken as 1: a token a chunk


def test_a_speculative_step_drafts_its_tokens_and_accepts_all_of_a_chunk_but_its_last():
    speed = Speed(tokens_per_chunk=3, spec_draft_tokens=5)
    # 8 tokens in chunks of 1, 3, 3, 1: three steps after the first token, 3 x 5 = 15 drafted,
    # accepted 2 + 2 + 0 = 4 (each chunk's last token is the target model's own)
    assert speed.spec_counts(8) == (3, 15, 4)
    assert speed.spec_counts(2) == (1, 5, 0)  # one step of one token: nothing accepted
    assert speed.spec_counts(1) == (0, 0, 0)  # the first token alone is no step
    assert Speed(tokens_per_chunk=3).spec_counts(8) == (0, 0, 0)  # not speculative


def test_the_first_token_waits_ttft_the_prefill_of_what_no_cache_held_and_the_load_of_the_host_tier():
    speed = Speed(ttft_s=0.5, itl_s=0.25, prefill_tok_s=64, offload_tok_s=128)
    assert speed.first_token_s(128) == 2.5  # 0.5 + 128 / 64
    assert speed.first_token_s(128, cached=64) == 1.5  # 0.5 + 64 / 64: the card's hits are free
    assert speed.first_token_s(128, 64, 32) == 1.25  # 0.5 + 32 / 64 + 32 / 128 loaded from the host
    assert speed.service_s(128, 5, 64, 32) == 2.25  # 1.25 + 4 gaps x 0.25
    assert speed.service_s(128, 1) == speed.service_s(128, 0) == 2.5  # no gap after a lone token
    assert Speed(ttft_s=0.5).first_token_s(128, 0, 64) == 0.5  # rates of 0: prefill and load free
    assert Speed(itl_s=0.25, tokens_per_chunk=4).step_s() == 1.0  # a step is a chunk's gap: 4 x 0.25
    assert Speed(itl_s=0.25, tokens_per_chunk=0).step_s() == 0.25


def test_the_engine_clock_counts_a_step_a_chunk_gap_over_each_stretch_and_one_more_a_stretch():
    clock = EngineClock(step_s=0.25)
    clock.begin(1.0)
    assert clock.steps(1.5) == 3.0  # under way: 0.5 / 0.25 + 1
    clock.end(2.0)
    assert clock.steps(100.0) == 5.0  # 1.0 / 0.25 + 1, whenever asked after
    clock.begin(3.0)
    clock.end(3.0)  # a lone token: a stretch of no length, one step
    assert (clock.steps(9.0), clock.busy_s, clock.stretches) == (6.0, 1.0, 2)
    overlap = EngineClock(step_s=0.25)
    for t, begins in ((0.0, True), (0.5, True), (1.0, False), (1.5, False)):
        overlap.begin(t) if begins else overlap.end(t)
    assert overlap.steps(2.0) == 7.0  # one stretch 0 to 1.5 s: 6 + 1, the two share their steps
    early = EngineClock(step_s=0.25)
    early.begin(2.0)
    early.end(1.0)  # an end stamped before its begin counts no time, only its step
    assert early.steps(5.0) == 1.0


def test_engine_steps_join_spans_that_touch_a_begin_before_an_end_at_the_same_time():
    # 0-1 and 1-2 s touch: one stretch of 2 s, 8 + 1 steps (two stretches would be 5 + 5);
    # 5-5.5 s: 2 + 1 steps
    assert engine_steps([(0.0, 1.0), (1.0, 2.0), (5.0, 5.5)], 0.25) == 12.0
    assert engine_steps([], 0.25) == 0.0
    speed = Speed(itl_s=0.0625, tokens_per_chunk=4)  # a step of 0.25 s
    # 17 tokens in chunks of 1, 4, 4, 4, 4: 16 gaps x 0.0625 = 1 s, 4 + 1 = 5 steps, one a chunk;
    # 16 tokens in chunks of 1, 4, 4, 4, 3: 0.9375 s, 3.75 + 1 = 4.75 (the short chunk a part step)
    assert len(speed.chunk_ends(17)) == 5 and engine_steps([(0.0, 16 * 0.0625)], speed.step_s()) == 5.0
    assert len(speed.chunk_ends(16)) == 5 and engine_steps([(0.0, 15 * 0.0625)], speed.step_s()) == 4.75


def test_each_nth_request_meets_its_fault_error_first_then_drop_short_stall_overclaim():
    faults = Faults(error_every=6, drop_every=3, short_every=2, stall_every=5, overclaim_every=7)
    # 6: error over drop and short; 10: short over stall; 14: short over overclaim; 1, 11, 13: none
    assert [faults.of(k) for k in range(1, 15)] == [
        None, "short", "drop", "short", "stall", "error", "overclaim",
        "short", "drop", "short", None, "error", None, "short",
    ]  # fmt: skip
    assert {Faults().of(k) for k in range(1, 50)} == {None}


def test_an_expected_request_has_the_ttft_e2e_and_tpot_a_perfect_client_measures():
    e = Expected(sent=1.0, first_token=1.25, end=1.75, prompt_tokens=10, output_tokens=5)
    assert (e.ttft_s, e.e2e_s, e.tpot_s) == (0.25, 0.75, 0.125)  # 0.5 s over 4 gaps
    assert Expected(sent=0.0, first_token=0.5, end=0.5, prompt_tokens=1, output_tokens=1).tpot_s is None


def test_a_closed_loops_users_join_over_the_ramp_and_think_between_requests_and_wait_for_a_slot():
    speed = Speed(ttft_s=0.5, itl_s=0.25)  # 3 tokens: 0.5 + 2 x 0.25 = 1 s a request
    closed = ClosedLoopSettings(ramp_s=1.0, think_s=0.5)  # user 1 joins at 1 x 1.0 / 2 = 0.5 s
    free = expected(speed, users=2, requests_per_user=2, prompt_tokens=0, output_tokens=3, closed=closed)
    # no cap: each request 1 s from its sending; each next one 0.5 s after the last one's end
    assert rows(free) == [
        (0, 0, 0.0, 0.5, 1.0, 0, 0),
        (1, 0, 0.5, 1.0, 1.5, 0, 0),
        (0, 1, 1.5, 2.0, 2.5, 0, 0),
        (1, 1, 2.0, 2.5, 3.0, 0, 0),
    ]
    one = Speed(ttft_s=0.5, itl_s=0.25, max_concurrency=1)
    capped = expected(one, users=2, requests_per_user=2, prompt_tokens=0, output_tokens=3, closed=closed)
    # one slot: user 1's first waits to 1.0, user 0's second (sent 1.5) to 2.0, user 1's second
    # (sent 2.0 + 0.5) to 3.0
    assert rows(capped) == [
        (0, 0, 0.0, 0.5, 1.0, 0, 0),
        (1, 0, 0.5, 1.5, 2.0, 0, 0),
        (0, 1, 1.5, 2.5, 3.0, 0, 0),
        (1, 1, 2.5, 3.5, 4.0, 0, 0),
    ]
    assert [e.ttft_s for e in capped] == [0.5, 1.0, 1.0, 1.0]


def test_open_loop_arrivals_are_served_by_due_time_kept_in_the_order_given_and_charged_their_hits():
    speed = Speed(ttft_s=0.5, itl_s=0.25, prefill_tok_s=64, offload_tok_s=32, max_concurrency=1)
    got = expected(speed, arrivals=[(1.0, 128, 3, 64, 32), (0.0, 64, 1)])
    # the second given is due first: 0.5 + 64 / 64 = 1.5 s to its lone token. The first waits for
    # the slot to 1.5: 0.5 + (128 - 64 - 32) / 64 + 32 / 32 = 2 s to its first token, + 2 x 0.25
    assert rows(got) == [(0, 0, 1.0, 3.5, 4.0, 64, 32), (0, 1, 0.0, 1.5, 1.5, 0, 0)]
    tie = [(0.0, 0, 1), (0.0, 0, 3)]
    one = Speed(ttft_s=0.5, itl_s=0.25, max_concurrency=1)
    # due together: the first given goes first (0.5), the second takes the slot then (1.0, 1.5)
    assert [(e.first_token, e.end) for e in expected(one, arrivals=tie)] == [(0.5, 0.5), (1.0, 1.5)]
    assert [(e.first_token, e.end) for e in expected(Speed(0.5, 0.25), arrivals=tie)] == [(0.5, 0.5), (0.5, 1.0)]


def test_a_sessions_next_turn_waits_its_own_think_time_and_reads_only_what_its_cache_did_not_hold():
    speed = Speed(ttft_s=0.5, itl_s=0.25, prefill_tok_s=32)
    waits = {(0, 1): 0.75, (0, 2): 0.25}
    calls = []

    def think(s: int, k: int) -> float:
        calls.append((s, k))
        return waits[s, k]

    sessions = [(1.0, [(16, 2), (48, 2, 16, 0), (8, 1)]), (0.0, [(0, 1)])]
    got = expected(speed, sessions=sessions, think_s=think)
    # session 1: 0.5 s to its lone token. Session 0: 0.5 + 16 / 32 = 1 s to its first token, ends
    # 2.25; its turn 1 at 2.25 + 0.75 = 3.0 reads 48 - 16 = 32 tokens (1 s), first token 4.5, ends
    # 4.75; its turn 2 at 4.75 + 0.25 = 5.0, 0.5 + 8 / 32 to its lone token
    assert rows(got) == [
        (1, 0, 0.0, 0.5, 0.5, 0, 0),
        (0, 0, 1.0, 2.0, 2.25, 0, 0),
        (0, 1, 3.0, 4.5, 4.75, 16, 0),
        (0, 2, 5.0, 5.75, 5.75, 0, 0),
    ]
    assert calls == [(0, 1), (0, 2)]  # asked (session, turn) for each next turn only


def test_its_command_line_holds_every_setting_but_the_defaults_and_reads_back_the_same():
    speed = Speed(tokens_per_chunk=2, spec_draft_tokens=3, prefix_cache_tokens=4096, offload_cache_tokens=8192,
                  offload_tok_s=1000.0)  # fmt: skip
    faults = Faults(error_every=9, dead_after_probe=True)
    answers = Answers(diverge_every=4, diverge_at=2, nll_wave=0.5)
    flags = argv(speed, faults, answers)
    assert flags == [
        "--tokens-per-chunk", "2", "--spec-draft-tokens", "3", "--prefix-cache-tokens", "4096",
        "--offload-cache-tokens", "8192", "--offload-tok-s", "1000.0", "--error-every", "9",
        "--dead-after-probe", "--diverge-every", "4", "--diverge-at", "2", "--nll-wave", "0.5",
    ]  # fmt: skip
    assert argv(Speed()) == []
    assert parse_argv([*MODULE, *flags]) == (speed, faults)  # the server's other flags left alone
    assert parse_argv(["vllm", "serve", *flags]) is None  # not this module's command line
    p = argparse.ArgumentParser()
    add_speed_args(p)
    assert answers_of(p.parse_args(flags)) == answers


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--itl-s", "-0.5"], "--itl-s must not be negative"),
        (["--prefix-cache-tokens", "-1"], "--prefix-cache-tokens must not be negative"),
        (["--offload-cache-tokens", "64"], "needs --prefix-cache-tokens"),
        (["--tokens-per-chunk", "0"], "--tokens-per-chunk must be at least 1"),
        (["--tokens-per-chunk", "4", "--spec-draft-tokens", "2"], "at least --tokens-per-chunk - 1"),
    ],
)
def test_a_setting_it_cannot_serve_is_refused_in_one_line(flags, says):
    with pytest.raises(SystemExit, match=says):
        parse_argv([*MODULE, *flags])


def test_drafts_enough_for_a_chunk_and_answers_out_of_bounds_are_told_apart():
    speed, _ = parse_argv([*MODULE, "--tokens-per-chunk", "4", "--spec-draft-tokens", "3"])
    assert (speed.tokens_per_chunk, speed.spec_draft_tokens) == (4, 3)  # 3 drafts: a chunk's 3 accepted
    p = argparse.ArgumentParser()
    add_speed_args(p)
    with pytest.raises(SystemExit, match="must not be negative"):
        answers_of(p.parse_args(["--nll", "-1"]))


def test_a_negative_concurrency_cap_is_refused_in_one_line():
    # 0 means no cap; -1 is no number of slots, and min(-1, users) slots is an empty heap
    with pytest.raises(SystemExit, match="--max-concurrency must not be negative"):
        parse_argv([*MODULE, "--max-concurrency", "-1"])
