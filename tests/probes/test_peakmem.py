"""A command's peak memory (speedsplit/probes/peakmem.py), measured for real: its exit code, and
every process started since it began, those that left its tree too (a session daemon does)."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from speedsplit.probes import peakmem

HOLD = "import time; x = bytearray({mib} * 2**20); time.sleep({s})"


def test_a_process_that_left_the_commands_tree_is_counted(tmp_path):
    t0 = time.time()
    pidfile = tmp_path / "pid"
    # the subshell starts it in the background and exits: its parent is no longer the command's
    subprocess.run(["bash", "-c", f"(sleep 30 & echo $! > {pidfile})"], check=True)
    orphan = int(pidfile.read_text())
    try:
        assert psutil.Process(orphan).ppid() != os.getpid()
        assert orphan in {p.pid for p in peakmem._started_since(t0)}
        assert os.getpid() not in {p.pid for p in peakmem._started_since(time.time() + 5)}  # started before
    finally:
        os.kill(orphan, signal.SIGKILL)


@pytest.mark.serial
def test_a_commands_exit_code_time_and_peak(capsys):
    rc, rss, host, seconds = peakmem.measure([sys.executable, "-c", HOLD.format(mib=300, s=1.0)], interval_s=0.1)
    assert rc == 0 and seconds >= 1.0
    assert rss >= 0.28  # its 300 MiB were resident while it slept (GiB)
    assert peakmem.measure([sys.executable, "-c", "raise SystemExit(3)"], interval_s=0.1)[0] == 3
    assert peakmem.main(["--", sys.executable, "-c", "pass"]) == 0
    assert "peakmem: " in capsys.readouterr().err
    with pytest.raises(SystemExit, match="usage: speedsplit peakmem -- COMMAND ARGS"):
        peakmem.main(["--"])
