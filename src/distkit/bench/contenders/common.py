"""What every contender script shares: the task and the record it leaves.

The task is the kit's default: scikit-learn's digits (the same fixed split as
``distkit.builtin.data.split``), the kit's ``SmallCNN`` with the same seed, SGD (lr 0.05,
momentum 0.9, weight decay 1e-4) with the lr decaying linearly to 0 over the run, a
``DistributedSampler`` reshuffled every epoch, the GLOBAL batch split over the
processes, validation accuracy after every epoch. Each process uses cores / processes
torch threads, the kit's rule. A script imports only torch, scikit-learn, its own
framework and ``distkit.builtin.models`` (plain ``nn.Module`` code).

Rank 0 writes ``--out``: the Unix time its first optimizer step ended, every epoch's
training time (validation excluded), the samples per epoch, the final accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.utils.data import TensorDataset

VAL_SIZE = 360


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--out", required=True, help="rank 0's record (JSON)")
    return p.parse_args()


def pin_threads(local_world_size: int) -> int:
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, local_world_size))
    torch.set_num_threads(threads)
    return threads


def datasets(seed: int = 0):
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train, val = perm[VAL_SIZE:], perm[:VAL_SIZE]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def model(seed: int = 0):
    from distkit.builtin.models import SmallCNN

    torch.manual_seed(seed)
    return SmallCNN()


def optimizer(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)


def linear_decay(opt, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1.0 - step / total_steps))


class Record:
    """Timings rank 0 writes at the end."""

    def __init__(self):
        self.first_step_unix_s = None
        self.epoch_times_s = []
        self.samples_per_epoch = 0
        self.final_val_accuracy = None

    def step_done(self):
        if self.first_step_unix_s is None:
            self.first_step_unix_s = time.time()

    def write(self, path, rank, **extra):
        if rank != 0:
            return
        with open(path + ".tmp", "w") as f:
            json.dump({**vars(self), **extra}, f)
        os.replace(path + ".tmp", path)


def leave() -> None:
    """Exit 0 without Python's finalization, output flushed. A gloo DDP script can abort
    at exit after it succeeded (its group's worker thread needs the GIL while
    ``Py_FinalizeEx`` runs: std::terminate, SIGABRT); the reasons are in
    ``distkit.launch.script_worker.leave``. A contender that aborted was a failed attempt, and the
    tiny benchmark lost both attempts of the hand-written loop to it once in CI."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
