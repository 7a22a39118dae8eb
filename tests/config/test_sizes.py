"""Sizes checked before start (issue 31): a global batch larger than the training set, an
empty training or validation set (a course task's too), a world larger than the training
set: refused in one line, through the real command line, before any process starts, with
no run folder left; far more processes than cores: a warning with a memory estimate."""
from __future__ import annotations

import time

import pytest

from support import assert_one_line_error, within_seconds


WITHIN = 30  # seconds on a quiet machine, stretched by the load (within_seconds)

TASKS = '''
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset
from distkit import Task


def _pair(n_train, n_val):
    x = torch.randn(n_train + n_val, 4)
    y = torch.randint(0, 2, (n_train + n_val,))
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def no_train(config):
    return _pair(0, 8)


def no_val(config):
    return _pair(64, 0)


def three(config):
    return _pair(3, 8)


def model(config):
    return nn.Linear(4, 2)


empty_train = Task(datasets=no_train, model=model, name="empty-train")
empty_val = Task(datasets=no_val, model=model, name="empty-val")
tiny = Task(datasets=three, model=model, name="tiny")
'''


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "sized_tasks.py"
    path.write_text(TASKS)
    return path


@pytest.mark.parametrize("args, words", [
    (["--batch-size", "4096"],
     ["global --batch-size 4096 is larger than the training set of 'digits/cnn' (1437 samples)",
      "use --batch-size 1436 or less"]),
    (["--task", "{tasks}:empty_train"], ["the training set of 'empty-train' is empty"]),
    (["--task", "{tasks}:empty_val"], ["the validation set of 'empty-val' is empty"]),
    (["--task", "{tasks}:tiny", "--nproc-per-node", "4", "--batch-size", "4"],
     ["the world size 4 is larger than the training set of 'tiny' (3 samples)", "3 processes"]),
    (["--task", "{tasks}:tiny", "--nproc-per-node", "1", "--batch-size", "8"],
     ["global --batch-size 8 is larger than the training set of 'tiny' (3 samples)"]),
], ids=["batch-4096", "empty-train", "empty-val", "world-4-on-3", "batch-8-on-3"])
def test_sizes_are_refused_before_start(run_cli, tmp_path, tasks_file, args, words):
    args = [a.format(tasks=tasks_file) for a in args]
    started = time.monotonic()
    result = run_cli("train", "--output-dir", tmp_path / "runs", *args, timeout=within_seconds(WITHIN) + 30)
    assert time.monotonic() - started < within_seconds(WITHIN)
    assert_one_line_error(result, *words, tmp_path=tmp_path)
    assert not (tmp_path / "runs").exists()


def test_far_more_processes_than_cores_warn_with_a_memory_estimate(run_cli, tmp_path):
    """64 processes on this machine's cores: one warning line with the memory estimate
    (and here a refused batch, so nothing starts)."""
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--nproc-per-node", 64,
                     "--batch-size", 4096, timeout=within_seconds(WITHIN) + 30)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("distkit: warning: --nproc-per-node 64 on "), lines[0]
    assert "GiB of memory (64 x " in lines[0] and "GiB available" in lines[0], lines[0]
    assert_one_line_error(result, "--batch-size 4096", tmp_path=tmp_path)


def test_oversubscription_threshold():
    from distkit.launch.checks import OVERSUBSCRIBED, oversubscription_warning

    assert oversubscription_warning(OVERSUBSCRIBED * 2, cores=2) is None
    assert oversubscription_warning(9, cores=2).startswith("--nproc-per-node 9 on 2 cores: 4 ")
    assert oversubscription_warning(None) is None


def test_sizes_that_fit_pass(tasks_file, monkeypatch):
    """The checks can pass: the same tiny task with a batch and world that fit."""
    import sys

    from distkit.config import Config
    from distkit.launch.checks import check_sizes

    monkeypatch.syspath_prepend(str(tasks_file.parent))
    try:
        check_sizes(Config(task="sized_tasks:tiny", batch_size=3), world_size=3)
        check_sizes(Config(batch_size=1436), world_size=2)
    finally:
        sys.modules.pop("sized_tasks", None)
