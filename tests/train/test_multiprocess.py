"""The unchanged training function in 2 real gloo processes: spawned by idist.Parallel,
and launched by torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import subprocess_env
from distkit.launch.entry import run


def check_results(res, world_size):
    assert res["backend"] == "gloo" and res["world_size"] == world_size
    assert len(res["replica_param_sha256"]["final"]) == world_size
    # Every replica started from, and ended with, bit-identical parameters.
    assert res["replicas_identical"], res["replica_param_sha256"]
    assert res["replica_param_sha256"]["initial"] != res["replica_param_sha256"]["final"]
    hist = res["history"]
    assert hist[-1]["val_loss"] < hist[0]["val_loss"]
    assert hist[-1]["val_accuracy"] > 0.5  # 10 classes: chance is 0.1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_spawn_two_gloo_processes(fast_config):
    res = run(fast_config(nproc_per_node=2, epochs=3))
    check_results(res, 2)
    # 1437 training digits on 2 ranks: DistributedSampler pads to 1438 (one sample twice).
    assert res["samples_trained"] == 3 * 1438
    with open(f"{res['run_dir']}/results.json") as f:
        assert json.load(f)["world_size"] == 2
    from pathlib import Path

    assert (Path(res["run_dir"]) / "learning_curves.png").stat().st_size > 1000
    assert res["last_checkpoint"].endswith(f"_{res['iterations']}.pt")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_two_processes_joins_the_launch(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=0", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
           "-m", "distkit", "train", "--epochs", "3", "--no-progress",
           "--output-dir", str(tmp_path / "runs")]
    out = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True,
                         text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    (results,) = (tmp_path / "runs").glob("*/results.json")
    res = json.loads(results.read_text())
    check_results(res, 2)
    assert "gloo-2procs" in results.parent.name
    # torchrun set the process count: distkit spawned nothing more.
    assert res["config"]["nproc_per_node"] is None
    assert out.stdout.count("final validation accuracy") == 1  # summary from rank 0 only
    # No --threads-per-process: each of the 2 processes takes half the cores, at least 1.
    assert res["threads_per_process"] == max(1, len(os.sched_getaffinity(0)) // 2)
