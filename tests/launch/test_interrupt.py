"""Interrupting the launcher alone stops the whole run.

SIGINT reaches only the launcher when it is sent with ``kill -INT <pid>`` or by Jupyter's
"interrupt kernel". torch spawns non-daemonic workers, so without the launcher stopping
them they trained on to the last epoch while the launcher's exit waited for them. Both
tests interrupt a 200-epoch run (minutes) after its first checkpoint and check: every
worker gone within seconds, one line saying so, the named checkpoint complete."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from support import subprocess_env
from distkit.checkpoint.saver import checkpoint_iteration, load_checkpoint
from distkit.lessons import failure

STOP_DEADLINE_S = 20  # "within a few seconds", with room for a busy 2-core machine


def children(pid: int) -> list[int]:
    """The training processes under ``pid`` (not multiprocessing's resource tracker)."""
    return list(failure.worker_pids(pid).values())


def gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(failure_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def failure_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by a parent that is gone) is not running
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def default_sigint() -> None:
    """The launcher starts with SIGINT's default action, as under a terminal or Jupyter.
    A shell's background job (``cmd &``) starts with SIGINT *ignored*, and Python keeps an
    ignored SIGINT ignored: run from such a job, the launcher would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_resumable(path: str, runs) -> None:
    ckpt = load_checkpoint(path)  # weights_only=True; raises on a half-written file
    assert ckpt["trainer"]["iteration"] == checkpoint_iteration(path) > 0
    assert not list(runs.glob("*/results.json")), "an interrupted run wrote final results"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("whole_group", [False, True], ids=["launcher-only", "ctrl-c"])
def test_sigint_to_the_launcher_only_stops_every_worker(tmp_path, whole_group):
    """``launcher-only``: ``kill -INT <pid>``, as Jupyter's interrupt does. ``ctrl-c``: a
    terminal's Ctrl-C, SIGINT to the whole process group, workers included."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distkit", "train", "--nproc-per-node", "2", "--epochs", "200",
         "--no-progress", "--output-dir", str(runs)],
        cwd=tmp_path, env=subprocess_env(), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=whole_group, preexec_fn=default_sigint)
    try:
        failure.wait_for_checkpoint(runs, 1, timeout=120)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        sent = time.monotonic()
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)  # the launcher only, as Jupyter's interrupt does
        out, err = proc.communicate(timeout=STOP_DEADLINE_S)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert took < STOP_DEADLINE_S
    assert gone_within(workers, 1), "a worker outlived the launcher"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    # with Ctrl-C the workers get SIGINT too and may be gone before the launcher counts them
    m = re.fullmatch(r"distkit: interrupted: stopped \d worker process\(es\); resume from the last "
                     r"complete checkpoint with --resume-from (\S+\.pt)", lines[-1])
    assert m, err[-2000:]
    check_resumable(m.group(1) if os.path.isabs(m.group(1)) else str(tmp_path / m.group(1)), runs)
    # nothing trains on: no checkpoint appears after the interrupt
    before = sorted(runs.glob("*/checkpoints/*.pt"))
    time.sleep(2)
    assert sorted(runs.glob("*/checkpoints/*.pt")) == before


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_jupyter_interrupt_kernel_stops_every_worker(tmp_path):
    """A real IPython kernel runs ``run(Config(...))``; ``interrupt_kernel()`` sends the
    kernel SIGINT, as the notebook's stop button does."""
    jupyter_client = pytest.importorskip("jupyter_client")
    runs = tmp_path / "runs"
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=subprocess_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(
            "from distkit import Config, run\n"
            f"run(Config(nproc_per_node=2, epochs=200, progress_bar=False, output_dir={str(runs)!r},"
            " threads_per_process=1))\n")
        failure.wait_for_checkpoint(runs, 1, timeout=150)
        kernel_pid = km.provisioner.process.pid
        workers = children(kernel_pid)
        assert len(workers) == 2, workers
        sent = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=STOP_DEADLINE_S)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=STOP_DEADLINE_S)
        took = time.monotonic() - sent
        content = reply["content"]
        assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", content
        assert took < STOP_DEADLINE_S
        assert gone_within(workers, 2), "a worker outlived the interrupt"
        m = re.search(r"--resume-from (\S+\.pt)", content["evalue"])
        assert m and content["evalue"].startswith("stopped 2 worker process(es)"), content["evalue"]
        check_resumable(m.group(1), runs)
        # the kernel is still usable after the interrupt. A request that reaches ipykernel
        # before it has finished "aborting the queue" after an error (its callback, run on
        # its next loop turn; later on a loaded machine) is answered "aborted", as a cell
        # run at that moment in a notebook would be: the next request runs
        statuses = []
        for _ in range(3):
            statuses.append(kc.execute_interactive("1 + 1", timeout=30)["content"]["status"])
            if statuses[-1] != "aborted":
                break
            time.sleep(0.5)
        assert statuses[-1] == "ok", statuses
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


LONG_WORKER = """
import os, sys, time
from distkit.launch.entry import launch_function

def worker(local_rank, folder):
    with open(os.path.join(folder, f"rank{local_rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.getsid(0)}")
    time.sleep(600)

if __name__ == "__main__":
    launch_function(worker, sys.argv[1], backend="gloo", nproc_per_node=2)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_run_in_sessions_of_their_own_and_end_with_a_killed_launcher(tmp_path):
    """As torchrun starts them: each worker leads its own session (autogroup scheduling
    then gives it a share of its own; tiny steps ran ~10% faster so). Outside the
    launcher's session no terminal hang-up reaches them, so a SIGKILLed launcher must
    still take them down (PR_SET_PDEATHSIG) rather than leave orphans training."""
    script = tmp_path / "long_worker.py"
    script.write_text(LONG_WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=subprocess_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("rank*"))) < 2 or any(not p.read_text() for p in tmp_path.glob("rank*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.2)
        workers = [tuple(map(int, p.read_text().split())) for p in sorted(tmp_path.glob("rank*"))]
        assert all(pid == sid for pid, sid in workers), workers  # each one a session leader
        assert all(sid != os.getsid(proc.pid) for _, sid in workers)
        proc.kill()  # SIGKILL: the launcher cleans nothing up itself
        proc.wait(10)
        assert gone_within([pid for pid, _ in workers], STOP_DEADLINE_S), "orphaned workers kept running"
    finally:
        if proc.poll() is None:
            proc.kill()
