"""A job as its runner reads it (core/specs.py): a cell's load in the flat keys every job file
and result was written with becomes one typed field and goes back to them unchanged, and a
job file of another version says which of its keys this one does not know."""

import pytest
from pydantic import ValidationError
from records import cell_spec, stack_spec

from speedsplit.core.loads import ClosedLoop, OpenLoop, Sessions
from speedsplit.core.specs import FLAT_LOAD_KEYS, CellParams, JobSpec, load_from_flat, parse_job

CELL = {
    "cell": "c", "workload": "w", "sampling": "greedy", "prompt_tokens": 8, "output_tokens": 16,
    "requests_per_user": 2, "warmup_requests": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0, "min_measured_s": 1.0,
}  # fmt: skip
SESSIONS = {
    "pattern": "poisson", "rate_rps": 2.0, "burstiness": 1.0, "count": 4, "turns": 3, "turn_tokens": 100,
    "think_s": 0.2, "shared_prefix_tokens": 0,
}  # fmt: skip


@pytest.mark.parametrize(
    ("flat", "kind"),
    [
        ({"users": 4, "ramp_s": 0.0, "think_s": 0.0}, ClosedLoop),
        ({"users": 0, "arrival": {"pattern": "poisson", "rate_rps": 3.0, "requests": 10}}, OpenLoop),
        ({"users": 0, "sessions": SESSIONS, "max_client_lag_s": 0.5}, Sessions),
    ],
)
def test_a_cells_flat_load_keys_become_its_load_and_go_back_unchanged(flat, kind):
    cell = CellParams(**CELL, **flat)
    assert isinstance(cell.load, kind)
    back = {k: v for k, v in cell.flat_load().items() if v is not None}
    assert back.items() >= {k: v for k, v in flat.items() if k != "users" or v}.items()
    assert set(cell.flat_load()) >= set(FLAT_LOAD_KEYS)
    assert load_from_flat({**CELL, "load": cell.load.model_dump()}) == {**CELL, "load": cell.load.model_dump()}


def test_a_cell_refuses_a_key_it_does_not_know():
    with pytest.raises(ValidationError, match="usres"):
        CellParams(**CELL, users=4, usres=4)


def test_a_job_file_of_another_version_names_its_unknown_keys():
    job = JobSpec(stack=stack_spec(), cell=cell_spec(), run=1)
    data = job.model_dump(mode="json")
    data["stack"]["gpu_flavour"] = "x"
    data["cell"]["think_harder"] = True
    parsed, unknown = parse_job(data, run=1)
    assert parsed == job and unknown == ["stack: gpu_flavour", "cell: think_harder"]
    older = {"stack": job.stack.model_dump(mode="json"), "cell": job.cell.model_dump(mode="json")}
    assert parse_job(older, run=3)[0].run == 3  # written before the run was in it
