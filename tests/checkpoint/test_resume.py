"""A run stopped at iteration k and resumed from its checkpoint ends with bit-identical
parameters to an uninterrupted run (2 gloo processes, CPU)."""
from __future__ import annotations

import pytest
import torch

from distkit.launch.entry import run


def final_weights(results):
    ckpt = torch.load(results["last_checkpoint"], map_location="cpu", weights_only=True)
    return ckpt["model"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interrupted_and_resumed_equals_uninterrupted(fast_config):
    epochs, stop_at = 3, 30  # 23 iterations per epoch: stop in the middle of epoch 2
    whole = run(fast_config(nproc_per_node=2, epochs=epochs))
    first = run(fast_config(nproc_per_node=2, epochs=epochs, max_iters=stop_at))
    assert first["iterations"] == stop_at
    assert first["last_checkpoint"].endswith(f"_{stop_at}.pt")
    resumed = run(fast_config(nproc_per_node=2, epochs=epochs, resume_from=first["last_checkpoint"]))

    assert resumed["iterations"] == whole["iterations"] == 23 * epochs
    assert resumed["run_dir"] != first["run_dir"], "a resumed run writes a fresh folder"
    a, b = final_weights(whole), final_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    # And the check can fail: the interrupted run's weights are not the final ones.
    c = final_weights(first)
    assert any(not torch.equal(a[n], c[n]) for n in a)


# --- the world layout of an srun job step (issue 30: every resume under SLURM was refused) --

from support import subprocess_env  # noqa: E402
from distkit.lessons.multinode import clean_env, slurm_env  # noqa: E402

TINY_TRAIN = ["--dataset", "synthetic", "--dataset-size", "256", "--model", "mlp", "--epochs", "2",
              "--batch-size", "32", "--no-progress", "--timeout", "60"]


def test_layout_of_real_srun_and_torchrun_tasks(tmp_path):
    """Each process reads its own variables: two srun tasks on one node, one torchrun rank."""
    import json
    import subprocess
    import sys

    code = "import json, distkit.host.layout as m; print(json.dumps(m.world_layout()._asdict()))"
    envs = [clean_env(**slurm_env(procid=i, ntasks=4, localid=i, nnodes=2, nodeid=0),
                      SLURM_TASKS_PER_NODE="2(x2)") for i in range(2)]
    envs.append(clean_env(RANK=5, LOCAL_RANK=1, WORLD_SIZE=8, LOCAL_WORLD_SIZE=4, GROUP_RANK=1))
    envs.append(clean_env(SLURM_JOB_ID=9, SLURM_NTASKS=2))  # the batch script: not a step
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for env in envs]
    got = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    key = ("rank", "local_rank", "world_size", "local_world_size", "nnodes", "node_rank", "launcher")
    assert [tuple(g[k] for k in key) for g in got] == [
        (0, 0, 4, 2, 2, 0, "slurm"), (1, 1, 4, 2, 2, 0, "slurm"),
        (5, 1, 8, 4, 2, 1, "torchrun"), (0, 0, 1, 1, 1, 0, "none")]


def test_train_in_a_batch_script_without_srun_is_told_so(tmp_path):
    import subprocess
    import sys
    import time

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "distkit", "train", *TINY_TRAIN], cwd=tmp_path,
                          env=clean_env(SLURM_JOB_ID=4243, SLURM_JOBID=4243, SLURM_NTASKS=2,
                                        SLURM_NNODES=1), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "not a job step" in done.stderr and "srun python -m distkit train" in done.stderr
    assert time.monotonic() - start < 60  # not after a 121-second rendezvous timeout
    assert not (tmp_path / "runs").exists()
