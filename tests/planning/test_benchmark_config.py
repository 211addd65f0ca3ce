"""The config's benchmark section (speedsplit/planning/benchmark_config.py): its defaults, its
bounds as a user meets them (one line naming the key) and as the typed section keeps them, the
names it must share with the rest of the config, the schema entry generated from it, and the
section of every shipped config reading as one."""

import pytest
from conftest import REPO
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from speedsplit.core.errors import ConfigError
from speedsplit.core.specs import OUTLIER_FACTOR, OUTLIER_MIN_S
from speedsplit.planning import config as C
from speedsplit.planning import grid as G
from speedsplit.planning.benchmark_config import BenchmarkConfig
from speedsplit.planning.typed_config import plain_schema

# the section as the schema fills it when a config says nothing of it
FILLED = {
    "models": [],
    "stacks": [],
    "topologies": ["tp1"],
    "server_reuse": "per_run",
    "warmup": "every_cell",
    "telemetry_s": 0.5,
    "cpu_isolation": True,
    "idle_timeout_s": 120,
    "foreign_idle_s": 60,
    "api_key": False,
    "lease_timeout_s": 3600,
    "request_timeout_s": 600,
    "max_client_lag_s": 0.1,
    "stall_timeout_s": 120,
    "cpu_lanes": 1,
    "calibration_users": [1, 16],
    "outlier_factor": 5.0,
    "outlier_min_s": 1.0,
    "min_measured_s": 1.0,
    "fail_on_undecomposed": True,
}
KEYS = ", ".join(sorted(FILLED))
DEFAULT = C.read_yaml(C.DEFAULT_CONFIG)


def json_schema() -> dict:
    """The config schema's `benchmark` entry (its defaults filled in when the section is absent)."""
    return C.load_schema()["properties"]["benchmark"]


def small(**sections) -> dict:
    """A small config of one model, two stacks in a chain and one workload, on a CPU."""
    return {
        "platform": "cpu",
        "models": {"m": {}, "n": {}},
        "stacks": {"a": {"args": ["a"]}, "b": {"args": ["b"]}, "c": {"args": ["c"]}},
        "chains": {"ab": ["a", "b"]},
        "workloads": {"w": {"prompt_tokens": 8, "output_tokens": 8}},
        "sampling": {"greedy": {}},
        **sections,
    }


def refusal(benchmark: dict, **sections) -> str:
    with pytest.raises(ConfigError) as err:
        C.validate(small(benchmark=benchmark, **sections))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_config_without_the_section_gets_every_default_and_reads_it_typed():
    cfg = C.validate(small())
    assert cfg.filled()["benchmark"] == FILLED
    assert BenchmarkConfig().model_dump() == FILLED
    assert cfg.benchmark == BenchmarkConfig()
    assert list(cfg.filled()["benchmark"]) == list(BenchmarkConfig.model_fields)  # in the section's own order


def test_the_outlier_defaults_are_the_job_files_so_a_default_run_leaves_them_out():
    """grid.cell_params names outlier_factor and outlier_min_s only where they differ from
    core/specs': a default here that drifted from those would change no job file."""
    assert (BenchmarkConfig().outlier_factor, BenchmarkConfig().outlier_min_s) == (OUTLIER_FACTOR, OUTLIER_MIN_S)
    cfg = C.validate(small())
    params = G.cell_params(cfg, G.cells(cfg)[0])
    assert "outlier_factor" not in params and "outlier_min_s" not in params
    cfg = C.validate(small(benchmark={"outlier_factor": 3, "outlier_min_s": 0}))
    params = G.cell_params(cfg, G.cells(cfg)[0])
    assert (params["outlier_factor"], params["outlier_min_s"]) == (3.0, 0.0)


@pytest.mark.parametrize(
    "entry, expect",
    [
        ({"models": "m"}, "config error at benchmark.models: 'm' is not of type 'array'"),
        ({"stacks": [1]}, "config error at benchmark.stacks[0]: 1 is not of type 'string'"),
        ({"topologies": "tp1"}, "config error at benchmark.topologies: 'tp1' is not of type 'array'"),
        (
            {"server_reuse": "never"},
            "config error at benchmark.server_reuse: 'never' is not one of ['per_run', 'per_stack', 'per_cell']",
        ),
        (
            {"warmup": "first"},
            "config error at benchmark.warmup: 'first' is not one of ['every_cell', 'session_start']",
        ),
        ({"telemetry_s": 0}, "config error at benchmark.telemetry_s: 0 is less than or equal to the minimum of 0"),
        ({"telemetry_s": "1"}, "config error at benchmark.telemetry_s: '1' is not of type 'number'"),
        ({"cpu_isolation": "no"}, "config error at benchmark.cpu_isolation: 'no' is not of type 'boolean'"),
        ({"idle_timeout_s": 0.5}, "config error at benchmark.idle_timeout_s: 0.5 is less than the minimum of 1"),
        ({"foreign_idle_s": -1}, "config error at benchmark.foreign_idle_s: -1 is less than the minimum of 0"),
        ({"api_key": 1}, "config error at benchmark.api_key: 1 is not of type 'boolean'"),
        ({"lease_timeout_s": 0}, "config error at benchmark.lease_timeout_s: 0 is less than the minimum of 1"),
        ({"request_timeout_s": 0.9}, "config error at benchmark.request_timeout_s: 0.9 is less than the minimum of 1"),
        (
            {"max_client_lag_s": 0},
            "config error at benchmark.max_client_lag_s: 0 is less than or equal to the minimum of 0",
        ),
        ({"stall_timeout_s": 0}, "config error at benchmark.stall_timeout_s: 0 is less than the minimum of 1"),
        ({"cpu_lanes": 0}, "config error at benchmark.cpu_lanes: 0 is less than the minimum of 1"),
        ({"cpu_lanes": 1.5}, "config error at benchmark.cpu_lanes: 1.5 is not of type 'integer'"),
        ({"calibration_users": []}, "config error at benchmark.calibration_users: [] should be non-empty"),
        (
            {"calibration_users": [1, 0]},
            "config error at benchmark.calibration_users[1]: 0 is less than the minimum of 1",
        ),
        ({"calibration_users": [2.5]}, "config error at benchmark.calibration_users[0]: 2.5 is not of type 'integer'"),
        (
            {"outlier_factor": 1},
            "config error at benchmark.outlier_factor: 1 is less than or equal to the minimum of 1",
        ),
        ({"outlier_min_s": -0.5}, "config error at benchmark.outlier_min_s: -0.5 is less than the minimum of 0"),
        ({"min_measured_s": -1}, "config error at benchmark.min_measured_s: -1 is less than the minimum of 0"),
        (
            {"fail_on_undecomposed": "yes"},
            "config error at benchmark.fail_on_undecomposed: 'yes' is not of type 'boolean'",
        ),
        ({"warm": "x"}, f"config error at benchmark: unknown key 'warm' (expected one of: {KEYS})"),
    ],
)
def test_a_wrong_benchmark_key_is_refused_in_one_line_naming_its_path(entry, expect):
    assert refusal(entry) == expect


# each bound, just past it: the typed section refuses what the schema refuses
PAST = [
    ("telemetry_s", 0),
    ("idle_timeout_s", 0.99),
    ("foreign_idle_s", -0.01),
    ("lease_timeout_s", 0),
    ("request_timeout_s", 0.5),
    ("max_client_lag_s", -0.1),
    ("stall_timeout_s", 0.9),
    ("cpu_lanes", 0),
    ("calibration_users", []),
    ("calibration_users", [0]),
    ("outlier_factor", 1.0),
    ("outlier_min_s", -1),
    ("min_measured_s", -0.001),
    ("server_reuse", "per_model"),
    ("warmup", "never"),
]


@pytest.mark.parametrize("key, value", PAST)
def test_the_typed_section_refuses_a_value_past_a_bound_as_the_schema_does(key, value):
    with pytest.raises(ValidationError, match=key):
        BenchmarkConfig(**{key: value})
    assert refusal({key: value}).startswith(f"config error at benchmark.{key}")


def test_a_value_at_its_bound_is_taken_and_kept_as_yaml_gave_it():
    at = {
        "telemetry_s": 1,
        "idle_timeout_s": 1,
        "foreign_idle_s": 0,
        "lease_timeout_s": 1.5,
        "request_timeout_s": 1,
        "max_client_lag_s": 0.001,
        "stall_timeout_s": 1,
        "cpu_lanes": 1,
        "calibration_users": [1],
        "outlier_factor": 1.01,
        "outlier_min_s": 0,
        "min_measured_s": 0,
    }
    cfg = C.validate(small(benchmark=at))
    filled = cfg.filled()["benchmark"]
    assert {k: filled[k] for k in at} == at
    typed = cfg.benchmark
    for key, value in at.items():
        assert getattr(typed, key) == value and type(getattr(typed, key)) is type(value), key


def test_its_names_must_be_the_configs_stacks_models_and_topologies():
    assert refusal({"stacks": ["a", "nope"]}) == "config error at benchmark.stacks[1]: unknown stack 'nope'"
    assert refusal({"models": ["nope"]}) == "config error at benchmark.models[0]: unknown model 'nope'"
    assert refusal({"topologies": ["tp1", "tp9"]}) == "config error at benchmark.topologies[1]: unknown topology 'tp9'"
    # tp1 is the default topology: a config whose topologies lack it names its own
    assert refusal({}, topologies={"tp2": {"tensor_parallel": 2}}) == (
        "config error at benchmark.topologies[0]: unknown topology 'tp1'"
    )


def test_a_benchmarked_topology_needs_its_gpus_on_cuda_only():
    two = {"topologies": {"tp1": {}, "tp2": {"tensor_parallel": 2}}, "gpus_available": 1}
    assert refusal({"topologies": ["tp2"]}, **two, platform="cuda") == (
        "config error at topologies.tp2: needs 2 GPUs but gpus_available is 1"
    )
    assert C.validate(small(benchmark={"topologies": ["tp2"]}, **two)).benchmark.topologies == ["tp2"]
    # a topology that is declared but not benchmarked asks for no card
    assert C.validate(small(**two, platform="cuda")).filled()["benchmark"]["topologies"] == ["tp1"]


def test_empty_lists_mean_every_stack_of_every_chain_and_every_model():
    cfg = C.validate(small())
    assert (G.bench_stacks(cfg), G.bench_models(cfg)) == (["a", "b"], ["m", "n"])  # c is in no chain
    cfg = C.validate(small(benchmark={"stacks": ["c", "a"], "models": ["n"]}))
    assert (G.bench_stacks(cfg), G.bench_models(cfg)) == (["c", "a"], ["n"])  # in the order given
    assert G.bench_stacks(C.validate(small(chains={}))) == ["a", "b", "c"]  # no chain: every stack


def test_the_schema_entry_is_the_section_filled_from_an_empty_default():
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    assert (schema["type"], schema["additionalProperties"], schema["default"]) == ("object", False, {})
    assert "required" not in schema and list(schema["properties"]) == list(BenchmarkConfig.model_fields)
    assert schema == {**plain_schema(BenchmarkConfig), "default": {}}  # generated from the section's type
    props = schema["properties"]
    assert {k: p["default"] for k, p in props.items()} == FILLED
    assert props["telemetry_s"] == {
        "type": "number",
        "exclusiveMinimum": 0,
        "default": 0.5,
        "description": props["telemetry_s"]["description"],
    }
    # seconds and factors are numbers (24 or 24.0), counts are integers
    numbers = {k for k, p in props.items() if p.get("type") == "number"}
    assert numbers == {k for k, v in FILLED.items() if k.endswith("_s") or k == "outlier_factor"}
    assert (props["cpu_lanes"]["type"], props["calibration_users"]["items"]) == (
        "integer",
        {"type": "integer", "minimum": 1},
    )
    assert props["calibration_users"]["minItems"] == 1
    assert props["server_reuse"]["enum"] == ["per_run", "per_stack", "per_cell"]


def test_every_key_says_what_it_does_in_one_line():
    for key, p in json_schema()["properties"].items():
        text = p["description"]
        assert text.strip() and "\n" not in text and "  " not in text, key
    assert json_schema()["description"] == "How each benchmark job measures."


def test_the_default_config_benchmarks_as_its_file_says():
    bench = C.load().benchmark
    assert (bench.topologies, bench.server_reuse, bench.min_measured_s) == (["tp1"], "per_run", 1.0)
    assert type(bench.min_measured_s) is float
    assert bench.model_dump(exclude={"topologies", "server_reuse", "min_measured_s"}) == {
        k: v for k, v in FILLED.items() if k not in ("topologies", "server_reuse", "min_measured_s")
    }


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_benchmark_section_of_every_shipped_config_passes_the_schema_entry_and_the_model(name):
    """Each file over the default (the names it gives are checked where the file is loaded)."""
    merged = C.merge(DEFAULT, C.read_yaml(REPO / "config" / name))
    section = merged.get("benchmark", {})
    assert [e.message for e in Draft202012Validator(json_schema()).iter_errors(section)] == [], name
    typed = BenchmarkConfig.model_validate(section)
    assert typed.model_dump(include=set(section)) == section, name
