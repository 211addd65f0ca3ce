"""The result record: one definition, a generated schema kept current, old versions readable,
and every committed result conforming."""

import functools
import json

import jsonschema
import pytest
from conftest import REPO
from records import fake_result, write_result

from speedsplit.core.record import (
    SCHEMA_VERSION,
    ResultError,
    StackDef,
    json_schema,
    parse_result,
    read_result,
    to_json,
)
from speedsplit.core.specs import JobSpec
from speedsplit.core.requestlog import read_requests, requests_path

SCHEMA = REPO / "docs" / "result-schema.json"


def test_the_committed_schema_is_generated_from_the_record_types():
    assert json.loads(SCHEMA.read_text()) == json_schema(), (
        "docs/result-schema.json is stale: speedsplit schema > docs/result-schema.json"
    )


@functools.cache
def _validator(kind: str):
    """A validator of the committed schema for one of its records (made once: 308 committed
    results are checked with it)."""
    defs = json.loads(SCHEMA.read_text())["$defs"]
    return jsonschema.Draft202012Validator({"$defs": defs, "$ref": f"#/$defs/{kind}"})


def test_a_written_result_conforms_to_the_schema_and_reads_back_equal(tmp_path):
    res = fake_result("vllm-marlin", 8, 0, 100.0)
    write_result(tmp_path / "r.json", res)
    data = json.loads((tmp_path / "r.json").read_text())
    _validator("RunResult").validate(data)
    assert read_result(tmp_path / "r.json") == res
    failed = fake_result("vllm-marlin", 8, 0, None, status="startup_failed")
    _validator("RunResult").validate(to_json(failed))
    assert failed.summary is None


def test_an_unknown_key_or_a_wrong_type_is_refused_with_its_place():
    data = to_json(fake_result("hf-fp16", 8, 0, 100.0))
    with pytest.raises(ResultError, match="at summary.output_tok_s"):
        parse_result({**data, "summary": {**data["summary"], "output_tok_s": "fast"}})
    with pytest.raises(ResultError, match="at _records"):
        parse_result({**data, "_records": []})
    with pytest.raises(ResultError, match="unfinished"):
        parse_result({**data, "status": None})


def _as_version_4(v5: dict) -> dict:
    """A version 5 record as version 4 wrote it: the cell's load's keys at the cell's top."""
    cell = dict(v5["job"]["cell"])
    load = {k: v for k, v in cell.pop("load").items() if k != "kind"}
    return {**v5, "schema_version": 4, "job": {**v5["job"], "cell": {**cell, **load}}}


def _as_version_2(v3: dict) -> dict:
    """A version 3 record as version 2 wrote it: the cell as `params`, a few stack fields as `stack_def`."""
    v2 = {k: v for k, v in v3.items() if k != "job"}
    stack_def = {k: v3["job"]["stack"][k] for k in StackDef.model_fields}
    return {**v2, "schema_version": 2, "params": v3["job"]["cell"], "stack_def": stack_def}


def test_a_result_embeds_its_job_file_whole():
    """A result's `job` is the job file's JobSpec: the stack with its command line, the cell, the run."""
    res = fake_result("vllm-fp16", 8, 1, 100.0)
    job = JobSpec.model_validate(to_json(res)["job"])
    assert job.stack.args == ["{python}"] and job.cell.users == 8 and job.run == 1


def test_a_version_2_result_is_upgraded():
    v5 = to_json(fake_result("vllm-fp16", 8, 1, 100.0))
    res = parse_result(_as_version_2(_as_version_4(v5)))
    assert res.schema_version == SCHEMA_VERSION and isinstance(res.job.stack, StackDef) and res.job.run == 1
    assert to_json(res)["job"]["cell"] == v5["job"]["cell"] and res.job.stack.platform == "cpu"


def test_a_version_3_result_is_read_with_no_quality():
    v4 = _as_version_4(to_json(fake_result("vllm-fp16", 8, 1, 100.0)))
    res = parse_result({**{k: v for k, v in v4.items() if k != "quality"}, "schema_version": 3})
    assert res.schema_version == SCHEMA_VERSION == 5 and res.quality is None


@pytest.mark.parametrize(
    "flat, load",
    [
        ({"users": 8, "ramp_s": 2.0}, {"kind": "closed", "users": 8, "ramp_s": 2.0, "think_s": 0}),
        (
            {"users": 0, "arrival": {"rate_rps": 4.0, "requests": 40}, "lengths": None, "max_client_lag_s": 0.1},
            {"kind": "open", "arrival": {"rate_rps": 4.0, "requests": 40}, "lengths": None, "max_client_lag_s": 0.1},
        ),
        (
            {"users": 0, "arrival": None, "trace": {"path": "t.jsonl", "speedup": 2.0}, "max_client_lag_s": 0.1},
            {"kind": "trace", "trace": {"path": "t.jsonl", "speedup": 2.0}, "max_client_lag_s": 0.1},
        ),
    ],
    ids=["closed", "open", "trace"],
)
def test_a_version_4_cell_has_its_load_keys_read_as_its_typed_load(flat, load):
    """Version 4 wrote a cell's load as keys at its top (users, ramp_s, arrival, trace ...):
    read, they are the one typed field `load` of their kind, and nothing else of the cell moves."""
    v5 = to_json(fake_result("vllm-fp16", 8, 1, 100.0))
    v4 = _as_version_4(v5)
    v4["job"]["cell"] = {
        **{k: v for k, v in v4["job"]["cell"].items() if k not in ("users", "ramp_s", "think_s")},
        **flat,
    }
    res = parse_result(v4)
    assert res.schema_version == 5 and res.job.cell.load.model_dump() == load
    rest = {k: v for k, v in to_json(res)["job"]["cell"].items() if k != "load"}
    assert rest == {k: v for k, v in v5["job"]["cell"].items() if k != "load"}


def test_a_version_1_result_is_upgraded():
    v2 = _as_version_2(to_json(fake_result("hf-fp16", 8, 0, None, status="error")))
    v1 = {k: v for k, v in v2.items() if k not in ("session_key", "model_shape", "server", "error")}
    v1.update(schema_version=1, session="tiny/hf-fp16/tp1/all", model_config={"hidden_size": 128}, summary={})
    res = parse_result(v1)
    assert res.schema_version == SCHEMA_VERSION and res.session_key == "tiny/hf-fp16/tp1/all"
    assert res.summary is None and res.server is None and res.model_shape.hidden_size == 128
    assert res.job.cell.name == "u8-wide-greedy"


EVIDENCE_RESULTS = sorted((REPO / "docs/evidence").rglob("run*.json"))


@pytest.mark.parametrize("path", EVIDENCE_RESULTS, ids=lambda p: str(p.relative_to(REPO / "docs/evidence")))
def test_every_committed_result_conforms(path):
    """Read as the analysis reads it (older versions upgraded), it is what the schema says."""
    res = read_result(path)
    _validator("RunResult").validate(to_json(res))
    requests = requests_path(path)  # (the first pass of 2026-11-29 lost its request records)
    if requests.exists():
        records = read_requests(requests)  # each one validated by the type the schema is made from
        validator = _validator("RequestRecord")
        for record in records[:3] + records[-3:]:  # and the schema itself agrees
            validator.validate(record.model_dump(mode="json"))


def test_the_uncontended_offsets_are_read_at_the_runs_own_wait_for_a_first_token():
    """Two 1-user levels, first tokens 50 ms and 400 ms away: a run's offsets are the line's
    between them at its own TTFT, held at the ends; the 16-user level is no 1-user offset."""
    from speedsplit.core.facts import Calibration, CalibrationLevel

    def lv(users, wait, ttft, e2e):
        return CalibrationLevel(
            users=users,
            requests=8,
            ttft_s=ttft,
            itl_s=0.0001,
            tpot_s=0.0,
            e2e_s=e2e,
            e2e_p90_s=e2e,
            throughput_error=0.0,
            cycle_s=e2e + 0.001,
            wait_s=wait,
        )

    levels = [lv(1, 0.05, 0.002, 0.003), lv(16, 0.05, 0.004, 0.005), lv(1, 0.4, 0.009, 0.010)]
    cal = Calibration(
        measured_at="now",
        host_cpu="cpu",
        reference="ref",
        levels=levels,
        ttft_s=0.009,
        itl_s=0.0001,
        tpot_s=0.0,
        e2e_s=0.01,
        cycle_s=0.011,
        ceiling_tok_s=1e3,
        ceiling_users=64,
    )
    assert cal.uncontended()["ttft_s"] == pytest.approx(0.002)  # no wait given: the short one's
    assert cal.uncontended(0.02)["ttft_s"] == pytest.approx(0.002)
    assert cal.uncontended(0.225)["ttft_s"] == pytest.approx(0.0055)  # half way
    assert cal.uncontended(0.225)["e2e_s"] == pytest.approx(0.0065)
    assert cal.uncontended(0.225)["cycle_s"] == pytest.approx(0.0075)
    assert cal.uncontended(2.0)["ttft_s"] == pytest.approx(0.009)
    # a calibration from before the wait was recorded: its one level waited 50 ms
    old = cal.model_copy(update={"levels": [levels[0].model_copy(update={"wait_s": None})]})
    assert old.uncontended(0.4)["ttft_s"] == pytest.approx(0.002)
