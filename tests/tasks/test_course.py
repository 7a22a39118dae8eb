"""A course's own task, from a module OUTSIDE the package (written to tmp_path): its own
MLP, a synthetic regression in a TensorDataset, MSELoss, ignite's MeanSquaredError as
"mse", score ("mse", "min"). Trained by the unchanged `distkit train --task` with spawn,
torchrun on one node and two torchrun "nodes" on 127.0.0.1; resumed bit-exactly. And a
foreign ignite-style training function under the kit's launcher, with a SIGKILLed rank.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from distkit.host.facts import free_port
from distkit.lessons import failure
from distkit.lessons.multinode import clean_env, log_tail, run_nodes, torchrun_node

from courses import TRAIN, assert_course_results, results_under, write_course

def cli(args, cwd, timeout=150):
    return subprocess.run([sys.executable, "-m", "distkit", "train", *map(str, args)], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_course_task_spawn_two_processes(tmp_path):
    write_course(tmp_path)
    out = cli(["--task", "course:task", "--nproc-per-node", "2", *TRAIN, "--profile",
               "--early-stopping-patience", "3", "--output-dir", tmp_path / "runs"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final validation mse" in out.stdout and "task course:task" in out.stdout
    res = results_under(tmp_path / "runs")
    assert_course_results(res, world_size=2)
    assert res["config"]["task"] == "course:task"
    assert res["profile"], "--profile works on a course task too"
    assert (tmp_path / "runs" / res["run_dir"].split("/")[-1] / "learning_curves.png").exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_course_task_torchrun_one_node_by_file_path(tmp_path):
    (tmp_path / "course").mkdir()  # not the working folder: found by its path alone
    course = write_course(tmp_path / "course")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "distkit", "train", "--task", f"{course}:task", *TRAIN,
           "--output-dir", str(tmp_path / "runs")]
    out = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                         timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_course_results(results_under(tmp_path / "runs"), world_size=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_course_task_on_two_torchrun_nodes(tmp_path):
    write_course(tmp_path)
    port = free_port()
    nodes = run_nodes([torchrun_node(r, 2, port, ["train", "--task", "course:task", *TRAIN,
                                                  "--output-dir", tmp_path / f"node{r}"])
                       for r in (0, 1)], timeout=240, cwd=tmp_path)
    for r, node in enumerate(nodes):
        assert node["returncode"] == 0, f"node {r}:\n{log_tail(node['output'], 30)}"
    assert_course_results(results_under(tmp_path / "node0"), world_size=2, nnodes=2)
    assert not list((tmp_path / "node1").glob("*/results.json")), "only rank 0 writes results"


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_course_task_resumes_bit_exactly(tmp_path):
    write_course(tmp_path)
    args = ["--task", "course:task", "--nproc-per-node", "2", *TRAIN]
    whole = cli([*args, "--output-dir", tmp_path / "whole"], cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut = cli([*args, "--max-iters", "11", "--output-dir", tmp_path / "cut"], cwd=tmp_path)
    assert cut.returncode == 0, cut.stderr[-3000:]
    first = results_under(tmp_path / "cut")
    assert first["iterations"] == 11 and first["last_checkpoint"].endswith("_11.pt")
    resumed = cli([*args, "--resume-from", first["last_checkpoint"], "--output-dir",
                   tmp_path / "resumed"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a, b = results_under(tmp_path / "whole"), results_under(tmp_path / "resumed")
    assert a["iterations"] == b["iterations"] == 16
    assert a["replica_param_sha256"]["final"] == b["replica_param_sha256"]["final"]
    assert b["final"]["val_mse"] == a["final"]["val_mse"]
    # the comparison can fail: the interrupted run's weights are not the final ones
    assert first["replica_param_sha256"]["final"] != a["replica_param_sha256"]["final"]


# --- a foreign training function, written for plain ignite --------------------------------

FOREIGN = '''
"""An ignite-style training function that knows nothing about distkit."""
import json
import os
import time

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events


def training(local_rank, config):
    def step(engine, batch):
        return idist.all_reduce(torch.tensor(float(batch))).item()

    engine = Engine(step)
    sums = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: sums.append(e.state.output))
    engine.run(range(config["n"]), max_epochs=1)
    if idist.get_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump({"world_size": idist.get_world_size(), "backend": idist.backend(),
                       "sums": sums, "threads": torch.get_num_threads(),
                       "omp": os.environ.get("OMP_NUM_THREADS")}, f)
    if config.get("then_sleep"):
        time.sleep(config["then_sleep"])
'''

LAUNCHER = '''
import sys
from distkit import DistkitError, launch_function
from foreign import training

if __name__ == "__main__":
    try:
        launch_function(training, {{"n": 4, "out": "out.json", "then_sleep": {sleep}}},
                        backend="gloo", nproc_per_node={nproc})
    except DistkitError as e:
        sys.exit(f"distkit: error: {{e}}")
'''


def write_foreign(folder, sleep=0, nproc=2):
    (folder / "foreign.py").write_text(FOREIGN)
    (folder / "launcher.py").write_text(LAUNCHER.format(sleep=sleep, nproc=nproc))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_foreign_training_function_under_the_kit_launcher(tmp_path):
    import os

    write_foreign(tmp_path)
    env = clean_env()
    env.pop("OMP_NUM_THREADS")  # the launcher must set it
    out = subprocess.run([sys.executable, "launcher.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["world_size"] == 2 and res["backend"] == "gloo"
    assert res["sums"] == [0.0, 2.0, 4.0, 6.0]  # each batch value all-reduced over 2 ranks
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert res["threads"] == share and res["omp"] == str(share)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkilled_rank_of_a_foreign_function_is_reported_in_one_line(tmp_path):
    write_foreign(tmp_path, sleep=120)
    proc = subprocess.Popen([sys.executable, "launcher.py"], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "out.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "out.json").exists(), "the function never ran"
        workers = failure.wait_for_workers(proc.pid, 2)
        failure.kill_rank(proc.pid, 1)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert re.match(r"distkit: error: rank 1 \(local rank 1\) was killed by SIGKILL", last), err[-2000:]
    assert "Traceback" not in err
    assert all(not _alive(pid) for pid in workers.values()), "a rank outlived the launch"


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return "zombie" not in open(f"/proc/{pid}/status").read().lower()
    except OSError:
        return False


# A course task through scripts/slurm.sbatch on a real SLURM cluster: tests/launch/test_slurm.py.
