"""Unit tests of launch, training helpers, plots and doctor (no processes spawned)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from distkit.config import Config
from distkit.errors import DistkitError
from distkit.launch.entry import describe_process_failure
from distkit.launch.checks import default_nproc, preflight, resolve_backend
from distkit.checkpoint.saver import make_run_dir
from distkit.host.facts import check_port_free, free_port, threads_per_process
from distkit.train.training import create_lr_scheduler, peak_lr


def test_auto_backend_on_this_cpu_machine_is_gloo_with_two_processes():
    assert not torch.cuda.is_available()  # the CI machine has no GPU
    assert resolve_backend("auto") == "gloo"
    assert default_nproc("gloo") == 2
    assert default_nproc("none") == 1


def test_preflight_fills_in_backend_processes_and_a_free_port():
    cfg, launch = preflight(Config(), spawning=True)
    assert (cfg.backend, cfg.nproc_per_node) == ("gloo", 2)
    assert (launch.backend, launch.nproc_per_node, launch.world_size) == ("gloo", 2, 2)
    check_port_free(launch.master_port)  # does not raise: the port it chose is free
    assert cfg.master_port is None  # the port is the launch's, not a setting of the run


def test_launch_checks_need_no_training_settings():
    """launch_function and run_per_rank have no global batch: the launch checks do not
    ask for one (a batch of 64 does not divide by 3 processes)."""
    from distkit.launch.checks import check_launch

    launch = check_launch(Config(backend="gloo", nproc_per_node=3).validate_processes(),
                          spawning=True)
    assert (launch.world_size, launch.spawning) == (3, True) and launch.master_port
    with pytest.raises(DistkitError, match="does not divide"):
        Config(backend="gloo", nproc_per_node=3).validate()  # a training run must split it


def test_preflight_does_not_change_the_callers_config():
    original = Config()
    preflight(original, spawning=True)
    assert original.backend == "auto" and original.nproc_per_node is None


def test_port_in_use_is_reported():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        with pytest.raises(DistkitError, match="in use"):
            check_port_free(s.getsockname()[1])
    assert 1024 <= free_port() <= 65535


def test_threads_split_the_cores_between_processes():
    cores = len(os.sched_getaffinity(0))
    assert threads_per_process(1) == cores
    assert threads_per_process(cores) == 1
    assert threads_per_process(4 * cores) == 1  # never zero


def test_run_dirs_are_never_reused(tmp_path):
    dirs = {make_run_dir(str(tmp_path), "gloo", 2) for _ in range(3)}
    assert len(dirs) == 3
    assert all("gloo-2procs" in d and os.path.isdir(d) for d in dirs)


def test_linear_scaling_rule_and_warmup():
    cfg = Config(lr=0.1, scale_lr=True, warmup_epochs=1, epochs=2)
    assert peak_lr(cfg, 4) == pytest.approx(0.4)
    assert peak_lr(cfg.replace(scale_lr=False), 4) == pytest.approx(0.1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = create_lr_scheduler(cfg, opt, epoch_length=10)  # world size 1 outside a launch
    from ignite.engine import Engine, Events

    lrs = []
    engine = Engine(lambda e, b: lrs.append(opt.param_groups[0]["lr"]))
    engine.add_event_handler(Events.ITERATION_STARTED, sched)
    engine.run([0] * 10, max_epochs=2)
    # warm-up 0 -> 0.1 over the first epoch (10 steps), then linear decay towards 0
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.05) and lrs[10] == pytest.approx(0.1)
    assert lrs[15] == pytest.approx(0.05) and lrs[19] == pytest.approx(0.01)


def test_process_failures_become_one_line_naming_the_rank():
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    killed = ProcessExitedException("x", error_index=1, error_pid=9, exit_code=-9, signal_name="SIGKILL")
    assert "rank 3 (local rank 1) was killed by SIGKILL" in str(describe_process_failure(killed, 1, 2))
    raised = ProcessRaisedException(
        "\n-- Process 0 terminated with the following error:\nTraceback ...\n"
        "distkit.errors.DistkitError: dataset 'mnist' is not here: use --dataset digits", 0, 9)
    assert str(describe_process_failure(raised, 0, 2)) == \
        "rank 0: dataset 'mnist' is not here: use --dataset digits"
    # a CUDA error's message runs on with hints: the line named is the error's, not the last
    cuda = ProcessRaisedException(
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "/x/torch/multiprocessing/spawn.py", line 90, in _wrap\n    fn(i, *args)\n'
        '  File "/x/torch/cuda/__init__.py", line 638, in set_device\n    torch._C._cuda_setDevice(device)\n'
        "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n", 1, 9)
    assert str(describe_process_failure(cuda, 0, 2)) == \
        "rank 1 (local rank 1) failed: torch.AcceleratorError: CUDA error: invalid device ordinal"
    assert describe_process_failure(ValueError("plain"), 0, 2) is None


def test_learning_curves_figure():
    from distkit.observe.plots import learning_curves

    hist = [{"epoch": e, "train_loss": 1 / e, "val_loss": 1 / e, "val_accuracy": 1 - 1 / e}
            for e in (1, 2, 3)]
    fig = learning_curves([{"backend": "gloo", "world_size": 2, "history": hist}])
    assert len(fig.axes) == 3 and len(fig.axes[0].lines) == 1


def test_doctor_reports_and_recommends(tmp_path):
    from support import within_seconds

    out = subprocess.run([sys.executable, "-m", "distkit", "doctor", "--json"],
                         capture_output=True, text=True, timeout=within_seconds(60), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["cores"] >= 1 and info["cuda_available"] is False and "gloo" in info["backends"]
    assert info["recommended"]["command"] == "distkit train --backend gloo --nproc-per-node 2"


def test_early_stopping_and_best_model_judge_the_evaluators_metrics(tmp_path):
    """Both are attached to the evaluator's COMPLETED event and read its metrics: they
    work whatever order the trainer's epoch handlers run in."""
    import os

    from distkit.train.training import training

    cfg = Config(backend="none", model="mlp", epochs=4, progress_bar=False,
                 output_dir=str(tmp_path), early_stopping_patience=1,
                 early_stopping_min_delta=100.0)  # no epoch can improve by 100: stop after 2
    results = training(0, cfg)
    assert results["epochs_completed"] == 2
    best = results["best_model"]
    assert os.path.exists(best) and os.path.dirname(best).endswith("best")
    first_loss = results["history"][0]["val_loss"]  # the best of two epochs, by val loss
    # named by the loss as measured, not by ignite's signed score (once best_model_loss=-0.0871.pt)
    assert os.path.basename(best) == f"best_model_loss={min(first_loss, results['final']['val_loss']):.4f}.pt"


def test_the_summary_of_a_run_that_ended_inside_its_first_epoch_has_no_nan():
    # --max-iters 8 on a 12-step epoch: no epoch ended, so there is no time per epoch
    from distkit.observe.reporting import run_summary

    text = run_summary({"backend": "gloo", "world_size": 2, "nnodes": 1, "device": "cpu",
                        "final": None, "epochs_completed": 0, "iterations": 8,
                        "seconds_per_epoch": None, "samples_per_second": 2953.0, "run_dir": "runs/x"})
    assert "nan" not in text
    assert "no whole epoch ran (no time per epoch)  2953 samples/s (end to end)" in text.splitlines()
