"""Course code written the way courses write it, shared by the tests that train it under
every launcher (tests/tasks, tests/launch/test_slurm.py): a course's own task module, and
the foreign code of tests/foreign (a headline classifier, pytorch/examples' tutorial)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

FOREIGN = Path(__file__).resolve().parent / "foreign"
sys.path.insert(0, str(FOREIGN))
import headlines  # noqa: E402  (tests/foreign: the course's own module)

COURSE = '''
"""A course's task: nothing here knows about ranks or processes."""
import torch
import torch.nn as nn
from ignite.metrics import MeanSquaredError
from torch.utils.data import TensorDataset

from distkit import Task


def make_datasets(config):
    g = torch.Generator().manual_seed(config.seed)
    x = torch.randn(320, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(320, 1, generator=g)
    return TensorDataset(x[:256], y[:256]), TensorDataset(x[256:], y[256:])


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def make_model(config):
    return MLP()


def make_metrics():
    return {"mse": MeanSquaredError()}


task = Task(datasets=make_datasets, model=make_model, loss=nn.MSELoss,
            metrics=make_metrics, score=("mse", "min"))
'''

# 256 samples, global batch 32: 8 iterations per epoch
TRAIN = ["--epochs", "2", "--batch-size", "32", "--lr", "0.05", "--no-progress"]


def write_course(folder):
    (folder / "course.py").write_text(COURSE)
    return folder / "course.py"


def results_under(folder) -> dict:
    (path,) = folder.glob("*/results.json")
    return json.loads(path.read_text())


def assert_course_results(res, world_size, nnodes=1):
    assert res["world_size"] == world_size and res["nnodes"] == nnodes
    assert res["task"]["score"] == ["mse", "min"]
    assert res["task"]["loss"] == "MSELoss"
    assert set(res["final"]) >= {"val_mse", "val_loss", "train_loss"}
    assert "val_accuracy" not in res["final"]
    assert [h["epoch"] for h in res["history"]] == [1, 2]
    # MSELoss and MeanSquaredError measure the same thing on the same validation set
    assert res["final"]["val_mse"] == pytest.approx(res["final"]["val_loss"], rel=1e-5)
    assert res["history"][-1]["val_mse"] < res["history"][0]["val_mse"], "it did not learn"
    assert res["replicas_identical"]
    assert res["best_model"] and "mse" in res["best_model"]


def assert_one_cycle_reached_its_peak(res, iterations=12):
    trace = res["lr_trace"]
    assert trace["every"] == 1 and trace["first_iteration"] == 1 and len(trace["lr"]) == iterations
    lrs = trace["lr"]
    assert lrs[0] == pytest.approx(headlines.MAX_LR / 25), "OneCycleLR starts at max_lr / 25"
    assert max(lrs) == pytest.approx(headlines.MAX_LR) and lrs.index(max(lrs)) == 2, lrs
    assert lrs[-1] < headlines.MAX_LR / 100, "annealed by the end of the run it was built for"
    assert res["lr_scheduler"] == "OneCycleLR" and res["scheduler_step"] == "iteration"
    # each epoch's lr: what its last iteration trained at
    per_epoch = len(lrs) // len(res["history"])
    assert [h["lr"] for h in res["history"]] == pytest.approx(lrs[per_epoch - 1::per_epoch])


def tutorial(folder: Path) -> Path:
    for name in ("multigpu_torchrun.py", "datautils.py"):
        shutil.copy(FOREIGN / name, folder / name)
    return folder / "multigpu_torchrun.py"
