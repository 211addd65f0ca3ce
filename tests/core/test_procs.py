import signal
import subprocess
import sys
import time

from speedsplit.core import procs


def test_a_process_is_its_pid_and_start_time():
    child = subprocess.Popen(["sleep", "30"])
    try:
        me = procs.Proc.of(child.pid)
        assert me is not None and me.alive()
        # the same pid with another start time is another process: a recycled pid
        impostor = procs.Proc(child.pid, me.start + 1)
        assert not impostor.alive()
        assert not impostor.signal(signal.SIGTERM) and not impostor.signal_group(signal.SIGKILL)
        assert child.poll() is None  # never signalled
        assert procs.Proc.from_record(me.as_record()) == me
        assert procs.Proc.from_record({"pid": child.pid}) is None  # an old record without start time
    finally:
        child.kill()
        child.wait()
    assert not me.alive()


def test_tree_holds_the_group_and_children_that_left_it():
    script = (
        "import subprocess, time, os;"
        "subprocess.Popen(['sleep', '30']);"
        "subprocess.Popen(['setsid', 'sleep', '31']);"
        "time.sleep(30)"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(procs.tree(leader.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        names = sorted(" ".join(procs.cmdline(p.pid)) for p in procs.tree(leader.pid))
        assert len(names) == 3 and sum("sleep 3" in n for n in names) == 2, names
        assert {p.pid for p in procs.group_members(leader.pid)} >= {leader.pid}
    finally:
        for p in procs.tree(leader.pid):
            p.signal(signal.SIGKILL)
        leader.wait()


def test_listening_sockets_of_a_process():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in procs.listening([procs.me()])
    assert procs.is_loopback("127.0.0.1") and procs.is_loopback("::1") and not procs.is_loopback("0.0.0.0")
