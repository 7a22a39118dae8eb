"""Surviving failure: a rank killed with SIGKILL ends the job fast, naming it; a kill
during a checkpoint save leaves the previous checkpoint loadable; torchrun restarts and
resumes from the newest checkpoint, ending parameter for parameter where an
uninterrupted run ends."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support import REPO_ROOT, subprocess_env
from distkit.lessons import failure
from distkit.config import Config
from distkit.errors import DistkitError
from distkit.host.facts import free_port
from distkit.checkpoint import saver as checkpoint
from distkit.checkpoint.saver import load_checkpoint

KILL_DEADLINE_S = 30
TRAIN = ["--epochs", "2", "--no-progress", "--checkpoint-every", "5"]  # digits: 23 iterations per epoch


def distkit_cmd(*args):
    return [sys.executable, "-m", "distkit", "train", *map(str, args)]


def start(cmd, cwd, **env):
    return subprocess.Popen(cmd, cwd=cwd, env=subprocess_env(**env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"still running {timeout} s after the kill (hang):\n{out[-3000:]}")
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def fake_checkpoint(path: Path, iteration: int, epoch_length: int = 23, max_epochs: int = 2):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"trainer": {"iteration": iteration, "epoch_length": epoch_length, "max_epochs": max_epochs},
                "model": {}, "optimizer": {"state": {}, "param_groups": []}, "lr_scheduler": {}}, path)
    checkpoint.write_checksum(path, iteration)
    return path


# --- finding the checkpoint to resume from ----------------------------------------------

def test_latest_checkpoint_is_the_highest_iteration_and_ignores_interrupted_saves(tmp_path):
    assert checkpoint.latest_checkpoint(tmp_path) is None
    high = fake_checkpoint(tmp_path / "run-a" / "checkpoints" / "training_checkpoint_40.pt", 40)
    low = fake_checkpoint(tmp_path / "run-b" / "checkpoints" / "training_checkpoint_15.pt", 15)
    # an older file time, a higher iteration (a `cp -r` restore renews file times): newest
    os.utime(high, ns=(1_000_000_000, 1_000_000_000))
    (tmp_path / "run-b" / "checkpoints" / "tmpab12cd").write_bytes(b"half a checkpoint")
    assert checkpoint.latest_checkpoint(tmp_path) == str(high)
    assert checkpoint.checkpoint_iteration(low) == 15


def test_resume_from_latest_resolves_starts_fresh_or_refuses_a_finished_run(tmp_path, capsys):
    config = Config(output_dir=str(tmp_path), resume_from="latest")
    assert checkpoint.resolve_resume_from(config).resume_from is None
    assert "starting from scratch" in capsys.readouterr().out
    mid = fake_checkpoint(tmp_path / "r" / "checkpoints" / "training_checkpoint_15.pt", 15)
    assert checkpoint.resolve_resume_from(config).resume_from == str(mid)
    done = fake_checkpoint(tmp_path / "r2" / "checkpoints" / "training_checkpoint_46.pt", 46)
    with pytest.raises(DistkitError, match="finished run.*own --output-dir"):
        checkpoint.resolve_resume_from(config)
    os.remove(done)
    other = Config(output_dir=str(tmp_path), resume_from=str(mid))
    assert checkpoint.resolve_resume_from(other) is other  # an explicit path is left alone


def test_spawned_ranks_are_told_apart_across_a_pid_wrap():
    assert failure.creation_order([32761, 5, 32767], parent=32760, pid_max=32768) == [32761, 32767, 5]
    assert failure.creation_order([12, 11], parent=10, pid_max=32768) == [11, 12]


def test_restart_warning_only_for_restarts_of_several_nodes_with_a_shared_store(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in checkpoint.restart_store_warning()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # one node: each attempt has its own prefix
    assert checkpoint.restart_store_warning() is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert checkpoint.restart_store_warning() is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert checkpoint.restart_store_warning() is None


# --- a rank killed mid-epoch --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigkill_one_rank_ends_the_spawned_job_fast_naming_the_rank(tmp_path):
    proc = start(distkit_cmd("--nproc-per-node", 2, *TRAIN, "--output-dir", tmp_path / "runs"), tmp_path)
    ckpt = failure.wait_for_checkpoint(tmp_path / "runs", 10, timeout=100)  # mid epoch 1
    assert checkpoint.checkpoint_iteration(ckpt) < 23
    workers = failure.worker_pids(proc.pid)
    assert sorted(workers) == [0, 1], workers
    killed_at = time.monotonic()
    failure.kill_rank(proc.pid, 1)
    out = finish(proc, KILL_DEADLINE_S)
    took = time.monotonic() - killed_at
    assert proc.returncode != 0
    assert took < KILL_DEADLINE_S
    last = out.strip().splitlines()[-1]
    assert re.match(r"distkit: error: rank 1 \(local rank 1\) was killed by SIGKILL", last), out[-2000:]
    assert not alive(workers[0]), "rank 0 outlived the job"


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("monitor_s", [0.1, 5.0], ids=["agent-default", "agent-slow"])
def test_sigkill_one_rank_ends_the_torchrun_job_fast_naming_the_rank(tmp_path, monitor_s):
    """torchrun names as root cause the failure with the earliest timestamp (whole
    seconds). The surviving rank sees its connection reset at once; it is a witness and
    waits for the agent to stop it. A slow agent (``--monitor-interval 5``: it looks at
    its workers every 5 s, as a loaded machine may) made a survivor that reported at once
    the root cause in most runs; torchrun's default looks every 0.1 s."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--monitor-interval={monitor_s}", "-m", "distkit", "train", *TRAIN, "--output-dir", tmp_path / "runs"]
    proc = start(list(map(str, cmd)), tmp_path)
    failure.wait_for_checkpoint(tmp_path / "runs", 10, timeout=100)
    workers = failure.wait_for_workers(proc.pid, 2)  # torchrun gives each worker its RANK
    killed_at = time.monotonic()
    failure.kill_rank(proc.pid, 1)
    out = finish(proc, KILL_DEADLINE_S)
    assert proc.returncode != 0
    assert time.monotonic() - killed_at < KILL_DEADLINE_S
    root_cause = out.split("Root Cause")[-1]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", root_cause), out[-2000:]
    assert "SIGKILL" in root_cause
    assert not alive(workers[0])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigkill_on_one_of_two_nodes_ends_both_nodes(tmp_path):
    """Two "nodes" on 127.0.0.1 (``distkit train --nnodes 2``, each spawning 1 process):
    node 1's launcher names rank 1; node 0's rank 0 sees its peer gone, and says so."""
    port = free_port()
    nodes = [start(distkit_cmd("--nnodes", 2, "--node-rank", r, "--nproc-per-node", 1,
                               "--master-addr", "127.0.0.1", "--master-port", port, *TRAIN,
                               "--output-dir", tmp_path / f"node{r}"), tmp_path) for r in (0, 1)]
    try:
        failure.wait_for_checkpoint(tmp_path / "node0", 10, timeout=100)
        killed_at = time.monotonic()
        failure.kill_rank(nodes[1].pid, 1, first_rank=1)
        outs = [finish(p, KILL_DEADLINE_S) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert time.monotonic() - killed_at < KILL_DEADLINE_S
    assert [p.returncode != 0 for p in nodes] == [True, True]
    assert "distkit: error: rank 1 (local rank 0) was killed by SIGKILL" in outs[1]
    assert re.search(r"distkit: error: rank 0 .*(closed|reset|peer)", outs[0]), outs[0][-2000:]


# --- a stuck (stopped) rank ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_stopped_rank_ends_the_job_in_about_the_timeout_naming_it(tmp_path):
    """SIGSTOP rank 1: rank 0 times out in its next all-reduce after --timeout s. Without
    the launcher's watchdog the job took the timeout plus torch's 30 s SIGTERM grace (a
    stopped process never handles SIGTERM), and the message named the healthy rank 0."""
    timeout = 10
    proc = start(distkit_cmd("--nproc-per-node", 2, *TRAIN, "--timeout", timeout,
                             "--output-dir", tmp_path / "runs"), tmp_path)
    failure.wait_for_checkpoint(tmp_path / "runs", 5, timeout=100)
    workers = failure.worker_pids(proc.pid)
    stopped_at = time.monotonic()
    failure.kill_rank(proc.pid, 1, sig=signal.SIGSTOP)
    out = finish(proc, timeout + 60)
    took = time.monotonic() - stopped_at
    assert proc.returncode == 1, out[-2000:]
    # measured here: 21 s for --timeout 10 (10 s timeout, about 7 s for rank 0 to exit,
    # 4 s for the launcher); before: 50 s
    assert took < timeout + 25, f"{took:.1f} s"
    last = out.strip().splitlines()[-1]
    assert last.startswith("distkit: error: rank 1 stopped answering (its process was stopped"), out[-2000:]
    assert f"gave up after --timeout {timeout} s" in last and "--resume-from latest" in last
    assert "rank 0" not in last and "Traceback" not in out
    assert not any(alive(pid) for pid in workers.values())


# --- a kill during a checkpoint save ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigkill_during_a_checkpoint_save_leaves_the_previous_one_loadable(tmp_path):
    """ResNet-18 (about 90 MB with its momentum buffers) checkpointed every iteration:
    kill the process while DiskSaver is writing its temporary file."""
    runs = tmp_path / "runs"
    proc = start(distkit_cmd("--backend", "none", "--nproc-per-node", 1, "--model", "resnet18",
                             "--dataset", "synthetic", "--dataset-size", 256, "--batch-size", 16,
                             "--checkpoint-every", 1, "--epochs", 1, "--no-progress",
                             "--output-dir", runs), tmp_path)
    deadline, partial = time.monotonic() + 120, None
    while time.monotonic() < deadline and proc.poll() is None:
        done = list(runs.glob("*/checkpoints/*.pt"))
        tmps = list(runs.glob("*/checkpoints/tmp*"))
        try:
            # well into a save, and short of its end by far: a kill as the file is whole
            # (before its rename) would not be a write cut short
            whole = done[0].stat().st_size if done else 0
            if done and tmps and 1_000_000 < tmps[0].stat().st_size < 0.8 * whole:
                proc.send_signal(signal.SIGKILL)
                partial = tmps[0]
                break
        except FileNotFoundError:  # the save finished (renamed) while we looked
            pass
        time.sleep(0.002)
    out = finish(proc, 30)
    assert partial is not None, f"never caught a save in progress:\n{out[-2000:]}"
    assert proc.returncode == -signal.SIGKILL
    # complete = proven by its checksum (a kill between the rename and the checksum's
    # write leaves a .pt without one: never loaded, see test_checkpoint_integrity)
    complete = sorted(p for p in runs.glob("*/checkpoints/*.pt")
                      if checkpoint.checksum_problem(str(p)) is None)
    assert complete, "the previous checkpoint is gone"
    assert partial.exists() and partial.stat().st_size < complete[-1].stat().st_size
    with pytest.raises(DistkitError, match="no checksum beside it"):
        load_checkpoint(str(partial))  # the half-written file is never even read...
    for path in complete:  # ...but every finished checkpoint loads (weights_only=True)
        ckpt = load_checkpoint(str(path))
        assert ckpt["trainer"]["iteration"] == checkpoint.checkpoint_iteration(path)
        assert "fc.weight" in ckpt["model"]
    assert checkpoint.latest_checkpoint(runs) == str(complete[-1])  # and resume picks it


def test_kill_during_an_atomic_disksaver_save_keeps_the_previous_file(tmp_path):
    """The same with ignite's DiskSaver alone (the helper notebook 09 uses)."""
    from ignite.handlers import DiskSaver

    state = {"model": {"w": torch.arange(6_000_000, dtype=torch.float32)}}  # 24 MB
    saver = DiskSaver(str(tmp_path), atomic=True, require_empty=False)
    caught = failure.kill_during_save(lambda i: saver(state, f"training_checkpoint_{i}.pt"), tmp_path,
                                      min_bytes=1_000_000)
    assert 1_000_000 <= caught["partial_bytes"] < os.path.getsize(caught["complete"][-1])
    with pytest.raises(Exception):
        torch.load(caught["partial"], weights_only=True)
    for path in caught["complete"]:
        assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], state["model"]["w"])


# --- torchrun --max-restarts resumes from the newest checkpoint ---------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_restart_resumes_and_ends_identical_to_an_uninterrupted_run(tmp_path):
    """scripts/torchrun_1node.sh with one restart allowed; rank 1 is killed mid epoch 1.
    The restart resumes from the newest checkpoint and the final weights equal, bit for
    bit, those of an uninterrupted run (spawned by distkit, run alongside)."""
    epochs = ["--epochs", "2", "--no-progress"]
    reference = start(distkit_cmd("--nproc-per-node", 2, *epochs, "--output-dir", tmp_path / "ref"), tmp_path)
    bindir = os.path.dirname(sys.executable)  # torchrun lives beside this python
    job = subprocess.Popen(
        ["bash", str(REPO_ROOT / "scripts" / "torchrun_1node.sh"), *epochs], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=subprocess_env(NPROC=2, MAX_RESTARTS=1, CHECKPOINT_EVERY=5, OUTPUT_DIR=tmp_path / "job",
                           PATH=f"{bindir}:{os.environ['PATH']}"))
    try:
        failure.wait_for_checkpoint(tmp_path / "job", 10, timeout=150)
        failure.kill_rank(job.pid, 1)  # bash exec'd torchrun: same pid
        newest_at_kill = checkpoint.latest_checkpoint(tmp_path / "job")
        out = finish(job, 150)
        ref_out = finish(reference, 150)
    finally:
        job.kill()
        reference.kill()
    assert job.returncode == 0, out[-3000:]
    assert reference.returncode == 0, ref_out[-3000:]
    # torchrun's agent names the dead worker (-9: SIGKILL) before it restarts the group
    assert re.search(r"failed \(exitcode: -9\) local_rank: 1 ", out), out[-3000:]
    resumed = re.search(r"--resume-from latest \(TORCHELASTIC_RESTART_COUNT=1\): resuming from (\S+)", out)
    assert resumed, out[-3000:]
    assert checkpoint.checkpoint_iteration(resumed.group(1)) >= checkpoint.checkpoint_iteration(newest_at_kill)
    final = {d: load_checkpoint(checkpoint.latest_checkpoint(tmp_path / d)) for d in ("job", "ref")}
    assert final["job"]["trainer"]["iteration"] == final["ref"]["trainer"]["iteration"] == 46
    a, b = final["job"]["model"], final["ref"]["model"]
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after the restart"
    first = load_checkpoint(resumed.group(1))["model"]  # and the check can fail:
    assert any(not torch.equal(first[n], a[n]) for n in a)


# --- a full disk --------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: room for the run folder, not for one checkpoint (about 1.2 MB for
    the digits CNN with its momentum buffers). Needs root (mount); skipped elsewhere."""
    path = tmp_path / "tiny"
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            str(path)], capture_output=True).returncode != 0:
        pytest.skip("needs root allowed to mount a tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_full_disk_while_saving_is_one_line_naming_the_disk(tmp_path, tiny_disk):
    """torch.save reports a full disk as ``RuntimeError: [enforce fail at
    inline_container.cc] . unexpected pos``; the learner reads "no space left on <dir>"."""
    proc = start(distkit_cmd("--nproc-per-node", 2, "--epochs", 1, "--no-progress",
                             "--output-dir", tiny_disk / "runs"), tmp_path)
    started = time.monotonic()
    out = finish(proc, 150)
    assert proc.returncode == 1, out[-2000:]
    assert time.monotonic() - started < 150
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"distkit: error: rank 0: no space left on '{re.escape(str(tiny_disk))}"
                        r"/runs/[^']+/checkpoints' while writing the run: free some space or pass "
                        r"an --output-dir on another disk; .*", last), out[-2000:]
    assert "Traceback" not in out and "unexpected pos" not in out
    # nothing half-written: no checkpoint, no results; what may stay is a traceback and a
    # best model saved whole before the disk filled up (it loads)
    left = [p.relative_to(tiny_disk / "runs") for p in (tiny_disk / "runs").rglob("*") if p.is_file()]
    assert all(p.parts[1] in ("tracebacks", "best") for p in left), left
    for p in left:
        if p.parts[1] == "best" and p.suffix == ".pt":
            checkpoint.load_verified(tiny_disk / "runs" / p)


# --- resuming: what a resumed run reports, and a changed flag refused ---------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resumed_run_reports_every_epoch_and_labels_a_partial_train_loss(tmp_path):
    """Stopped at iteration 30 (mid epoch 2 of 3, 23 iterations each) and resumed: the
    summary counts 3 epochs, and epoch 2's train loss says it averages 16 batches."""
    import json

    runs = tmp_path / "runs"
    first = finish(start(distkit_cmd("--nproc-per-node", 2, "--epochs", 3, "--no-progress",
                                     "--max-iters", 30, "--output-dir", runs), tmp_path), 150)
    ckpt = checkpoint.latest_checkpoint(runs)
    assert ckpt and ckpt.endswith("_30.pt"), first[-2000:]
    # the checkpoint records the settings of the run that wrote it...
    from distkit.checkpoint.saver import resume_settings

    assert load_checkpoint(ckpt)["settings"] == resume_settings(Config(epochs=3), "digits/cnn", 2, optimizer="SGD")
    # ...so a resume that would silently differ is refused before any process starts
    refused = subprocess.run(distkit_cmd("--nproc-per-node", 2, "--epochs", 3, "--batch-size", 32,
                                         "--resume-from", ckpt, "--output-dir", tmp_path / "r2"),
                             cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"distkit: error: --resume-from {ckpt!r} was written with --batch-size = 64 and this run "
        "has 32 (the epoch length and the order of batches depend on it): resume with "
        "--batch-size 64, or start a new run without --resume-from"]
    assert not (tmp_path / "r2").exists()
    out = finish(start(distkit_cmd("--nproc-per-node", 2, "--epochs", 3, "--no-progress",
                                   "--resume-from", ckpt, "--output-dir", runs), tmp_path), 150)
    assert "after 3 epoch(s), 69 iterations" in out, out[-2000:]
    resumed_dir = re.search(r"results, checkpoints and plots in (\S+)", out).group(1)
    results = json.loads((tmp_path / resumed_dir / "results.json").read_text())
    # every epoch of the run, the one trained before the resume included (from the checkpoint)
    assert [h["epoch"] for h in results["history"]] == [1, 2, 3]
    assert [h.get("before_resume", False) for h in results["history"]] == [True, False, False]
    assert [h["train_loss_iterations"] for h in results["history"]] == [23, 16, 23]
    assert results["epochs_completed"] == 3 and results["epochs_this_run"] == 2


# --- bad input under torchrun --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("args, words", [
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    # mixing the two launch recipes: torchrun starts the processes, distkit would spawn more
    (["--nproc-per-node", "2"], "--nproc-per-node 2 inside a torchrun/SLURM launch"),
])
def test_bad_input_under_torchrun_is_one_line_from_rank_0(tmp_path, args, words):
    """Every rank fails the same check before training: rank 0 prints the line, the
    others exit quietly, and torchrun's own summary (which a worker cannot silence) names
    the line as the root cause instead of "To enable traceback see ..."."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "distkit", "train", *args, "--output-dir", tmp_path / "runs"]
    started = time.monotonic()
    proc = start(list(map(str, cmd)), tmp_path)
    out = finish(proc, 120)
    assert time.monotonic() - started < 120
    assert proc.returncode == 1, out[-3000:]
    ours = [ln for ln in out.splitlines() if ln.startswith("distkit: error:")]
    assert len(ours) == 1 and words in ours[0], out[-3000:]
    root_cause = out.split("Root Cause")[-1]
    assert f"traceback : {ours[0]}" in root_cause, out[-3000:]
    assert "ChildFailedError" in out  # torchrun's, exit code 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_failure_after_start_up_under_torchrun_leaves_no_empty_run_folder(tmp_path):
    """Under torchrun rank 0 makes the run folder inside training; MNIST offline then
    fails on every rank (downloads happen there, not in preflight). The folder, holding
    nothing of value, is removed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "distkit", "train", "--dataset", "mnist", "--data-dir", tmp_path / "nodata",
           "--output-dir", tmp_path / "runs"]
    proc = start(list(map(str, cmd)), tmp_path)
    out = finish(proc, 150)
    assert proc.returncode == 1, out[-3000:]
    assert "distkit: error: dataset 'mnist'" in out and "--dataset digits" in out
    assert list((tmp_path / "runs").glob("*")) == [], "an empty run folder was left behind"
