"""A real one-node Slurm cluster on this machine, for tests: munge, slurmctld and slurmd from
Debian's slurm-wlm, configured in a temporary folder and stopped whatever happens.

The node advertises two `gpu` GRES slots backed by placeholder device files, so a job that
asks for cards (`sbatch --gpus=N`, what the Slurm profile's `gpu` resource becomes) is
scheduled as on a GPU cluster and gets CUDA_VISIBLE_DEVICES from Slurm; the work itself runs
on the CPU (platform cpu)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
# Where client commands inside a job find the cluster: the Slurm job-step plugin drops every
# SLURM_* variable (SLURM_CONF too) before its nested srun, so the default path must lead here.
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class SlurmUnavailable(RuntimeError):
    """Why a cluster cannot be started here (said in one line)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_not() -> str | None:
    """The reason this machine cannot run the cluster, or None."""
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "starting slurmd and its placeholder GPU devices needs root"
    if not Path("/etc/munge/munge.key").exists():
        return "no munge key (/etc/munge/munge.key)"
    if SYSTEM_CONF.exists() and not SYSTEM_CONF.is_symlink():
        return f"{SYSTEM_CONF} exists: this machine has a Slurm of its own, which the test leaves alone"
    return None


def _conf(root: Path, node: str, cpus: int, memory_mb: int) -> str:
    return f"""ClusterName=speedsplit-test
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=600
GresTypes=gpu
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName={node} CPUs={cpus} RealMemory={memory_mb} Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop_pidfile(path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(path.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # raises once it is gone
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)


def _munge_answers() -> bool:
    out = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=10)
    return out.returncode == 0


@contextlib.contextmanager
def one_node_cluster(root: Path):
    """Start the cluster under root; yields the environment its client commands need."""
    reason = why_not()
    if reason:
        raise SlurmUnavailable(reason)
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    node = socket.gethostname()
    for i in range(2):
        slot = root / f"gpu-slot{i}"
        if not slot.exists():
            os.mknod(slot, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root}/gpu-slot[0-1]\n")
    memory_mb = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20 * 0.8)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, node, os.cpu_count() or 1, memory_mb))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started_munge = None
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SYSTEM_CONF.unlink(missing_ok=True)  # a link a killed run left behind (why_not refuses a real file)
    SYSTEM_CONF.symlink_to(conf)
    try:
        try:
            if not _munge_answers():
                # munged runs as user munge and writes its pid file into its own folder
                Path("/run/munge").mkdir(parents=True, exist_ok=True)
                shutil.chown("/run/munge", "munge", "munge")
                started_munge = Path("/run/munge/munged.pid")
                subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True, timeout=30)
                deadline = time.monotonic() + 20
                while not _munge_answers():
                    if time.monotonic() > deadline:
                        raise SlurmUnavailable("munged did not answer within 20 s")
                    time.sleep(0.5)
            subprocess.run(["slurmctld", "-f", str(conf)], check=True, timeout=30, env=env)
            subprocess.run(["slurmd", "-f", str(conf)], check=True, timeout=30, env=env)
            deadline = time.monotonic() + START_TIMEOUT_S
            state = ""
            while time.monotonic() < deadline:
                out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=10)
                state = out.stdout.strip()
                if state == "idle":
                    break
                time.sleep(0.5)
            else:
                log = (root / "slurmctld.log").read_text()[-1500:] if (root / "slurmctld.log").exists() else ""
                raise SlurmUnavailable(f"the node did not come up (state {state!r}): {log}")
        except (OSError, subprocess.SubprocessError) as exc:  # said in one line: CI fails on it, a laptop skips
            raise SlurmUnavailable(f"the cluster did not start: {exc}") from exc
        yield env
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--user", "root"], env=env, timeout=10, capture_output=True)
        _stop_pidfile(root / "slurmd.pid")
        _stop_pidfile(root / "slurmctld.pid")
        if started_munge:
            _stop_pidfile(started_munge)
        if SYSTEM_CONF.is_symlink() and SYSTEM_CONF.resolve() == conf.resolve():
            SYSTEM_CONF.unlink()
