"""What a bench job hands its session's daemon and what the daemon publishes, typed
(serving/session_state.py): the launch names its session, a file of another shape is nobody's,
and every field the daemon writes is one the state declares."""

import pytest
from pydantic import ValidationError
from records import stack_spec

from speedsplit.core import procs
from speedsplit.core.results import write_json_atomic
from speedsplit.serving import session_state as S


def _launch(**change) -> S.Launch:
    return S.Launch(**{"stack": stack_spec(), "model_dir": "/m", "cache_dir": "/c", **change})


def test_a_launch_digest_names_what_is_launched():
    """The same launch, the same session; an edited stack or another cache size, another server."""
    assert _launch().digest() == _launch().digest()
    edited = _launch(stack=_launch().stack.model_copy(update={"env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}))
    assert len({_launch().digest(), edited.digest(), _launch(kv_tokens=4096).digest()}) == 3
    with pytest.raises(ValidationError, match="model_dirr"):
        S.Launch.model_validate({**_launch().model_dump(), "model_dirr": "/m"})  # a misspelt field


def test_the_launch_file_round_trips_and_keeps_its_key_out_of_its_repr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sess = S.Session("m/s/tp1/run0")
    told = S.LaunchFile(
        launch=_launch(),
        digest=_launch().digest(),
        generation="g",
        key=sess.key,
        workdir=sess.workdir,
        owner=procs.me(),
        log_path="s.log",
        idle_timeout_s=60.0,
        lease_timeout_s=30.0,
        foreign_idle_s=60.0,
        api_key="sk-speedsplit-secret",
    )
    write_json_atomic(sess.launch_path, told.model_dump(mode="json"), mode=0o600)
    assert sess.launch_file() == told and sess.launch_file().owner.alive()
    assert "sk-speedsplit-secret" not in repr(told)
    write_json_atomic(sess.launch_path, {"launch": {}, "key": sess.key}, mode=0o600)
    assert sess.launch_file() is None  # of another shape: nothing to launch from


def test_a_state_is_written_as_declared_and_one_of_another_shape_is_nobodys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sess = S.Session("m/s/tp1/run0")

    def ours() -> list[S.SessionState]:  # (the host's sessions: other tests' too)
        return [st for st in S.host_states() if st.workflow == sess.workdir]

    assert sess.state() == S.SessionState() and ours() == []
    gen = S._new_generation(sess, digest="d", owner=procs.me()).generation
    st = S.transition(sess, gen, S.STARTING, daemon=procs.me(), servers=[procs.me().as_record()])
    assert st.daemon == procs.me() and st.servers == [procs.me()] and S.daemon_alive(st)
    assert sess.state() == st and ours() == [st]
    with pytest.raises(ValidationError, match="urlz"):
        S.transition(sess, gen, S.READY, urlz=["http://127.0.0.1:1"])  # a field no state declares
    assert sess.state() == st  # nothing written
    write_json_atomic(sess.state_path, {"state": "ready", "pid": 1, "key": sess.key}, mode=0o600)
    assert sess.state() == S.SessionState() and ours() == []
