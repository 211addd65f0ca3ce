"""A workload as a config gives it (planning/workload_config.py): its kind from the section it
holds, its defaults, and a session trace's schedule."""

import pytest
from conftest import REPO
from pydantic import ValidationError

from speedsplit.planning.workload_config import SessionsConfig, WorkloadConfig

TRACE = str(REPO / "tests/data/agent-sessions.jsonl")


def test_a_workloads_kind_is_the_section_it_holds():
    lengths = {"prompt_tokens": 32, "output_tokens": 8}
    assert WorkloadConfig(**lengths).kind == "closed"
    assert WorkloadConfig(**lengths, arrival={"rates": [2], "requests": 10}).kind == "open"
    trace = {"path": "t.jsonl", "requests": 5, "speedups": [1]}
    assert WorkloadConfig(**lengths, trace=trace).kind == "trace"
    assert (
        WorkloadConfig(**lengths, sessions={"rates": [1], "count": 2, "turns": 2, "turn_tokens": 4}).kind == "sessions"
    )


def test_defaults_are_the_studys_closed_loop_on_random_words():
    w = WorkloadConfig()
    assert (w.prompt_tokens, w.output_tokens, w.requests_per_user, w.warmup_requests) == (512, 256, 2, 1)
    assert w.text == "random" and (w.ramp_s, w.think_s) == (0, 0)
    with pytest.raises(ValidationError):
        WorkloadConfig(text="prose")  # code, code-edit or random words only
    with pytest.raises(ValidationError):
        WorkloadConfig(prompt_tokens=0)


def test_a_session_trace_schedules_its_first_count_sessions_and_all_it_holds_at_most():
    two = SessionsConfig(rates=[2], trace=TRACE).schedule(2.0)
    assert two.count == 2 and two.rate_rps == 2.0  # the file holds two sessions
    assert SessionsConfig(rates=[2], trace=TRACE, count=1).schedule(2.0).count == 1
    assert SessionsConfig(rates=[2], trace=TRACE, count=9).schedule(2.0).count == 2
    # each turn its own new tokens and answer from the trace; the first waits for nothing
    plans = two.plans(prompt_tokens=60, output_tokens=24)
    assert plans[0][:2] == [(120, 40, 0.0), (60, 80, 0.15)]
    # without a trace: count sessions of turns turns, each turn's new text turn_tokens
    made = SessionsConfig(rates=[1], count=3, turns=2, turn_tokens=10, think_s=0.5).schedule(1.0)
    assert made.plans(50, 5) == [[(50, 5, 0.0), (10, 5, 0.5)]] * 3
