"""distkit on a real one-node SLURM cluster (tests/slurm_cluster.py: Debian's slurm-wlm,
started and stopped by these tests as root): ``srun`` runs ``distkit train`` directly and
the kit's own ``scripts/slurm.sbatch`` is submitted with ``sbatch``."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from slurm_cluster import slurm_cluster  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TINY = ["--epochs", "1", "--no-progress", "--dataset", "synthetic", "--dataset-size", "256"]
PYTHON_DIR = os.path.dirname(sys.executable)


def job_env(**extra) -> dict:
    """What a user's shell has when they submit: this venv first on PATH, 1 thread a task."""
    return {"PATH": f"{PYTHON_DIR}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **{k: str(v) for k, v in extra.items()}}


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
    (results,) = (tmp_path / "runs" / f"slurm-{job}").glob("*/results.json")
    assert json.loads(results.read_text())["world_size"] == 2



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
