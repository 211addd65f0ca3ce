"""speedsplit bundle and the host's install.py (speedsplit/offline/), rehearsed here: a real
bundle fetched from the package index for this machine's Python, installed into a folder by the
bundle's own install.py (the standard library only), then imported from there."""

import json
import subprocess
import sys

import pytest

from speedsplit.offline import bundle, host

PY = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("bundle")
    (d / "req.txt").write_text("requests==2.32.3\n")
    (d / "addon.txt").write_text("tabulate\n")  # an add-on's requirements, resolved with the base's
    # the host has certifi and idna at versions requests accepts, urllib3 at one it refuses
    (d / "have.txt").write_text("certifi==2024.8.30\nidna==3.10\nurllib3==1.20\n-e git+https://example#egg=x\n")
    manifest = bundle.build(
        [d / "req.txt", d / "addon.txt"], d / "out", bundle.Target(PY), d / "have.txt", part_mib=0.25
    )
    return d, manifest


@pytest.mark.slow
def test_a_bundle_holds_what_the_host_lacks_one_version_each_and_installs_from_its_parts(built, tmp_path):
    d, manifest = built
    names = {w["name"] for w in manifest["wheels"]}
    assert {"requests", "tabulate", "urllib3", "charset-normalizer", "speedsplit"} <= names
    assert manifest["requirements"] == ["requests==2.32.3", "tabulate"]
    assert not names & {"certifi", "idna"} and set(manifest["host_has"]) == {"certifi", "idna"}
    assert [(s["name"], s["host"]) for s in manifest["shadows"]] == [("urllib3", "1.20")]
    assert len(names) == len(manifest["wheels"])  # one version each
    assert manifest["project"]["files"] > 100
    parts = sorted((d / "out").glob("bundle.tar.part*"))
    assert len(parts) > 1 and all(p.stat().st_size <= 0.25 * 2**20 for p in parts)
    site = tmp_path / "site"
    # on the host: its own Python, no speedsplit, only the bundle's folder
    out = subprocess.run(
        [sys.executable, "-I", str(d / "out" / "install.py"), "install", "--target", str(site)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"installed {len(manifest['wheels'])} wheels" in out.stdout and "urllib3" in out.stdout
    check = "import requests, tabulate, urllib3; print(requests.__version__, urllib3.__file__)"
    got = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env={"PYTHONPATH": str(site)})
    assert got.returncode == 0, got.stderr
    version, where = got.stdout.split()
    assert version == "2.32.3" and where.startswith(str(site))
    project = d / "out" / "unpacked" / "project"
    assert (project / "Snakefile").is_file() and (project / "config/config.yaml").is_file()
    assert not list((project / "docs/evidence").rglob("*.parquet"))  # evidence travels as configs and notes
    host.install(d / "out", tmp_path / "rehearsed", rehearse=True)  # pip checks the target's tags
    assert (tmp_path / "rehearsed" / "requests").is_dir()
    with pytest.raises(host.BundleError, match="give --target"):
        host.install(d / "out", None, rehearse=True)


@pytest.mark.slow
def test_a_damaged_or_missing_part_is_named_and_nothing_is_installed(built, tmp_path):
    import shutil

    d, _ = built
    copy = tmp_path / "bundle"
    shutil.copytree(d / "out", copy)
    part = sorted(copy.glob("bundle.tar.part*"))[1]
    part.write_bytes(part.read_bytes()[:-1] + b"x")
    with pytest.raises(host.BundleError, match=f"{part.name}: its sha256 differs"):
        host.install(copy, tmp_path / "site")
    part.unlink()
    with pytest.raises(host.BundleError, match=f"{part.name}: missing"):
        host.install(copy, tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_a_freeze_and_requirements_are_read_for_the_target():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as t:
        f = Path(t) / "freeze.txt"
        f.write_text("torch==2.11.0+cu130\nvllm @ file:///wheels/vllm.whl\n-e .\n# a comment\n")
        have = bundle.read_freeze(f)
        assert str(have["torch"]) == "2.11.0+cu130" and have["vllm"] is None
        f.write_text("numpy>=2\nnot a requirement!!\n")
        with pytest.raises(bundle.BundleBuildError, match="not a requirement"):
            bundle.read_requirements(f)
    env = bundle.Target("3.12").environment()
    assert env["python_version"] == "3.12" and env["sys_platform"] == "linux"
    args = bundle.Target("3.12").pip_args()
    assert args[:4] == ["--python-version", "3.12", "--implementation", "cp"] and "manylinux_2_28_x86_64" in args
    assert json.dumps(args)  # plain strings, as pip takes them


@pytest.mark.slow
def test_a_requirements_extras_are_followed(tmp_path):
    """fastapi[standard]: the extra's own requirements (uvicorn[standard] and its extras too)."""
    (tmp_path / "req.txt").write_text("fastapi[standard]==0.115.0\n")
    got = bundle.resolve(bundle.read_requirements(tmp_path / "req.txt"), {}, bundle.Target(PY), tmp_path)
    assert {"fastapi", "uvicorn", "fastapi-cli", "email-validator", "httptools", "websockets"} <= set(got.picked)
    assert "fastapi[standard]" in got.picked["uvicorn"].needed_by


def _bundle_already_there(folder):
    """A bundle's folder as a build leaves it (its sums beside its parts), with its files' bytes."""
    folder.mkdir()
    (folder / host.SUMS).write_text("0123  speedsplit-bundle.tar.000\n")
    (folder / "speedsplit-bundle.tar.000").write_bytes(b"the parts of an earlier build")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("malformed", ["requirements", "have", "omit", "lock"])
def test_a_malformed_input_leaves_the_bundle_already_there_as_it_was(tmp_path, malformed):
    out = tmp_path / "out"
    before = _bundle_already_there(out)
    files = {name: tmp_path / f"{name}.txt" for name in ("requirements", "have", "omit", "lock")}
    good = {"requirements": "requests==2.32.3\n", "have": "certifi==2024.8.30\n", "omit": "", "lock": ""}
    for name, path in files.items():
        path.write_text(good[name] if name != malformed else "not a line of any of them!!\n")
    with pytest.raises(bundle.BundleBuildError, match="not a"):
        bundle.build(
            files["requirements"], out, bundle.Target(PY), files["have"], omit=files["omit"], lock=files["lock"]
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *(p.name for p in files.values())])


@pytest.mark.slow
def test_a_build_that_fails_midway_leaves_the_bundle_already_there_as_it_was(tmp_path):
    """requests fetched, then its idna refused by the lock: the earlier bundle stays whole, and
    nothing of the failed build is left beside it."""
    out = tmp_path / "out"
    before = _bundle_already_there(out)
    (tmp_path / "req.txt").write_text("requests==2.32.3\n")
    (tmp_path / "lock.txt").write_text("idna==2.0\n")
    with pytest.raises(bundle.BundleBuildError, match="the lock pins 2.0, but requests"):
        bundle.build(tmp_path / "req.txt", out, bundle.Target(PY), lock=tmp_path / "lock.txt")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock.txt", "out", "req.txt"]
