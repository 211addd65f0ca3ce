import multiprocessing as mp
import os
import socket
import stat
import time

import pytest

from speedsplit.serving import lease


def _hold(n, devices, hold_s, q, lock_dir):
    os.environ["SPEEDSPLIT_LOCK_DIR"] = lock_dir
    got = lease.acquire_gpus(n, timeout_s=30, poll_s=0.05, devices=devices)
    t0 = time.time()
    time.sleep(hold_s)
    q.put((got.devices, t0, time.time()))
    got.release()


def test_concurrent_jobs_get_distinct_cards_all_or_nothing(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    devices = ["0", "1", "2", "3"]
    procs = [ctx.Process(target=_hold, args=(2, devices, 0.6, q, str(tmp_path))) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    spans = [q.get(timeout=5) for _ in procs]
    assert all(len(d) == 2 for d, _, _ in spans)
    # any two holders overlapping in time hold disjoint cards; never more than 4 cards at once
    for i, (d1, s1, e1) in enumerate(spans):
        for d2, s2, e2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1:
                assert not set(d1) & set(d2)


def test_indexes_into_an_existing_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    assert lease.visible_devices() == ["5", "7", "9"]
    with lease.acquire_gpus(2, timeout_s=1) as held:
        assert held.devices == ["5", "7"]
        assert held.cuda_visible_devices == "5,7"
        with lease.acquire_gpus(1, timeout_s=1) as other:
            assert other.devices == ["9"]
        with pytest.raises(lease.LeaseError, match="could not lease 2"):
            lease.acquire_gpus(2, timeout_s=0.3, poll_s=0.05)


def test_too_few_visible_cards_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(lease.LeaseError, match="needs 2 GPUs but only 1 are visible"):
        lease.acquire_gpus(2, timeout_s=1)


@pytest.mark.serial
def test_a_dead_holder_frees_its_cards(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_hold, args=(1, ["0"], 60, q, os.environ["SPEEDSPLIT_LOCK_DIR"]))
    p.start()
    time.sleep(0.5)
    with pytest.raises(lease.LeaseError):
        lease.acquire_gpus(1, timeout_s=0.3, devices=["0"])
    p.kill()
    p.join()
    with lease.acquire_gpus(1, timeout_s=2, devices=["0"]) as held:
        assert held.devices == ["0"]


def test_ports_are_free_loopback_ports_and_distinct():
    with lease.Lease() as held:
        ports = {held.port() for _ in range(5)}
        assert len(ports) == 5
        for p in ports:  # nobody listens there: we can bind each one ourselves
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))


def test_cuda_devices_points_the_process_at_its_leased_card(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    with lease.cuda_devices(1, "cuda", timeout_s=1) as held:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4" == held.cuda_visible_devices
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"
    with lease.cuda_devices(1, "cpu") as held:
        assert held.devices == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_lock_folder_is_private_and_a_foreign_one_is_refused(tmp_path, monkeypatch):
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(fresh))
    assert stat.S_IMODE(os.stat(lease.lock_dir()).st_mode) == 0o700
    with lease.acquire_gpus(1, timeout_s=1, devices=["0"]):
        assert stat.S_IMODE(os.stat(fresh / "gpu-0.lock").st_mode) == 0o600

    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    opened.chmod(0o777)
    monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(opened))
    assert stat.S_IMODE(os.stat(lease.lock_dir()).st_mode) == 0o700  # ours: closed, not refused

    link = tmp_path / "link"
    link.symlink_to(fresh)
    monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(link))
    with pytest.raises(lease.LeaseError, match="not a plain folder"):
        lease.lock_dir()

    if os.getuid() == 0:  # only root can make a folder that belongs to somebody else
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(foreign))
        with pytest.raises(lease.LeaseError, match="belongs to uid 65534"):
            lease.acquire_gpus(1, timeout_s=1, devices=["0"])


def test_lock_files_are_never_opened_through_a_link(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(tmp_path / "locks"))
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (lease.lock_dir() / "gpu-0.lock").symlink_to(victim)
    with pytest.raises(lease.LeaseError, match="is a link"):
        lease.acquire_gpus(1, timeout_s=1, devices=["0"])
    assert victim.read_text() == "keep me"


@pytest.mark.skipif(os.getuid() != 0, reason="only root can plant a file that belongs to somebody else")
def test_a_file_planted_by_another_user_in_the_lock_folder_is_refused(tmp_path, monkeypatch):
    """A lock or session state file another user put in our private folder (made before it was
    closed, or by root) is never trusted: a forged session state reads as none, a planted lock
    fails the lease naming the file."""
    import json

    from speedsplit.serving import session_state

    monkeypatch.setenv("SPEEDSPLIT_LOCK_DIR", str(tmp_path / "locks"))
    planted = lease.lock_dir() / "gpu-0.lock"
    planted.write_text("")
    os.chown(planted, 65534, 65534)
    with pytest.raises(lease.LeaseError, match="gpu-0.lock is not a plain file of yours"):
        lease.acquire_gpus(1, timeout_s=1, devices=["0"])
    sess = session_state.Session("m/s/tp1/run0", tmp_path)
    forged = {
        "state": "ready",
        "generation": "g",
        "key": sess.key,
        "urls": ["http://127.0.0.1:1"],
        "daemon": {"pid": 1, "start": 1},
    }
    sess.state_path.write_text(json.dumps(forged))
    os.chown(sess.state_path, 65534, 65534)
    assert sess.state() == session_state.SessionState()  # none
    assert forged["urls"] not in [st.urls for st in session_state.host_states()]


def test_each_card_gets_its_own_block_of_the_cores_this_process_may_use():
    cores = list(range(64))
    assert lease.cpu_share(["2"], visible=["0", "1", "2", "3"], cores=cores) == list(range(32, 48))
    assert lease.cpu_share(["0", "1"], visible=["0", "1", "2", "3"], cores=cores) == list(range(0, 32))  # tp2
    # Slurm: two cards of the node and the cores of the job's cgroup
    assert lease.cpu_share(["5"], visible=["3", "5"], cores=list(range(8, 16))) == [12, 13, 14, 15]
    assert lease.cpu_share(["0"], visible=["0", "1", "2"], cores=[0, 1]) == []  # fewer cores than cards: unpinned
    assert lease.cpu_share(["7"], visible=["0", "1"], cores=cores) == [] and lease.cpu_share([], ["0"], cores) == []
    assert lease.cpu_ranges([0, 1, 2, 3, 8, 9, 11]) == "0-3,8-9,11"
    assert lease.parse_cpu_ranges("0-3,8-9,11") == [0, 1, 2, 3, 8, 9, 11]
