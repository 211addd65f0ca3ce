"""A finished cell is never rerun by a change of the code alone: Snakemake reruns a job whose
params' text changed, so the params of every job of every shipped config (rule job_file's
stack, cell and quality; rule model's entry; rule quantize's settings) are pinned here by
digest. A change that must alter them (a setting a job now names) updates
tests/data/params-digests.json on purpose, knowing which finished cells it reruns:
`PYTHONPATH=$PWD .venv/bin/python tests/planning/test_params_pinned.py`."""

import hashlib
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from speedsplit.core.errors import ConfigError  # noqa: E402
from speedsplit.planning import config as C  # noqa: E402
from speedsplit.planning import grid as G  # noqa: E402
from speedsplit.planning import plan as P  # noqa: E402

DIGESTS = REPO / "tests/data/params-digests.json"
CONFIGS = sorted(
    p.relative_to(REPO).as_posix() for p in [*REPO.glob("config/*.yaml"), *REPO.glob("tests/config/*.yaml")]
)


def params_text(name: str) -> str:
    """The params of every job of a config, as the text Snakemake compares (on a CPU where the
    config leaves the platform to the machine)."""
    given = C.read_yaml(REPO / name)
    data = given if name == "config/config.yaml" else C.merge(C.read_yaml(C.DEFAULT_CONFIG), given)
    # where the config leaves the platform to the machine: a CPU's, else (GPU only) a card's; an
    # overlay of another config is refused alone, and that refusal is what is pinned
    platforms = ["cpu", "cuda"] if data.get("platform", "auto") == "auto" else [data["platform"]]
    for n, platform in enumerate(platforms):
        try:
            cfg = C.validate({**data, "platform": platform})
            break
        except ConfigError as exc:
            if n == len(platforms) - 1:
                return f"refused: {exc}"
    carriers = P.quality_carriers(cfg)
    lines = []
    for job in P.bench_jobs(cfg):
        params = P.job_params(cfg, job, carriers)
        lines.append(f"{job.result} {params['stack']!r} {params['cell']!r} {params['quality']!r}")
    filled = cfg.filled()
    lines += [f"model {m} {filled['models'][m]!r}" for m in G.bench_models(cfg)]
    lines.append(f"quantization {filled['quantization']!r}")
    return "\n".join(lines)


def digest(name: str) -> str:
    return hashlib.sha256(params_text(name).encode()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_every_jobs_params_are_as_pinned(name, monkeypatch):
    monkeypatch.chdir(REPO)  # (relative paths a config names, read as the workflow reads them)
    pinned = json.loads(DIGESTS.read_text())
    assert name in pinned, f"{name}: not pinned yet (run this file as a script to pin it)"
    assert digest(name) == pinned[name], (
        f"{name}: a job's params changed, and its finished cells would rerun; if that is meant, pin them again "
        "(run this file as a script)"
    )


if __name__ == "__main__":
    import os

    os.chdir(REPO)
    DIGESTS.write_text(json.dumps({name: digest(name) for name in CONFIGS}, indent=1) + "\n")
    print(f"pinned {len(CONFIGS)} configs in {DIGESTS.relative_to(REPO)}")
