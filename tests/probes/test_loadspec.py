"""A cell run's load (speedsplit/probes/loadspec.py): its prompts and schedule from the job spec,
each request's place in its run, and the body each request dialect sends."""

import json

import pytest
from conftest import REPO
from records import cell_spec, stack_spec

from speedsplit.core.loads import ClosedLoopSettings, DueRequest
from speedsplit.core.traffic import TrafficError
from speedsplit.models.prompts import load_tokenizer
from speedsplit.probes.loadspec import IDLE_CLOSE_S, LoadSpec, SessionRun, cell_load, prompt_seed, request_body
from speedsplit.probes.loadspec import request_index

OPEN = dict(cell="r4-mix-greedy", users=0, prompt_tokens=8, output_tokens=4, requests_per_user=1)
TRACE = str(REPO / "tests/data/mooncake-conversation-excerpt.jsonl")
SESSION_TRACE = str(REPO / "tests/data/agent-sessions.jsonl")


def load_of(tiny_model, run=0, stack=None, **cell) -> LoadSpec:
    return cell_load(["http://a", "http://b"], "m", stack or stack_spec(), cell_spec(**cell), run, tiny_model)


def ids_of(tiny_model, texts: list[str]) -> list[list[int]]:
    tok = load_tokenizer(tiny_model)
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def spec(**kw) -> LoadSpec:
    return LoadSpec(**{"urls": ["http://x"], "model": "m", "prompts": ["p"], "users": 3, "prompt_tokens": 4,
                       "output_tokens": 5, **kw})  # fmt: skip


def test_a_prompt_seed_is_the_cells_seed_plus_a_checksum_of_its_name_and_run():
    assert [prompt_seed(cell_spec(), run) for run in (0, 1)] == [2303135887, 4265615385]  # crc32("u8-wide-greedy/runN")
    assert prompt_seed(cell_spec(seed=7, cell="r2-mix-greedy"), 3) == 1619383567


def test_a_closed_loop_run_gets_its_own_prompt_of_the_cells_length_for_every_request(tiny_model):
    load = load_of(tiny_model, users=2, requests_per_user=2, warmup_requests=1)
    assert len(load.prompts) == 2 * (2 + 1) == len(set(load.prompts))
    assert [len(x) for x in ids_of(tiny_model, load.prompts)] == [8] * 6
    assert (load.kind, load.schedule, load.fitted, load.sessions) == ("closed", None, None, None)
    assert load_of(tiny_model, users=2).prompts == load.prompts  # from the seed alone
    assert not set(load_of(tiny_model, run=1, users=2).prompts) & set(load.prompts)  # each run its own


def test_a_run_takes_the_cells_and_stacks_settings_and_its_own_sampling_seed(tiny_model):
    cell = dict(users=3, seed=5, temperature=0.7, top_p=0.9, request_timeout_s=30.0, stall_timeout_s=9.0,
                outlier_factor=3.0, outlier_min_s=0.5, ramp_s=1.5, think_s=0.25)  # fmt: skip
    load = load_of(tiny_model, run=2, stack=stack_spec(dialect="transformers", keep_alive=False), **cell)
    got = {k: getattr(load, k) for k in ("urls", "model", "users", "prompt_tokens", "output_tokens")}
    assert got == {"urls": ["http://a", "http://b"], "model": "m", "users": 3, "prompt_tokens": 8, "output_tokens": 16}
    assert (load.requests_per_user, load.warmup_requests, load.temperature, load.top_p) == (2, 1, 0.7, 0.9)
    assert load.seed == 5 + 100003 * 2
    assert (load.dialect, load.keep_alive, load.idle_close_s) == ("transformers", False, IDLE_CLOSE_S)
    assert (load.request_timeout_s, load.stall_timeout_s, load.outlier_factor, load.outlier_min_s) == (30, 9, 3, 0.5)
    assert load.closed == ClosedLoopSettings(ramp_s=1.5, think_s=0.25)
    assert load.count_tokens(load.prompts[0]) == 8 and load.count_tokens(" w1 w2 w3") == 3


def test_request_counts_given_to_a_run_replace_the_cells_own(tiny_model):
    load = cell_load(
        ["u"], "m", stack_spec(), cell_spec(users=2), 0, tiny_model, requests_per_user=3, warmup_requests=0
    )
    assert (load.requests_per_user, load.warmup_requests, len(load.prompts)) == (3, 0, 2 * 3)


def test_every_stack_of_a_cell_run_gets_the_same_prompts_and_schedule(tiny_model):
    cell = dict(**OPEN, arrival={"pattern": "poisson", "rate_rps": 4.0, "requests": 5})
    vllm = load_of(tiny_model, stack=stack_spec(stack="v"), **cell)
    hf = load_of(tiny_model, stack=stack_spec(stack="hf", dialect="transformers", keep_alive=False), **cell)
    assert (hf.prompts, hf.schedule, hf.seed) == (vllm.prompts, vllm.schedule, vllm.seed)


def test_an_open_loop_run_gets_its_schedule_and_a_warm_up_then_a_prompt_of_each_requests_length(tiny_model):
    load = load_of(
        tiny_model, **OPEN, warmup_requests=2, arrival={"pattern": "constant", "rate_rps": 4.0, "requests": 5}
    )
    assert load.schedule == [DueRequest(0.25 * i, 8, 4) for i in range(5)]
    assert (load.kind, load.users, load.fitted) == ("open", 1, None)
    assert [len(x) for x in ids_of(tiny_model, load.prompts)] == [8] * 7 and len(set(load.prompts)) == 7


def test_an_open_loop_schedule_and_length_mix_are_fixed_by_the_seed_and_differ_between_runs(tiny_model):
    cell = dict(**OPEN, arrival={"pattern": "poisson", "rate_rps": 4.0, "requests": 5},
                lengths={"kind": "lognormal", "prompt_spread": 0.5, "output_spread": 0.5})  # fmt: skip
    runs = [load_of(tiny_model, run=r, **cell) for r in (0, 1, 0)]
    assert [(a.due_s, a.prompt_tokens, a.output_tokens) for a in runs[0].schedule] == [
        (0.0, 4, 2), (0.6705963109480025, 3, 6), (0.6974966088083656, 14, 8), (0.7402220439797128, 3, 5),
        (1.008773807792325, 19, 2),
    ]  # fmt: skip
    assert [(a.due_s, a.prompt_tokens, a.output_tokens) for a in runs[1].schedule] == [
        (0.0, 8, 6), (0.15574535205069964, 4, 3), (0.30418720401631727, 5, 4), (0.5110465444068735, 9, 9),
        (0.7459272111640178, 15, 6),
    ]  # fmt: skip
    assert (runs[2].schedule, runs[2].prompts) == (runs[0].schedule, runs[0].prompts)
    assert [len(x) for x in ids_of(tiny_model, runs[0].prompts)] == [8, 4, 3, 14, 3, 19]  # the warm-up's, then each


def test_a_trace_run_replays_its_window_with_prompts_made_of_the_traces_shared_blocks(tiny_model):
    """Lengths x 0.005 (blocks of round(512 x 0.005) = 3 tokens), five rows beyond the 64-token
    context skipped, the rows at 3 s due at 1.5 s (speedup 2)."""
    load = load_of(tiny_model, **OPEN, trace={"path": TRACE, "requests": 9, "speedup": 2.0, "length_scale": 0.005})
    assert [(a.due_s, a.prompt_tokens, a.output_tokens, a.blocks[:2], len(a.blocks)) for a in load.schedule] == [
        (0.0, 34, 2, (0, 1), 12), (0.0, 37, 2, (0, 14), 13), (0.0, 36, 4, (0, 28), 12), (0.0, 11, 2, (0, 42), 4),
        (0.0, 34, 1, (0, 46), 12), (0.0, 24, 1, (0, 59), 8), (0.0, 52, 2, (0, 165), 18), (1.5, 32, 3, (0, 415), 11),
        (1.5, 10, 2, (0, 427), 4),
    ]  # fmt: skip
    assert (load.kind, load.users, load.fitted) == ("open", 1, {"skipped": 5, "capped": 0})
    warm, *measured = ids_of(tiny_model, load.prompts)
    assert len(warm) == 8 and [len(x) for x in measured] == [a.prompt_tokens for a in load.schedule]
    assert len({tuple(x[:3]) for x in measured}) == 1 and warm[:3] != measured[0][:3]  # block 0 opens each
    assert len({tuple(x[3:6]) for x in measured}) == 9  # every second block its own


@pytest.mark.parametrize(
    "cell, error",
    [
        ({"prompt_tokens": 60, "arrival": {"pattern": "constant", "rate_rps": 1.0, "requests": 2}},
         r"^request 0 of the length mix needs 60 \+ 8 tokens, beyond the model's context \(64\)$"),
        ({"trace": {"path": "no/such.jsonl", "requests": 2}}, r"^trace not found: no/such.jsonl$"),
    ],
)  # fmt: skip
def test_a_run_whose_requests_cannot_be_planned_is_refused_in_one_line(tiny_model, cell, error):
    with pytest.raises(TrafficError, match=error):
        load_of(tiny_model, **{**OPEN, "output_tokens": 8, **cell})


def test_a_sessions_run_holds_its_sessions_after_the_warm_up_prompts(tiny_model):
    sessions = {"pattern": "constant", "rate_rps": 2.0, "count": 3, "turns": 3, "turn_tokens": 5, "think_s": 0.5}
    load = load_of(tiny_model, **{**OPEN, "cell": "s2-agent-greedy"}, warmup_requests=2, sessions=sessions)
    run = load.sessions
    assert (load.kind, load.users, load.schedule, len(load.prompts)) == ("sessions", 1, None, 2)
    assert (run.due_s, run.first_tokens) == ([0.0, 0.5, 1.0], [8, 8, 8])
    assert (run.asked, run.think_s) == ([[4, 4, 4]] * 3, [[0.5, 0.5]] * 3)
    assert [len(x) for x in ids_of(tiny_model, load.prompts + run.first)] == [8] * 5
    assert [[len(x) for x in ids_of(tiny_model, more)] for more in run.more] == [[5, 5]] * 3
    texts = load.prompts + run.first + [t for more in run.more for t in more]
    assert len(set(texts)) == 2 + 3 + 6  # no text twice in the run
    assert (run.requests, [run.start_index(s) for s in range(3)]) == (9, [0, 3, 6])


def test_sessions_are_fixed_by_the_seed_and_differ_between_runs(tiny_model):
    cell = {**OPEN, "cell": "s2-agent-greedy"}
    sessions = {"rate_rps": 2.0, "count": 3, "turns": 2, "turn_tokens": 5, "think_s": 0.5}
    runs = [load_of(tiny_model, run=r, **cell, sessions=sessions).sessions for r in (0, 1, 0)]
    assert runs[0].due_s == [0.0, 0.23857153840771064, 0.6037715437673634]
    assert runs[1].due_s == [0.0, 0.6280726652371845, 0.8940453851322196]
    assert runs[2] == runs[0]
    assert not set(runs[0].first + runs[0].more[0]) & set(runs[1].first + runs[1].more[0])


def test_sessions_with_a_shared_prefix_open_every_first_prompt_with_the_same_tokens(tiny_model):
    sessions = {"rate_rps": 2.0, "count": 3, "turns": 2, "turn_tokens": 5, "think_s": 0.5, "shared_prefix_tokens": 4}
    load = load_of(tiny_model, **{**OPEN, "cell": "s2-agent-greedy"}, sessions=sessions)
    first = ids_of(tiny_model, load.sessions.first)
    warm = ids_of(tiny_model, load.prompts)[0]
    assert [len(x) for x in first] == load.sessions.first_tokens == [8, 8, 8]
    assert len({tuple(x[:4]) for x in first}) == 1 and warm[:4] != first[0][:4]
    assert len({tuple(x[4:]) for x in first}) == 3  # the rest each session's own


def test_a_session_trace_gives_each_session_its_turns_lengths_answers_and_waits(tiny_model):
    """tests/data/agent-sessions.jsonl x 0.1: edit-1 adds 12, 6 and 40 tokens, asks 4, 8 and 3;
    chat-7 adds 20 and 3, asks 2 and (no output_length) the cell's 7."""
    sessions = {"rate_rps": 1.0, "count": 2, "trace": SESSION_TRACE, "length_scale": 0.1, "think_s": 0.0}
    load = load_of(tiny_model, **{**OPEN, "cell": "s1-agent-greedy", "output_tokens": 7}, sessions=sessions)
    run = load.sessions
    assert run.first_tokens == [len(x) for x in ids_of(tiny_model, run.first)] == [12, 20]
    assert [[len(x) for x in ids_of(tiny_model, more)] for more in run.more] == [[6, 40], [3]]
    assert (run.asked, run.think_s) == ([[4, 8, 3], [2, 7]], [[0.15, 0.03], [0.25]])
    assert (run.turns(0), run.turns(1), run.requests, run.start_index(1)) == (3, 2, 5, 3)


def test_a_session_run_places_each_sessions_first_turn_among_the_phases_requests():
    run = SessionRun([0.0] * 3, ["a", "b", "c"], [1] * 3, [["x"], [], ["y", "z"]], [[1, 1], [1], [1] * 3],
                     [[0.0], [], [0.0, 0.0]])  # fmt: skip
    assert [run.turns(s) for s in range(3)] == [2, 1, 3]
    assert (run.requests, [run.start_index(s) for s in range(3)]) == (6, [0, 2, 3])


def test_a_closed_loops_requests_are_placed_warm_ups_first_then_each_users_in_order():
    load = spec(users=3, warmup_requests=2, requests_per_user=4)
    assert [request_index(load, "warmup", u, i) for u in range(3) for i in range(2)] == list(range(6))
    assert [request_index(load, "measured", u, i) for u in range(3) for i in range(4)] == list(range(6, 18))


def test_an_open_loops_and_sessions_requests_follow_the_warm_up_in_their_order():
    open_ = spec(users=1, warmup_requests=2, schedule=[DueRequest(0.0, 4, 5)] * 3)
    assert [request_index(open_, "measured", 0, i) for i in range(3)] == [2, 3, 4]
    run = SessionRun([0.0] * 2, ["a", "b"], [1, 1], [["x", "y"], ["z"]], [[1] * 3, [1] * 2], [[0.0] * 2, [0.0]])
    sessions = spec(users=1, warmup_requests=1, sessions=run)
    assert [request_index(sessions, "warmup", 0, 0)] == [0]
    assert [request_index(sessions, "measured", s, k) for s, n in ((0, 3), (1, 2)) for k in range(n)] == [1, 2, 3, 4, 5]


def test_a_loads_kind_is_open_with_a_schedule_sessions_with_sessions_else_closed_unless_given():
    run = SessionRun([0.0], ["a"], [1], [[]], [[1]], [[]])
    assert [spec().kind, spec(schedule=[]).kind, spec(sessions=run).kind] == ["closed", "open", "sessions"]
    assert spec(load_kind="sessions").kind == "sessions" and spec(schedule=[], load_kind="closed").kind == "closed"
    assert IDLE_CLOSE_S == 4.0  # below the 5 s after which vLLM's and transformers' servers drop an idle connection


STREAM = {"model": "m", "prompt": "p", "max_tokens": 5, "stream": True}
VLLM = {**STREAM, "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "min_tokens": 5,
        "ignore_eos": True, "temperature": 0.7, "top_p": 0.9, "seed": 3}  # fmt: skip


@pytest.mark.parametrize(
    "dialect, body, generation",
    [
        ("vllm", VLLM, None),
        ("llamacpp", {**VLLM, "timings_per_token": True}, None),
        ("transformers", {**STREAM, "stream_options": {"include_usage": True}, "seed": 3},
         {"max_new_tokens": 5, "min_new_tokens": 5, "do_sample": True, "temperature": 0.7, "top_p": 0.9}),
    ],
)  # fmt: skip
def test_each_dialects_body_forces_the_output_length_and_sends_a_seed_when_sampling(dialect, body, generation):
    got = request_body(spec(dialect=dialect, temperature=0.7, top_p=0.9), "p", 3)
    if generation is not None:
        assert json.loads(got.pop("generation_config")) == generation
    assert got == body


def test_a_greedy_body_sends_no_seed_and_a_requests_own_output_length_replaces_the_cells():
    greedy = {k: v for k, v in VLLM.items() if k != "seed"}
    assert request_body(spec(), "q", 3, 9) == {**greedy, "prompt": "q", "max_tokens": 9, "min_tokens": 9,
                                                "temperature": 0.0, "top_p": 1.0}  # fmt: skip
    hf = request_body(spec(dialect="transformers"), "q", 3, 9)
    assert "seed" not in hf and json.loads(hf["generation_config"]) == {
        "max_new_tokens": 9, "min_new_tokens": 9, "do_sample": False,
    }  # fmt: skip


def test_an_unknown_dialect_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown request dialect 'openai' \(known: vllm, llamacpp, transformers\)$"):
        request_body(spec(dialect="openai"), "p", 0)
