"""A server whose engine has no bytecode, under PYTHONDONTWRITEBYTECODE, gets a bytecode folder
of its own: its first start writes there and later starts read it; everything else is left as
it is (serving/caches.py)."""

import subprocess
import sys

import pytest

from speedsplit.serving import caches


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """A package `fakeengine` with a server module and no bytecode, importable here and in
    the server's process."""
    root = tmp_path / "site"
    pkg = root / "fakeengine"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "server.py").write_text("import fakeengine\nprint('served', fakeengine.VALUE)\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def _argv(module="fakeengine.server"):
    return [sys.executable, "-m", module]


def test_an_engine_without_bytecode_gets_a_folder_it_writes_and_reads(engine, tmp_path):
    prefix = tmp_path / "cache" / "pycache"
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(engine), "KEEP": "x"}
    out, why = caches.bytecode_env(_argv(), env, prefix)
    assert "PYTHONDONTWRITEBYTECODE" not in out and out["PYTHONPYCACHEPREFIX"] == str(prefix.resolve())
    assert out["KEEP"] == "x" and "fakeengine has none" in why
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the caller's mapping is not changed

    run = subprocess.run(_argv(), env=out, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "served 1"
    # the folder mirrors the source tree: the engine's modules are there, beside whatever
    # else the server imported
    mirrored = prefix / str(engine.resolve()).lstrip("/") / "fakeengine"
    assert sorted(p.name.split(".")[0] for p in mirrored.glob("*.pyc")) == ["__init__", "server"]
    assert not list(engine.rglob("__pycache__"))  # the installation itself is never written

    # a later start reads what the first wrote instead of compiling again
    pyc = next(mirrored.glob("*.pyc"))
    stamp = pyc.stat().st_mtime_ns
    subprocess.run(_argv(), env=out, capture_output=True, check=True)
    assert pyc.stat().st_mtime_ns == stamp


def test_nothing_changes_where_bytecode_exists_or_may_be_written(engine, tmp_path):
    prefix = tmp_path / "pycache"
    writable = {"PYTHONPATH": str(engine)}
    assert caches.bytecode_env(_argv(), writable, prefix) == (writable, None)

    import py_compile

    py_compile.compile(str(engine / "fakeengine" / "__init__.py"))  # installed with bytecode
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    assert caches.bytecode_env(_argv(), env, prefix) == (env, None)
    assert not prefix.exists()


def test_only_this_pythons_module_servers_are_looked_at(engine, tmp_path):
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    prefix = tmp_path / "pycache"
    for argv in (
        ["/usr/bin/llama-server", "-m", "model.gguf"],  # not Python: -m is its model
        ["/other/python3", "-m", "fakeengine.server"],  # another interpreter's modules
        [sys.executable, "script.py"],  # no module to look at
        _argv("no_such_engine.server"),
    ):
        assert caches.bytecode_env(argv, env, prefix) == (env, None), argv


def test_the_engine_module_is_the_last_one_run():
    wrapped = [sys.executable, "-m", "speedsplit.serving.memcap", "--gib", "24", "--", "-m", "vllm.entrypoints.x"]
    assert caches.engine_module(wrapped) == "vllm.entrypoints.x"
    assert caches.engine_module([sys.executable, "x.py"]) is None


def test_a_bytecode_file_cut_short_is_found_from_the_servers_output_and_the_folder_rebuilt(tmp_path):
    """A full disk can leave a bytecode file truncated (CPython ignores a short write), and
    every later start failed with `EOFError: marshal data too short` until it was deleted by
    hand. The failed start's output now clears the folder; the next start compiles again."""

    (tmp_path / "src").mkdir()
    (tmp_path / "src/served.py").write_text("ANSWER = 42\n" * 50)
    prefix = tmp_path / "cache/shared/pycache"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "src"), "PYTHONPYCACHEPREFIX": str(prefix)}

    def start():
        return subprocess.run(
            [sys.executable, "-c", "import served; print(served.ANSWER)"], env=env, capture_output=True, text=True
        )

    assert start().stdout.strip() == "42"  # compiled into the prefix
    (pyc,) = prefix.rglob("served*.pyc")
    pyc.write_bytes(pyc.read_bytes()[:40])  # the header whole, the code cut short
    failed = start()
    assert failed.returncode != 0 and "marshal data too short" in failed.stderr
    said = caches.heal_bytecode(prefix, failed.stderr)
    assert said.startswith("a broken bytecode file (EOFError: marshal data too short) under ")
    assert said.endswith("the folder is cleared, the next start rebuilds it")
    assert not prefix.exists() and not list(prefix.parent.iterdir())  # nothing left aside
    assert start().stdout.strip() == "42" and list(prefix.rglob("served*.pyc"))
    assert caches.heal_bytecode(prefix, "ValueError: something else") is None and prefix.is_dir()
