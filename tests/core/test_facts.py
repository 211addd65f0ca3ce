"""The observed parts of a run's record (speedsplit/core/facts.py): unknown keys refused, the
defaults a silent log leaves, and what the records compute (rates, the host's move, offsets)."""

import inspect

import pytest
from pydantic import ValidationError

from speedsplit.core import facts
from speedsplit.core.facts import (
    Calibration,
    CalibrationLevel,
    EngineFacts,
    HostSpeed,
    ModelShape,
    ModelSource,
    ServerFacts,
    ServerTelemetry,
    StrictRecord,
    Telemetry,
)


def _level(users=1, wait=None, ttft=0.002, cycle=0.003, **changes) -> CalibrationLevel:
    """A calibration level whose other offsets follow its TTFT's (itl a tenth, tpot half, e2e +1 ms)."""
    base = dict(
        users=users, requests=8, ttft_s=ttft, itl_s=ttft / 10, tpot_s=ttft / 2, e2e_s=ttft + 0.001,
        e2e_p90_s=ttft + 0.002, throughput_error=0.0, cycle_s=cycle, wait_s=wait,
    )  # fmt: skip
    return CalibrationLevel(**{**base, **changes})


def _calibration(levels, **changes) -> Calibration:
    base = dict(
        measured_at="2026-11-30T00:00:00+00:00", host_cpu="Test CPU", reference="--speed 1", levels=levels,
        ttft_s=0.01, itl_s=0.001, tpot_s=0.005, e2e_s=0.011, cycle_s=0.012, ceiling_tok_s=1e3, ceiling_users=64,
    )  # fmt: skip
    return Calibration(**{**base, **changes})


def _server_telemetry(**changes) -> ServerTelemetry:
    base = dict(
        samples=4, kv_cache_usage_peak=0.5, kv_cache_usage_mean=0.25, running_mean=2.0, waiting_mean=0.0,
        waiting_peak=0.0, preemptions=0.0, prefix_cache_hit_rate=0.0, prefix_cache_hits_flagged=False,
        series={"t": [0.0, 1.0], "kv_cache": [0.25, None]},
    )  # fmt: skip
    return ServerTelemetry(**{**base, **changes})


def test_every_record_of_the_module_refuses_unknown_keys():
    models = [c for _, c in inspect.getmembers(facts, inspect.isclass) if c.__module__ == facts.__name__]
    assert len(models) == 19 and all(issubclass(c, StrictRecord) for c in models)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted") as err:
        EngineFacts(linear_kernel="MarlinLinearKernel", kernel="Marlin")
    assert err.value.errors()[0]["loc"] == ("kernel",)


def test_an_unknown_key_inside_a_nested_record_is_refused_at_its_place():
    server = {**_server_telemetry().model_dump(), "hit_rate": 0.5}
    with pytest.raises(ValidationError) as err:
        Telemetry(interval_s=0.5, server=server)
    assert [(e["loc"], e["type"]) for e in err.value.errors()] == [(("server", "hit_rate"), "extra_forbidden")]


def test_what_a_silent_log_or_an_unreadable_folder_leaves_is_all_null():
    for record in (EngineFacts(), ModelSource(), ModelShape()):
        dumped = record.model_dump()
        assert dumped and set(dumped.values()) == {None}, type(record).__name__


def test_the_compile_cache_is_warm_or_cold_and_nothing_else():
    assert EngineFacts(compile_cache="warm").compile_cache == "warm"
    with pytest.raises(ValidationError, match="Input should be 'warm' or 'cold'"):
        EngineFacts(compile_cache="hot")
    with pytest.raises(ValidationError, match="Input should be 'synthetic', 'hub' or 'local'"):
        ModelSource(source="gguf")


def test_a_fractional_token_count_is_refused_and_whole_log_seconds_are_kept_as_floats():
    with pytest.raises(ValidationError, match="got a number with a fractional part"):
        EngineFacts(kv_cache_tokens=1.5)
    engine = EngineFacts(kv_cache_tokens=4096, config_s=3)  # the log's clock gives whole seconds
    assert engine.kv_cache_tokens == 4096 and engine.config_s == 3.0 and type(engine.config_s) is float


def test_a_servers_facts_say_each_nullable_fact_even_when_null():
    """Null means 'looked, and there was none': a writer that forgets a field is refused, not read as null."""
    with pytest.raises(ValidationError) as err:
        ServerFacts()
    missing = {e["loc"][0] for e in err.value.errors() if e["type"] == "missing"}
    assert missing == {
        "startup_s", "lease_wait_s", "devices", "argv", "model_id", "error", "log_tail", "exit_code",
        "wide_listeners", "reused", "cells_before",
    }  # fmt: skip
    given = dict.fromkeys(missing - {"reused", "cells_before"}) | {"reused": False, "cells_before": 0}
    later = ServerFacts(**given)  # the fields added later read as absent in older results
    assert [later.cpus, later.memory_cap, later.host_memory, later.compile_cache_dir] == [None] * 4
    assert [later.lease_holders, later.shared_with, later.api_key_required] == [None] * 3


def test_server_telemetry_defaults_to_no_missed_readings_with_a_list_of_its_own():
    a, b = _server_telemetry(), _server_telemetry()
    assert (a.missed_readings, a.missed_why, a.sparse) == (0, [], False)
    assert (a.prefix_cache_hits, a.offload_hits, a.engine_steps, a.spec_drafts) == (None, None, None, None)
    a.missed_why.append("timeout")
    assert b.missed_why == []


def test_the_offload_hit_rate_is_the_connectors_hits_over_its_queries():
    assert _server_telemetry(offload_hits=300.0, offload_queries=1200.0).offload_hit_rate == 0.25  # 300 / 1200
    assert _server_telemetry(offload_hits=0.0, offload_queries=500.0).offload_hit_rate == 0.0  # looked, found none
    assert _server_telemetry(offload_hits=500.0, offload_queries=500.0).offload_hit_rate == 1.0


@pytest.mark.parametrize(
    "hits, queries",
    [(None, None), (None, 100.0), (50.0, None), (0.0, 0.0), (50.0, 0.0)],
    ids=["no-connector", "no-hits-counter", "no-queries-counter", "nothing-looked-up", "hits-without-queries"],
)
def test_there_is_no_offload_hit_rate_without_both_counters_or_with_no_queries(hits, queries):
    assert _server_telemetry(offload_hits=hits, offload_queries=queries).offload_hit_rate is None


def test_the_offload_hit_rate_is_computed_not_written_and_telemetry_reads_back_equal():
    tele = Telemetry(
        interval_s=0.5, server=_server_telemetry(offload_hits=1.0, offload_queries=3.0), gpu_absent="no NVML"
    )
    dumped = tele.model_dump(mode="json")
    assert "offload_hit_rate" not in dumped["server"]
    back = Telemetry.model_validate_json(tele.model_dump_json())
    assert back == tele and back.server.series["kv_cache"] == [0.25, None]  # a missed reading stays a gap
    assert back.server.offload_hit_rate == pytest.approx(1 / 3)


@pytest.mark.parametrize("before, after", [(40.0, 50.0), (50.0, 40.0)], ids=["slower-after", "quicker-after"])
def test_the_host_moved_by_its_slower_timing_over_its_quicker_either_way(before, after):
    assert HostSpeed(before_ms=before, after_ms=after).moved == 1.25  # 50 / 40


def test_a_host_that_kept_its_speed_moved_by_one():
    assert HostSpeed(before_ms=35.125, after_ms=35.125).moved == 1.0


def test_a_level_from_before_its_wait_was_recorded_waited_50_ms_and_a_zero_wait_stays_zero():
    assert _level(wait=None).waited_s == 0.05
    assert _level(wait=0.0).waited_s == 0.0  # a recorded 0 is not 'unrecorded'
    assert _level(wait=0.35).waited_s == 0.35


def test_with_no_levels_the_uncontended_offsets_are_the_carried_ones():
    cal = _calibration([])
    expected = {"ttft_s": 0.01, "itl_s": 0.001, "tpot_s": 0.005, "e2e_s": 0.011, "cycle_s": 0.012}
    assert cal.uncontended() == expected and cal.uncontended(0.3) == expected
    assert _calibration([], cycle_s=None).uncontended()["cycle_s"] is None  # measured before cycles were


def test_the_uncontended_offsets_are_the_fewest_users_level_in_any_order():
    """No 1-user level: the 4-user one's, not the 16-user one's, wherever it stands in the list."""
    levels = [_level(users=16, ttft=0.008, cycle=0.009), _level(users=4, ttft=0.002, cycle=0.003)]
    # 4 users: ttft 2 ms; itl 0.2 ms; tpot 1 ms; e2e 2 + 1 = 3 ms; cycle 3 ms
    expected = {"ttft_s": 0.002, "itl_s": 0.0002, "tpot_s": 0.001, "e2e_s": 0.003, "cycle_s": 0.003}
    for order in (levels, levels[::-1]):
        got = _calibration(order).uncontended()
        assert got == pytest.approx(expected)


def test_between_two_waits_the_offsets_are_read_off_the_line_of_the_nearest_two():
    """1-user levels waiting 100, 200 and 400 ms, TTFT offsets 1, 2 and 6 ms (given out of order)."""
    cal = _calibration([_level(wait=0.4, ttft=0.006), _level(wait=0.1, ttft=0.001), _level(wait=0.2, ttft=0.002)])
    at = lambda first_token_s: cal.uncontended(first_token_s)["ttft_s"]  # noqa: E731
    assert at(None) == pytest.approx(0.001)  # no wait given: the shortest wait's
    assert at(0.15) == pytest.approx(0.0015)  # half way from 100 to 200 ms: 1 + 0.5 * 1
    assert at(0.3) == pytest.approx(0.004)  # half way from 200 to 400 ms (not from 100): 2 + 0.5 * 4
    assert at(0.2) == pytest.approx(0.002)  # on a level: that level's
    assert at(0.35) == pytest.approx(0.005)  # 2 + 0.75 * 4; e2e follows 1 ms above it
    assert cal.uncontended(0.35)["e2e_s"] == pytest.approx(0.006)


def test_beyond_the_waits_measured_the_offsets_are_held_at_the_ends():
    cal = _calibration([_level(wait=0.1, ttft=0.001), _level(wait=0.4, ttft=0.006)])
    assert cal.uncontended(0.0)["ttft_s"] == pytest.approx(0.001)  # a zero wait is a wait, not 'none given'
    assert cal.uncontended(0.02)["ttft_s"] == pytest.approx(0.001)
    assert cal.uncontended(3.0)["ttft_s"] == pytest.approx(0.006)


def test_an_offset_below_zero_is_read_as_zero_after_the_line():
    cal = _calibration([_level(wait=0.1, ttft=-0.002), _level(wait=0.5, ttft=0.006)])
    assert cal.uncontended(0.1)["ttft_s"] == 0.0  # -2 ms: the client cannot be early
    assert cal.uncontended(0.3)["ttft_s"] == pytest.approx(0.002)  # -2 + 0.5 * 8 = 2 ms
    assert cal.uncontended(0.15)["ttft_s"] == 0.0  # -2 + 0.125 * 8 = -1 ms


def test_an_offset_one_of_the_two_levels_did_not_measure_is_none_between_them():
    cal = _calibration([_level(wait=0.1, cycle=None), _level(wait=0.4, cycle=0.007)])
    assert cal.uncontended(0.25)["cycle_s"] is None
    assert cal.uncontended(0.25)["ttft_s"] == pytest.approx(0.002)  # the others are still read
    assert cal.uncontended(0.4)["cycle_s"] == pytest.approx(0.007)  # on the level that measured it
    assert cal.uncontended()["cycle_s"] is None


@pytest.mark.parametrize("where", [None, "", "missing.json", "."], ids=["none", "empty", "missing", "a-folder"])
def test_there_is_no_calibration_to_read_where_no_file_is(where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Calibration.read(where) is None


def test_a_written_calibration_reads_back_equal_from_a_path_or_its_string(tmp_path):
    cal = _calibration([_level(wait=0.05), _level(users=16, wait=None, ttft=-0.001)])
    path = tmp_path / "calibration.json"
    path.write_text(cal.model_dump_json())
    assert Calibration.read(path) == cal and Calibration.read(str(path)) == cal
    assert Calibration.read(path).levels[1].wait_s is None  # 'not recorded' is not written as 0.05


def test_a_calibration_file_with_an_unknown_key_is_refused(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(_calibration([]).model_dump_json()[:-1] + ', "offset_s": 0.1}')
    with pytest.raises(ValidationError, match="offset_s\n  Extra inputs are not permitted"):
        Calibration.read(path)
