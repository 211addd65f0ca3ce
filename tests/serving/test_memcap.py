"""The memory cap for Python servers without a memory flag: the small card's numbers, and a
module or script run under it with its own arguments."""

import subprocess
import sys

import pytest
from conftest import REPO

from speedsplit.serving import memcap

GIB = 2**30


def test_the_allocator_leaves_room_for_what_is_already_on_the_card():
    """A CUDA context of 0.5 GiB on an 80 GiB card capped at 24: the allocator may hold 23.5 GiB,
    so the card (as NVML sees it) holds 24 (an H200's hf-fp16 peaked at 24.6 GiB before)."""
    assert memcap.allocator_fraction(int(79.5 * GIB), 80 * GIB, 24 * GIB) * 80 * GIB == 23.5 * GIB
    assert memcap.allocator_fraction(50 * GIB, 80 * GIB, 24 * GIB) == 0  # more in use than the cap


def test_the_small_card_keeps_what_is_in_use():
    # an 80 GiB card with 60 GiB free, capped at 24: 20 GiB in use, 4 GiB left
    assert memcap.capped_info(60 * GIB, 80 * GIB, 24 * GIB) == (4 * GIB, 24 * GIB)
    assert memcap.capped_info(10 * GIB, 80 * GIB, 24 * GIB) == (0, 24 * GIB)  # more in use than the cap


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "speedsplit.serving.memcap", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.slow
def test_a_module_and_a_script_run_under_it_with_their_arguments(tmp_path):
    data = tmp_path / "d.json"
    data.write_text('{"b": 1, "a": 2}')
    out = _run("--gib", "2", "--", "-m", "json.tool", "--sort-keys", str(data))
    assert out.returncode == 0, out.stderr
    assert "[memcap] no CUDA device: nothing capped" in out.stdout  # this machine has no card
    assert out.stdout.index('"a"') < out.stdout.index('"b"')  # json.tool got --sort-keys
    script = tmp_path / "s.py"
    script.write_text("import sys; print('argv', sys.argv[1:]); sys.exit(3)")
    out = _run("--gib", "2", "--", str(script), "x", "--y")
    assert "argv ['x', '--y']" in out.stdout and out.returncode == 3  # the server's exit status


def test_a_call_without_a_target_says_how_to_call_it():
    out = _run("--gib", "2")
    assert (
        out.returncode != 0
        and "usage: python -m speedsplit.serving.memcap (--gib N | --host-cache-gib N) --" in out.stderr
    )


def test_a_cpu_server_sees_a_host_of_what_it_holds_plus_its_cache(tmp_path):
    """transformers' continuous batching sizes its cache on a CPU from psutil's host memory:
    under --host-cache-gib the host is what the process holds plus that much."""
    script = tmp_path / "s.py"
    script.write_text(
        "import psutil; vm = psutil.virtual_memory(); rss = psutil.Process().memory_info().rss\n"
        "print('extra', round((vm.total - rss) / 2**30, 3), 'available', round(vm.available / 2**30, 3))"
    )
    out = _run("--host-cache-gib", "0.5", "--", str(script))
    assert out.returncode == 0, out.stderr
    assert "extra 0.5 available 0.5" in out.stdout
