"""The session state machine and process identity, without servers."""

import os
import stat
import subprocess
import time

import pytest

from speedsplit.core import procs
from speedsplit.core.results import write_json_atomic
from speedsplit.serving import session as S
from speedsplit.serving import session_state
from speedsplit.serving.session_state import TRANSITIONS


@pytest.fixture()
def sleeper():
    """A live process that has nothing to do with speedsplit."""
    p = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_the_state_machine_has_final_states_for_attaching_cells(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sess = session_state.Session("m/s/tp1/run0")
    gen = session_state._new_generation(sess).generation
    assert session_state.transition(sess, gen, session_state.READY) is None  # spawning cannot skip starting
    assert session_state.transition(sess, gen, session_state.STARTING).state == session_state.STARTING
    assert session_state.transition(sess, "another-generation", session_state.READY) is None
    assert session_state.transition(sess, gen, session_state.READY, urls=["u"]).urls == ["u"]
    assert session_state.transition(sess, gen, session_state.STOPPING).state == session_state.STOPPING
    for later in (
        session_state.READY,
        session_state.STARTING,
        session_state.DIED,
        session_state.STARTUP_FAILED,
    ):  # stopping is final for cells
        assert session_state.transition(sess, gen, later) is None
    assert session_state.transition(sess, gen, session_state.STOPPED).state == session_state.STOPPED
    assert TRANSITIONS[session_state.STOPPED] == set()
    with S.attached(sess, gen) as held:
        assert held is None
    assert S.wait_ready(sess, gen, 1.0).state == session_state.STOPPED  # wait_ready ends on final states


def test_session_files_are_private(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sess = session_state.Session("m/s/tp1/run0")
    session_state._new_generation(sess)
    assert stat.S_IMODE(os.stat(sess.state_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sess.state_path.parent).st_mode) == 0o700


def test_the_same_key_in_two_workflows_is_two_sessions(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert session_state.Session("m/s/tp1/run0", a).state_path != session_state.Session("m/s/tp1/run0", b).state_path


def test_a_stale_state_naming_a_live_unrelated_process_is_never_signalled(tmp_path, monkeypatch, sleeper):
    monkeypatch.chdir(tmp_path)
    real = procs.Proc.of(sleeper.pid)
    recycled = {"pid": sleeper.pid, "start": real.start - 1}  # the dead daemon's pid, reused since
    sess = session_state.Session("m/s/tp1/run0")
    sess.write(
        session_state.SessionState(
            state=session_state.READY,
            generation="old",
            key=sess.key,
            workflow=sess.workdir,
            daemon=recycled,
            servers=[recycled],
        )
    )
    assert not session_state.daemon_alive(sess.state())
    assert S.evict_idle() == []
    S.stop_daemon(sess)
    legacy = session_state.Session("m/s/tp1/run1")  # a state written before daemons had start times
    old = {"state": "ready", "pid": sleeper.pid, "key": legacy.key, "workflow": legacy.workdir}
    write_json_atomic(legacy.state_path, old, mode=0o600)
    assert legacy.state() == session_state.SessionState()  # of another version: nobody's session
    assert S.evict_idle() == []
    S.stop_daemon(legacy)
    assert sleeper.poll() is None


def test_only_an_idle_ready_session_is_evicted(tmp_path, monkeypatch, sleeper):
    """A session still starting belongs to the cell that started it; an idle ready one may be
    stopped for another's cards (here its 'daemon' is a live process of our own)."""
    monkeypatch.chdir(tmp_path)
    daemon = procs.Proc.of(sleeper.pid).as_record()
    sess = session_state.Session("m/s/tp1/run0")
    gen = session_state._new_generation(sess).generation
    session_state.transition(sess, gen, session_state.STARTING, daemon=daemon)
    assert S.evict_idle() == [] and sleeper.poll() is None
    session_state.transition(sess, gen, session_state.READY)
    with S.attached(sess, gen) as held:  # a cell measures on it
        assert held is not None and S.evict_idle() == []
    assert len(S.evict_idle()) == 1
    assert sleeper.wait(10) is not None and sess.state().state == session_state.STOPPED


def test_another_workflows_idle_session_is_stopped_only_after_foreign_idle_s(tmp_path, monkeypatch, sleeper):
    """The eviction policy: a session of another workflow that a cell used a moment ago (between
    two of its cells) is kept; once unused for foreign_idle_s it is stopped, and its state says
    for whom. While a cell measures on it, it is what a run elsewhere shares the host with."""
    (tmp_path / "other").mkdir()
    (tmp_path / "me").mkdir()
    theirs = session_state.Session("m/s/tp1/run0", tmp_path / "other")
    gen = session_state._new_generation(theirs).generation
    session_state.transition(theirs, gen, session_state.STARTING, daemon=procs.Proc.of(sleeper.pid).as_record())
    session_state.transition(theirs, gen, session_state.READY, last_used=time.time() - 5.0)
    monkeypatch.chdir(tmp_path / "me")
    assert S.evict_idle("m/s/tp1/run0", foreign_idle_s=30.0) == []  # used 5 s ago
    with S.attached(theirs, gen) as held:
        assert held is not None
        assert S.measuring_elsewhere() == [f"workflow {theirs.workdir}, session m/s/tp1/run0"]
    assert S.measuring_elsewhere() == []  # idle: nothing measures beside us
    stopped = S.evict_idle("m/s/tp1/run0", foreign_idle_s=4.0)
    assert stopped == [f"workflow {theirs.workdir}, session m/s/tp1/run0 (ready)"]
    st = theirs.state()
    assert st.state == session_state.STOPPED and st.evicted_by == f"workflow {tmp_path / 'me'} (session m/s/tp1/run0)"
    assert sleeper.wait(10) is not None  # its "daemon" was stopped


def test_who_holds_the_cards_is_named(tmp_path, monkeypatch, sleeper):
    """lease_holders: the session whose daemon holds a card's lock, or the process that does."""
    from speedsplit.serving import lease

    monkeypatch.chdir(tmp_path)
    with lease.acquire_gpus(1, timeout_s=5, devices=["cpu"]):
        assert S.lease_holders(["cpu"]) == [f"process {os.getpid()} ({' '.join(procs.cmdline(os.getpid()))[:120]})"]
        sess = session_state.Session("m/s/tp1/run0")
        gen = session_state._new_generation(sess).generation
        session_state.transition(sess, gen, session_state.STARTING, daemon=procs.me().as_record())
        assert S.lease_holders(["cpu"]) == [f"workflow {sess.workdir}, session m/s/tp1/run0 (starting)"]
