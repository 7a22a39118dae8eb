"""distkit on a real one-node SLURM cluster (tests/slurm_cluster.py: Debian's slurm-wlm,
started and stopped by these tests as root): ``srun`` runs ``distkit train`` and
``distkit launch`` directly, the kit's own ``scripts/slurm.sbatch`` is submitted with
``sbatch``, resumed, requeued (``scontrol requeue``) and cancelled (``scancel --signal=TERM``).
These replace the stand-in ``srun`` the tests used before."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from support import REPO_ROOT
from slurm_cluster import TASKS_ENDED_BY_A_SIGNAL, job_env, slurm_cluster  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TINY = ["--epochs", "1", "--no-progress", "--dataset", "synthetic", "--dataset-size", "256"]


def test_srun_gives_each_task_its_place(slurm_cluster):
    out = slurm_cluster.srun(["-n", "2", "bash", "-c",
                              "echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_NNODES"])
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["0 0 2 1", "1 1 2 1"]


def test_srun_runs_distkit_train_as_one_job_step(slurm_cluster, tmp_path):
    out = slurm_cluster.srun(["-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "distkit",
                              "train", *TINY, "--output-dir", str(tmp_path / "runs")],
                             cwd=tmp_path, env=job_env(), timeout=240)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (results,) = (tmp_path / "runs").glob("*/results.json")
    res = json.loads(results.read_text())
    assert (res["world_size"], res["nnodes"]) == (2, 1)
    assert res["replicas_identical"]


def test_the_kits_sbatch_script_runs_a_job(slurm_cluster, tmp_path):
    """scripts/slurm.sbatch, unchanged, submitted with its resources overridden for this
    one 2-core node; the job's log holds the command and the summary."""
    job = slurm_cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                                str(REPO_ROOT / "scripts" / "slurm.sbatch"), *TINY],
                               cwd=tmp_path, env=job_env())
    info = slurm_cluster.wait(job, timeout_s=240)
    log = next(tmp_path.glob(f"*-{job}.out")).read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert "+ srun --kill-on-bad-exit=1 python -m distkit train" in log
    assert "no checkpoint yet: starting from scratch" in log
    (results,) = (tmp_path / "runs" / f"slurm-{job}").glob("*/results.json")
    res = json.loads(results.read_text())
    assert (res["world_size"], res["nnodes"]) == (2, 1)
    assert res["replicas_identical"]


def test_a_course_task_through_the_sbatch_template(slurm_cluster, tmp_path):
    """scripts/slurm.sbatch passes --task through to distkit train, submitted from the
    folder of course.py as docs/course.md says."""
    from courses import TRAIN, assert_course_results, results_under, write_course

    write_course(tmp_path)
    job = slurm_cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                                str(REPO_ROOT / "scripts" / "slurm.sbatch"), "--task",
                                "course:task", *TRAIN], cwd=tmp_path, env=job_env())
    info = slurm_cluster.wait(job, timeout_s=280)
    log = next(tmp_path.glob(f"*-{job}.out")).read_text()
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert_course_results(results_under(tmp_path / "runs" / f"slurm-{job}"), world_size=2)


def test_a_course_tasks_bare_one_cycle_reaches_its_peak_under_srun(slurm_cluster, tmp_path):
    """The foreign course task of tests/foreign/headlines.py (a bare OneCycleLR from its
    factory) under srun: stepped per iteration, its peak reached, one summary per run."""
    from courses import FOREIGN, assert_one_cycle_reached_its_peak

    out = slurm_cluster.srun(["-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "distkit",
                              "train", "--task", f"{FOREIGN / 'headlines.py'}:task", "--epochs", "2",
                              "--batch-size", "32", "--set", "train_size=192", "--set",
                              "val_size=48", "--no-progress", "--output-dir", str(tmp_path / "runs")],
                             cwd=tmp_path, env=job_env(), timeout=280)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (res,) = _results(tmp_path / "runs")
    assert res["world_size"] == 2 and res["replicas_identical"]
    assert_one_cycle_reached_its_peak(res)
    assert out.stdout.count("best validation f1") == 1, "one summary per run, not per rank"


def test_a_plain_pytorch_script_under_srun(slurm_cluster, tmp_path):
    """tests/foreign/multigpu_torchrun.py (written like pytorch/examples' DDP tutorial:
    its own init_process_group, reading RANK / LOCAL_RANK) unchanged: srun runs it through
    `distkit launch` (SLURM's variables mapped to torchrun's, one rank per task, no nested
    spawn), exit 0: the rank ends as distkit.launch.script_worker.leave says, without the gloo
    abort at exit that plain runs of this script show (the template's SCRIPT line is
    checked by test_foreign_code.py::test_templates_launch_a_script_when_asked)."""
    import torch
    from courses import tutorial

    tutorial(tmp_path)
    out = slurm_cluster.srun(["-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "distkit",
                              "launch", "multigpu_torchrun.py", "2", "1"],
                             cwd=tmp_path, env=job_env(), timeout=280)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    for rank in (0, 1):
        assert out.stdout.count(f"[RANK{rank}] Epoch 1 | Batchsize: 32 | Steps: 4") == 1, out.stdout
    assert torch.load(tmp_path / "snapshot.pt", weights_only=True)["EPOCHS_RUN"] == 1


def _results(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/results.json"))]


def test_srun_resumes_its_own_checkpoint(slurm_cluster, tmp_path):
    """A job step stopped by --max-iters, then the same step again with --resume-from
    latest: it resumes at the world size it was written with (srun sets SLURM_NTASKS, not
    WORLD_SIZE) and ends with the uninterrupted run's weights, bit for bit."""
    import torch

    common = ["-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "distkit", "train",
              *TINY, "--epochs", "2", "--checkpoint-every", "4"]

    def step(folder, *args):
        out = slurm_cluster.srun([*common, "--output-dir", str(tmp_path / folder), *args],
                                 cwd=tmp_path, env=job_env(), timeout=240)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return _results(tmp_path / folder)[-1]

    whole = step("whole")
    first = step("parts", "--max-iters", "6")
    assert first["iterations"] == 6
    resumed = step("parts", "--resume-from", "latest")
    assert resumed["iterations"] == whole["iterations"]

    def weights(results):
        return torch.load(results["last_checkpoint"], map_location="cpu", weights_only=True)["model"]

    a, b = weights(whole), weights(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a), "the resumed job step ends elsewhere"


def test_a_job_of_two_tasks_resumed_with_one_task(slurm_cluster, tmp_path):
    """A job step of 2 tasks stopped mid-epoch, then the job submitted again with 1 task and
    --resume-from latest (a job that comes back with less): it reshards the checkpoint, says
    so in results.json and ends within the layout's rounding of the uninterrupted job
    (docs/resume.md, tests/checkpoint/test_resume_layout.py)."""
    import torch

    def step(folder, ntasks, *args):
        out = slurm_cluster.srun(["-n", str(ntasks), "--kill-on-bad-exit=1", sys.executable, "-m",
                                  "distkit", "train", *TINY, "--epochs", "2", "--checkpoint-every", "4",
                                  "--output-dir", str(tmp_path / folder), *args],
                                 cwd=tmp_path, env=job_env(), timeout=240)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return _results(tmp_path / folder)[-1]

    whole = step("whole", 2)
    first = step("parts", 2, "--max-iters", "6")
    resumed = step("parts", 1, "--resume-from", "latest")
    assert (resumed["world_size"], resumed["nnodes"]) == (1, 1)
    assert resumed["resumed_from"]["checkpoint"] == first["last_checkpoint"]
    assert (resumed["resumed_from"]["iteration"], resumed["resumed_from"]["world_size"]) == (6, 2)
    assert resumed["iterations"] == whole["iterations"]
    a, b = (torch.load(r["last_checkpoint"], map_location="cpu", weights_only=True)["model"]
            for r in (whole, resumed))
    assert max((a[n] - b[n]).abs().max().item() for n in a) <= 5e-3
    assert abs(resumed["final"]["val_accuracy"] - whole["final"]["val_accuracy"]) <= 0.01
    assert abs(resumed["final"]["val_loss"] / whole["final"]["val_loss"] - 1) <= 0.02


LONGER = ["--epochs", "3", "--no-progress", "--dataset", "synthetic", "--dataset-size", "1536"]


def _submit(cluster, folder: Path, *extra) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return cluster.sbatch(["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                           str(REPO_ROOT / "scripts" / "slurm.sbatch"), *LONGER, *extra],
                          cwd=folder, env=job_env(CHECKPOINT_EVERY=5))


def _wait_for_checkpoint(folder: Path, job: str, cluster, timeout_s: float = 180) -> Path:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(folder.glob(f"runs/slurm-{job}/*/checkpoints/training_checkpoint_*.pt"))
        if found:
            return found[0]
        assert cluster.job(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING"), \
            next(folder.glob(f"*-{job}.out")).read_text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"no checkpoint from job {job} after {timeout_s:.0f} s")


def _final_model(folder: Path, job: str):
    import torch

    runs = _results(folder / "runs" / f"slurm-{job}")
    finished = [r for r in runs if r.get("epochs_completed") == 3]
    assert finished, f"no finished run in {folder}: {runs}"
    return torch.load(folder / finished[-1]["last_checkpoint"], map_location="cpu",  # relative
                      weights_only=True)["model"]


def test_a_requeued_job_resumes_by_itself_and_ends_where_an_uninterrupted_one_ends(
        slurm_cluster, tmp_path):
    import torch

    whole = _submit(slurm_cluster, tmp_path / "whole")
    requeued = _submit(slurm_cluster, tmp_path / "requeued")
    assert slurm_cluster.wait(whole, timeout_s=280)["JobState"] == "COMPLETED"
    _wait_for_checkpoint(tmp_path / "requeued", requeued, slurm_cluster)
    slurm_cluster.requeue(requeued)
    info = slurm_cluster.wait(requeued, timeout_s=280)
    log = next((tmp_path / "requeued").glob(f"*-{requeued}.out")).read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log[-3000:]
    # the log holds both attempts (appended, not truncated) and the kit's stop line
    assert log.count("+ srun --kill-on-bad-exit=1") == 2, log[-3000:]
    assert "distkit: stopped by SIGTERM" in log, log[-3000:]
    a, b = _final_model(tmp_path / "whole", whole), _final_model(tmp_path / "requeued", requeued)
    assert all(torch.equal(a[n], b[n]) for n in a), "the requeued job ends elsewhere"


def test_scancel_term_leaves_a_checkpoint_and_one_line(slurm_cluster, tmp_path):
    job = _submit(slurm_cluster, tmp_path)
    _wait_for_checkpoint(tmp_path, job, slurm_cluster)
    done = slurm_cluster.run(["scancel", "--signal=TERM", job])  # to the tasks, as preemption
    assert done.returncode == 0, done.stderr
    info = slurm_cluster.wait(job, timeout_s=120)
    log = next(tmp_path.glob(f"*-{job}.out")).read_text()
    lines = [ln for ln in log.splitlines() if ln.startswith("distkit: stopped by SIGTERM")]
    assert len(lines) == 1, log[-3000:]
    assert "--resume-from" in lines[0]
    # the job's code is the stop's (requeue-able), not a failure's 200 (docs/failures.md)
    assert info["ExitCode"] == "143:0", (info, log[-3000:])


# --------------------------------------------------------------------------------------
# A failure and a stop end with different codes under srun (docs/failures.md)
# --------------------------------------------------------------------------------------

# Drawn from a seed, not by Hypothesis: a job step costs half a minute, and Hypothesis's
# first example of a run is always the simplest one (here: no delay, the first rank).
SEED = int(os.environ.get("DISTKIT_SLURM_SEED") or random.randrange(2 ** 32))
print(f"test_slurm: DISTKIT_SLURM_SEED={SEED}")
REPLAY = f"replay with: DISTKIT_SLURM_SEED={SEED} python -m pytest tests/launch/test_slurm.py -m slow -k codes"

FAILING_TASK = '''
import torch.nn as nn
import ignite.distributed as idist
from distkit import Task
from distkit.builtin.data import get_datasets


class Breaks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if idist.get_rank() == RANK and self.calls == CALL:
            raise ValueError("the course's model broke")
        return self.fc(x)


task = Task(datasets=get_datasets, model=lambda config: Breaks())
'''

FAILING_SCRIPT = '''
import time
import torch.distributed as dist
dist.init_process_group("gloo")
for step in range(1, 1000):
    if dist.get_rank() == RANK and step == CALL:
        raise ValueError("the script broke")
    dist.barrier()
    time.sleep(0.05)
'''

LONG_SCRIPT = '''
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("script started", flush=True)
for step in range(400):
    dist.barrier()
    time.sleep(0.05)
dist.destroy_process_group()
'''



@pytest.mark.parametrize("draw", range(2))
def test_codes_a_failure_under_srun_exits_200_whatever_the_other_task_does(slurm_cluster, tmp_path, draw):
    """One task fails (a course task's forward raises under distkit train; a script raises
    under distkit launch); srun --kill-on-bad-exit=1 then sends SIGTERM to the other,
    which stops (143) or loses its peer (200). srun reports the highest task code, and a
    task ended by the signal itself over any code: the job step must exit 200, with no
    task ended by a signal, and one error line naming the failed rank."""
    rng = random.Random(f"{SEED}-{draw}")
    case = {"command": rng.choice(["train", "launch"]), "rank": rng.randrange(2),
            "call": rng.randint(1, 4)}
    print(f"case {case}; {REPLAY}")
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # a folder per drawn case
    source = FAILING_TASK if case["command"] == "train" else FAILING_SCRIPT
    (folder / "failing.py").write_text(source.replace("RANK", str(case["rank"]))
                                       .replace("CALL", str(case["call"])))
    args = (["train", "--task", "failing.py:task", "--epochs", "1", "--no-progress",
             "--output-dir", "runs"] if case["command"] == "train" else ["launch", "failing.py"])
    out = slurm_cluster.srun(["-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "distkit",
                              *args, "--timeout", "30"], cwd=folder, env=job_env(), timeout=280)
    said = (out.stdout + out.stderr)[-3000:]
    print(f"srun exit {out.returncode}")
    assert out.returncode == 200, said
    assert re.search(r"tasks? [\d,-]+: Exited with exit code 200", out.stderr), said
    assert not TASKS_ENDED_BY_A_SIGNAL.search(out.stderr), said
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("distkit: error: ")]
    assert errors and errors[0].startswith(f"distkit: error: rank {case['rank']} "), said
    assert "ValueError" in errors[0], said
    # the traceback is where the run's output goes (a folder every node of a shared file
    # system reaches), not in the node's temporary folder
    named = Path(re.search(r"full traceback in (\S+?\.txt)", errors[0]).group(1))
    (traceback_file,) = (folder / "runs").glob(f"*/tracebacks/rank{case['rank']}.txt")
    assert (folder / named if not named.is_absolute() else named) == traceback_file, said
    assert "ValueError" in traceback_file.read_text()


@pytest.mark.parametrize("draw", range(2))
def test_codes_a_stop_under_srun_exits_128_plus_its_signal(slurm_cluster, tmp_path, draw):
    """``scancel --signal`` to a running job step at a drawn moment after its tasks have
    started (while torch loads, during the rendezvous, in training): the step exits
    128 + the signal (a stop, requeue-able) or 0 (it had finished), never 200 and no task
    ended by the signal itself; a stop says so in a line of its own."""
    import signal as signals_module

    rng = random.Random(f"{SEED}-{draw}")
    case = {"command": rng.choice(["train", "launch"]), "signal": rng.choice(["TERM", "USR1", "HUP"]),
            "after_s": round(rng.uniform(0, 12), 1)}
    print(f"case {case}; {REPLAY}")
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # a folder per drawn case
    name = f"distkit-stop-{random.randrange(10 ** 9)}"
    if case["command"] == "train":
        args = ["train", "--epochs", "3", "--no-progress", "--dataset", "synthetic",  # ~30 s
                "--dataset-size", "16384", "--checkpoint-every", "50", "--output-dir", "runs"]
    else:
        (folder / "long.py").write_text(LONG_SCRIPT)
        args = ["launch", "long.py"]
    proc = subprocess.Popen(["srun", "-n", "2", "--kill-on-bad-exit=1", "-J", name, sys.executable,
                             "-m", "distkit", *args], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**slurm_cluster.env, **job_env()})
    try:
        started = proc.stdout.readline()  # a task's first line: its process has started
        time.sleep(case["after_s"])
        sent = slurm_cluster.run(["scancel", f"--signal={case['signal']}", f"--name={name}"])
        assert sent.returncode == 0, sent.stderr
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (started + stdout + stderr)[-3000:]
    code = 128 + getattr(signals_module, f"SIG{case['signal']}")
    if case["command"] == "launch" and case["signal"] == "HUP":
        code = 143  # distkit launch stops on SIGHUP as on SIGTERM (docs/launch.md)
    print(f"srun exit {proc.returncode}")
    assert proc.returncode in (0, code), said
    assert not TASKS_ENDED_BY_A_SIGNAL.search(stderr), said
    assert "distkit: error" not in stderr, said
    if proc.returncode == code:
        stops = [ln for ln in stderr.splitlines()
                 if ln.startswith((f"distkit: stopped by SIG{case['signal']}",
                                   f"distkit: got SIG{case['signal']}"))]
        assert stops, said
        print(stops[0])
