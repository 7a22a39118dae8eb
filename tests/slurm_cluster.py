"""A real one-node SLURM cluster for the tests: Debian's ``slurm-wlm`` (``slurmctld``,
``slurmd``) with ``munged``, configured in a temporary folder and started and stopped by
the tests (by PID), as root.

Use it by importing the fixture into a test module::

    from slurm_cluster import slurm_cluster  # noqa: F401  (a pytest fixture)

    def test_something(slurm_cluster):
        out = slurm_cluster.srun(["-n", "2", "hostname"])

Where the packages are missing and this is root with ``apt-get``, the fixture installs
``slurm-wlm`` (as ``tests/site_check.py`` installs Chromium); elsewhere it skips, with the
reason and the command that would make it run. Everything it writes (munge key, sockets,
spool, logs, state) lives in one temporary folder; the ports are free ones picked at
start, so several test workers can each run a cluster at once. Nothing outside that folder
is changed, except the packages installed.

Choices, measured on the 2-core VM (slurm-wlm 22.05, 26 Nov 2026):
- ``SlurmUser=root`` and ``ProctrackType=proctrack/linuxproc``: no cgroups, no slurm user
  directories; what a one-machine test needs.
- ``KillWait=5``: SLURM's default gives a job 30 s between SIGTERM and SIGKILL on
  ``scancel``, requeue and time limit; 5 s keeps the tests short and still leaves a
  preempted run several seconds to write its checkpoint.
- A requeued batch job is held about 2 minutes (its begin time) before it runs again;
  :meth:`SlurmCluster.requeue` sets its start time to now, as an administrator would, so it
  runs again at once.
- ``OverSubscribe=YES`` and ``CPUs`` = this machine's cores: a 2-task job runs on 2 cores.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from distkit.host.facts import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
PYTHON_DIR = os.path.dirname(sys.executable)
TASKS_ENDED_BY_A_SIGNAL = re.compile(r"task \d+: (Terminated|Killed|Hangup|User defined signal)")
"""srun's words for a task that a signal ended (its exit code then outranks every other)."""


def job_env(**extra) -> dict:
    """What a user's shell has when they submit: this venv first on PATH, 1 thread a task."""
    return {"PATH": f"{PYTHON_DIR}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **{k: str(v) for k, v in extra.items()}}
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _first_job_id() -> int:
    """A first job id whose ignite master port (15000 + last 4 digits) and the next 50 are
    free here."""
    rng = random.Random()
    for _ in range(200):
        last4 = rng.randrange(1000, 9900)
        if all(_port_is_free(15000 + last4 + i) for i in range(0, 50, 7)):
            return 10000 * rng.randrange(1, 90) + last4
    return 10000 + rng.randrange(1000, 9900)


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _have_slurm() -> bool:
    return all(shutil.which(name) or Path(f"/usr/sbin/{name}").exists()
               for name in ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch"))


def ensure_slurm_installed() -> None:
    """Install Debian's slurm-wlm when it is missing and this is root; skip otherwise."""
    if _have_slurm():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no SLURM here and not root to install it: sudo apt-get install slurm-wlm")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "slurm-wlm"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"could not install slurm-wlm ({' '.join(command)}: "
                        f"{(done.stderr or done.stdout).strip().splitlines()[-1:]})")
    if not _have_slurm():
        pytest.skip("apt-get installed slurm-wlm, but munged/slurmctld/slurmd/srun are missing")


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """One node, one partition (``debug``), everything in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        # A job never inherits the variables of a job step the test itself may run in.
        for name in list(self.env):
            if name.startswith("SLURM_") and name != "SLURM_CONF":
                del self.env[name]
        self.pids: dict[str, int] = {}

    # -- start and stop -------------------------------------------------------------
    def start(self) -> None:
        f = self.folder
        for sub in ("munge", "spool/ctld", "spool/d", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(f, 0o711)            # munged checks its socket's folder can be reached
        os.chmod(f / "munge", 0o700)
        key = f / "munge" / "munge.key"
        subprocess.run([_sbin("mungekey"), "--create", "--keyfile", str(key)], check=True,
                       capture_output=True, timeout=30)
        socket_path = f / "munge" / "munge.socket"
        subprocess.run([_sbin("munged"), "--force", f"--socket={socket_path}",
                        f"--key-file={key}", f"--log-file={f / 'log' / 'munged.log'}",
                        f"--pid-file={f / 'munge' / 'munged.pid'}",
                        f"--seed-file={f / 'munge' / 'munged.seed'}"],
                       check=True, capture_output=True, timeout=30)
        self.pids["munged"] = self._read_pid(f / "munge" / "munged.pid")
        self.conf.write_text(self._config(socket_path))
        for daemon in ("slurmctld", "slurmd"):
            done = subprocess.run([_sbin(daemon), "-f", str(self.conf)], capture_output=True,
                                  text=True, timeout=60, env=self.env)
            if done.returncode != 0:
                raise RuntimeError(f"{daemon} did not start: {done.stderr.strip()}\n"
                                   f"{self.log(daemon)}")
            self.pids[daemon] = self._read_pid(f / f"{daemon}.pid")
        self._wait_idle()

    def _config(self, munge_socket: Path) -> str:
        f = self.folder
        return "\n".join([
            "ClusterName=distkit-test",
            f"SlurmctldHost={self.host}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"StateSaveLocation={f / 'spool' / 'ctld'}",
            f"SlurmdSpoolDir={f / 'spool' / 'd'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "KillWait=5",
            # ignite's master port under SLURM is 15000 + the job id's last 4 digits: a
            # cluster of its own per test worker starts its job ids where that port is free
            f"FirstJobId={_first_job_id()}",
            "MinJobAge=600",
            f"NodeName={self.host} CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES",
            "",
        ])

    @staticmethod
    def _read_pid(path: Path, timeout_s: float = 15.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return int(path.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                time.sleep(0.1)
        raise RuntimeError(f"no PID file at {path} after {timeout_s:.0f} s")

    def _wait_idle(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True,
                                  text=True, timeout=30)
            state = done.stdout.strip()
            if state in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM node is not idle after {timeout_s:.0f} s (sinfo: "
                           f"{state!r})\n{self.log('slurmctld')}\n{self.log('slurmd')}")

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by PID (slurmd, slurmctld, munged)."""
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env,
                       capture_output=True, timeout=30)
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(daemon)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

    def log(self, daemon: str, lines: int = 20) -> str:
        path = self.folder / "log" / f"{daemon}.log"
        if not path.exists():
            return f"({path} absent)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- what the tests use -----------------------------------------------------------
    def run(self, command: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """A SLURM client command (srun, sbatch, scontrol, scancel ...) against this cluster."""
        env = dict(self.env, **kw.pop("env", {}))
        return subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=timeout, **kw)

    def srun(self, args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return self.run(["srun", *args], timeout=timeout, **kw)

    def sbatch(self, args: list[str], **kw) -> str:
        done = self.run(["sbatch", "--parsable", *args], **kw)
        assert done.returncode == 0, f"sbatch failed: {done.stderr.strip()}"
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (sacct needs slurmdbd, which this cluster lacks)."""
        done = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        fields = {}
        for word in done.stdout.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, states=FINISHED, timeout_s: float = 300) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout_s:.0f} s: "
                             f"{self.job(job_id)}")

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue``, then start it at once (SLURM holds it about 2 minutes)."""
        done = self.run(["scontrol", "requeue", job_id], timeout=30)
        assert done.returncode == 0, f"scontrol requeue failed: {done.stderr.strip()}"
        self.wait(job_id, states={"PENDING"}, timeout_s=60)
        self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child) counts as ended
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running one-node SLURM cluster for the module's tests; stopped afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a SLURM cluster needs root here (its daemons run as root): run as root")
    ensure_slurm_installed()
    folder = Path(tempfile.mkdtemp(prefix="distkit-slurm-"))
    cluster = SlurmCluster(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
