"""A cell's kind of load (speedsplit/core/loads.py), read from the job params of every shipped
config's cells."""

import pytest
from conftest import REPO
from records import cell_spec

from speedsplit.core.loads import ClosedLoop, OpenLoop, Sessions, TraceReplay
from speedsplit.core.specs import CellParams
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C

from speedsplit.planning import grid as G

CONFIGS = [
    ["config/config.yaml"],
    ["config/h200-smoke.yaml", "config/h200-traffic.yaml"],
    ["tests/config/truth.yaml"],
]


@pytest.mark.parametrize("files", CONFIGS, ids=lambda f: f[-1])
def test_every_cell_of_a_shipped_config_has_its_kind_of_load(files):
    cfg = C.load(*(REPO / f for f in files))
    kinds = set()
    for cell in G.cells(cfg):
        load = CellParams.model_validate(G.cell_params(cfg, cell)).load
        expect = {"trace": TraceReplay, "sessions": Sessions, "open": OpenLoop, "closed": ClosedLoop}[cell.kind]
        assert type(load) is expect, cell.name
        if isinstance(load, ClosedLoop):
            assert load.users == cell.users and load.schedule_s() is None
        elif isinstance(load, OpenLoop):
            assert load.arrival["rate_rps"] == cell.rate and load.schedule_s() > 0
        elif isinstance(load, Sessions):
            assert load.sessions.rate_rps == cell.rate == load.rate_rps and load.schedule_s() > 0
        else:
            assert load.trace["speedup"] == cell.rate
        kinds.add(load.kind)
    assert kinds


def test_the_load_kinds_say_how_long_their_arrivals_span():
    def cell(**kw):
        return cell_spec(users=0, max_client_lag_s=1.0, **kw)

    assert cell(arrival={"rate_rps": 4.0, "requests": 100}).load.schedule_s() == 25.0
    assert cell(arrival={"rate_rps": 4.0, "duration_s": 10}).load.schedule_s() == 10.0
    assert cell(trace={"speedup": 2.0, "duration_s": 60}).load.schedule_s() == 30.0
    assert cell(trace={"speedup": 2.0, "requests": 60}).load.schedule_s() is None
    assert cell_spec(users=8, ramp_s=2.0).load == ClosedLoop(users=8, ramp_s=2.0)


def test_a_closed_loop_setting_goes_from_the_workload_to_the_job_file_and_the_load(tmp_path):
    """One definition (ClosedLoopSettings): a workload's think_s is its cells' job-file key and
    their load's setting; a workload without it writes none (its cells keep their params)."""
    import yaml

    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"workloads": {"wide": {"think_s": 2}}}))
    cfg = C.load(top)
    cell = next(c for c in G.cells(cfg) if c.workload == "wide")
    params = G.cell_params(cfg, cell)
    assert params["think_s"] == 2.0 and isinstance(params["think_s"], float) and "ramp_s" not in params
    load = CellParams.model_validate(params).load
    assert load == ClosedLoop(users=cell.users, think_s=2.0)
    assert "think_s" not in G.cell_params(C.load(), G.cells(C.load())[0])


def test_a_sessions_workload_makes_a_cell_per_rate_whose_job_file_holds_its_sessions(tmp_path):
    import yaml

    from speedsplit.core.loads import SessionSchedule

    top = tmp_path / "top.yaml"
    sessions = {"rates": [0.5, 2], "count": 6, "turns": 3, "turn_tokens": 16, "think_s": 0.5}
    top.write_text(yaml.safe_dump({"workloads": {"agent": {"prompt_tokens": 64, "output_tokens": 16, "sessions": sessions}},
                                   "grid": {"workloads": ["agent"]}}))  # fmt: skip
    cfg = C.load(top)
    got = [c for c in G.cells(cfg) if c.workload == "agent"]
    assert [c.name for c in got] == ["s0.5-agent-greedy", "s2-agent-greedy"]
    load = CellParams.model_validate(G.cell_params(cfg, got[0])).load
    assert load.sessions == SessionSchedule(rate_rps=0.5, count=6, turns=3, turn_tokens=16, think_s=0.5)
    assert load.schedule_s() == 6 / 0.5 + 2 * 0.5
    assert load.sessions.context_tokens(64, 16) == 64 + 2 * (16 + 16) + 16


@pytest.mark.parametrize(
    "workload, error",
    [
        ({"sessions": {"rates": [1], "count": 2, "turns": 40, "turn_tokens": 64}},
         r"workloads.agent.sessions: a session's last turn holds 4000 tokens .* beyond models.tiny.max_model_len"),
        ({"sessions": {"rates": [1], "count": 2, "turns": 2, "turn_tokens": 8}, "arrival": {"rates": [1], "requests": 4}},
         r"workloads.agent: arrival and sessions are two kinds of load; give one"),
        ({"sessions": {"rates": [1], "count": 2, "turns": 2, "turn_tokens": 8, "shared_prefix_tokens": 65}},
         r"workloads.agent.sessions.shared_prefix_tokens: 65 is more than the first prompt's prompt_tokens \(64\)"),
    ],
)  # fmt: skip
def test_a_sessions_workload_that_cannot_run_is_refused_in_one_line(tmp_path, workload, error):
    import yaml

    top = tmp_path / "top.yaml"
    body = {"prompt_tokens": 64, "output_tokens": 36, **workload}
    top.write_text(yaml.safe_dump({"workloads": {"agent": body}, "grid": {"workloads": ["agent"]}}))
    with pytest.raises(ConfigError, match=error):
        C.load(top)


def test_a_session_trace_gives_each_session_its_own_turns(tmp_path):
    """AIPerf's multi-turn rows: each turn's new tokens, answer and wait are the trace's (scaled),
    its sessions begin at the cell's rate; a turn without an answer's length asks the workload's.
    Without a trace, the params keep the keys finished sessions cells were planned with."""
    import yaml

    from speedsplit.core.loads import SessionSchedule

    top = tmp_path / "top.yaml"
    sessions = {"rates": [1], "trace": str(REPO / "tests/data/agent-sessions.jsonl"), "length_scale": 0.1}
    top.write_text(yaml.safe_dump({"workloads": {"agent": {"prompt_tokens": 64, "output_tokens": 7, "sessions": sessions}},
                                   "grid": {"workloads": ["agent"]}}))  # fmt: skip
    cfg = C.load(top)
    params = G.cell_params(cfg, G.cell_by_name(cfg, "s1-agent-greedy"))
    load = CellParams.model_validate(params).load
    assert load.sessions.count == 2 and load.sessions.turns is None and params["sessions"]["length_scale"] == 0.1
    assert load.sessions.plans(64, 7) == [
        [(12, 4, 0.0), (6, 8, 0.15), (40, 3, 0.03)],  # edit-1: its rows wherever they lie in the file
        [(20, 2, 0.0), (3, 7, 0.25)],  # chat-7: its second turn asks the workload's 7
    ]
    assert load.sessions.context_tokens(64, 7) == 12 + 4 + 6 + 8 + 40 + 3
    assert load.schedule_s() == 2 / 1 + 0.25  # arrivals, then the longest waits a session has
    uniform = SessionSchedule(rate_rps=1, count=2, turns=2, turn_tokens=5, think_s=0.5)
    assert set(uniform.params()) == {"pattern", "rate_rps", "burstiness", "count", "turns", "turn_tokens", "think_s",
                                     "shared_prefix_tokens"}  # fmt: skip
    assert uniform.plans(10, 3) == [[(10, 3, 0.0), (5, 3, 0.5)]] * 2


@pytest.mark.parametrize(
    "sessions, error",
    [
        ({"trace": "no/such.jsonl"}, r"workloads.agent.sessions.trace: session trace not found: no/such.jsonl"),
        ({"trace": "TRACE", "turns": 3}, r"workloads.agent.sessions: turns and turn_tokens come from the trace: give one"),
        ({"count": 2}, r"workloads.agent.sessions: count, turns and turn_tokens are needed without a trace"),
        ({"trace": "BAD"}, r"workloads.agent.sessions.trace: .*bad.jsonl line 2: not a session trace row"),
    ],
)  # fmt: skip
def test_a_session_trace_that_cannot_run_is_refused_in_one_line(tmp_path, sessions, error):
    import yaml

    (tmp_path / "bad.jsonl").write_text('{"session_id": 1, "input_length": 4}\n{"input_length": 4}\n')
    given = {k: {"TRACE": str(REPO / "tests/data/agent-sessions.jsonl"), "BAD": str(tmp_path / "bad.jsonl")}.get(v, v)
             for k, v in sessions.items()}  # fmt: skip
    top = tmp_path / "top.yaml"
    body = {"prompt_tokens": 64, "output_tokens": 8, "sessions": {"rates": [1], **given}}
    top.write_text(yaml.safe_dump({"workloads": {"agent": body}, "grid": {"workloads": ["agent"]}}))
    with pytest.raises(ConfigError, match=error):
        C.load(top)
