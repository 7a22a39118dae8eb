"""A course's own task, written the way a course writes it, for the stop-and-resume tests
(tests/train/test_preemption.py): variable-length token sequences as dict samples, padded per
batch by the task's collate_fn, dropout on the padded activations (so each rank's random
stream advances by a different amount every step), AdamW, a per-iteration lr schedule,
early stopping and the best model on validation accuracy, and a stateful handler of its
own (``Task.stateful``). ``--task preemption_course:task`` (tests/ on the path).

``--set step_sleep=0.05`` slows every step down, so a test's signal lands mid-epoch;
``--set nan_at=K --set nan_rank=R`` makes iteration K's loss NaN on rank R (-1: every rank).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Events
from ignite.handlers import LRScheduler
from torch.utils.data import Dataset

from distkit import Task

VOCAB, PAD = 40, 0


class Sequences(Dataset):
    """Sample i: ``{"tokens": LongTensor (length 3..14,), "label": 0 or 1}``; class 1's
    tokens come mostly from the upper half of the vocabulary."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.samples = []
        for i in range(n):
            label = i % 2
            length = int(torch.randint(3, 15, (1,), generator=g))
            upper = torch.rand(length, generator=g) < (0.7 if label else 0.3)
            tokens = torch.randint(1, VOCAB // 2, (length,), generator=g) + upper.long() * (VOCAB // 2 - 1)
            self.samples.append({"tokens": tokens, "label": label})

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def datasets(config):
    return Sequences(96, config.seed), Sequences(48, config.seed + 1)


def pad_batch(samples):
    """Pad to the longest sequence of this batch (not of the dataset)."""
    longest = max(len(s["tokens"]) for s in samples)
    tokens = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for row, s in enumerate(samples):
        tokens[row, :len(s["tokens"])] = s["tokens"]
    return {"tokens": tokens, "mask": tokens != PAD,
            "label": torch.tensor([s["label"] for s in samples])}


def prepare_batch(batch, device, non_blocking):
    x = {k: batch[k].to(device, non_blocking=non_blocking) for k in ("tokens", "mask")}
    return x, batch["label"].to(device, non_blocking=non_blocking)


class Classifier(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden, padding_idx=PAD)
        self.drop = nn.Dropout(0.3)  # its mask has the batch's padded shape
        self.out = nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.drop(self.embed(x["tokens"]))
        mask = x["mask"].unsqueeze(-1).float()
        out = self.out((h * mask).sum(1) / mask.sum(1))
        return out * float("nan") if POISON["loss"] else out


def model(config):
    return Classifier()


def adamw(params, config):
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.01)


def per_iteration_schedule(optimizer, config, epoch_length):
    if config.task_settings.get("schedule") == "epoch":  # a torch scheduler the kit steps per epoch
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    # a torch scheduler stepped at every iteration through ignite's wrapper
    return LRScheduler(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: 0.97 ** it))


class TokensSeen:
    """A stateful handler of the task's own: tokens trained on, counted per rank."""

    reshardable = False  # rank 0's count means nothing to another layout: resume refused
    def __init__(self):
        self.count = 0

    def __call__(self, engine):
        self.count += int(engine.state.batch["mask"].sum())

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = int(state["count"])


def stateful(trainer, evaluator, config):
    tokens = TokensSeen()
    trainer.add_event_handler(Events.ITERATION_COMPLETED, tokens)
    return {"tokens_seen": tokens}


POISON = {"loss": False}


def stop_here(trainer, evaluator):
    """``STOP_AT=POINT:N STOP_SIGNAL=TERM|HUP|KILL STOP_RANK=R`` (-1: every rank) in the
    environment: a real signal to this rank's own process at a named moment of the run's
    life (a test's stop moment, drawn by tests/train/test_stop_anywhere.py; the environment, not
    ``--set``, so the resumed run has the same task settings):

    - ``step:N``: as iteration N starts; ``checkpoint:N``: as iteration N completes,
      before the kit's handlers of that iteration (its checkpoint, its stop check);
    - ``validation:E``: after the first validation batch of epoch E; ``judged:E``: after
      epoch E's validation, early stopping and best model, before its schedule step;
    - ``epoch_end:E``: after epoch E's validation and schedule step, before its checkpoint;
    - ``reporting:0``: after the last epoch, while the run reports."""
    point, _, n = os.environ.get("STOP_AT", "").partition(":")
    rank = int(os.environ.get("STOP_RANK", "-1"))
    if not point or rank not in (-1, idist.get_rank()):
        return
    n, signum = int(n or 0), getattr(signal, "SIG" + os.environ.get("STOP_SIGNAL", "TERM"))

    def send(engine):
        os.kill(os.getpid(), signum)

    def in_epoch(engine):
        if trainer.state.epoch == n:
            send(engine)

    # Built for the named point only: ``once=0`` (reporting's N) is an error in ignite.
    where = {"step": lambda: (trainer, Events.ITERATION_STARTED(once=n), send),
             "checkpoint": lambda: (trainer, Events.ITERATION_COMPLETED(once=n), send),
             "validation": lambda: (evaluator, Events.ITERATION_COMPLETED(once=1), in_epoch),
             "judged": lambda: (evaluator, Events.COMPLETED, in_epoch),
             "epoch_end": lambda: (trainer, Events.EPOCH_COMPLETED(once=n), send),
             "reporting": lambda: (trainer, Events.COMPLETED, send)}
    engine, event, handler = where[point]()
    engine.add_event_handler(event, handler)


def handlers(trainer, evaluator, config):
    pause = float(config.task_settings.get("step_sleep", 0.0))
    if pause:
        trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda engine: time.sleep(pause))
    stop_here(trainer, evaluator)
    nan_at, nan_rank = int(config.task_settings["nan_at"]), int(config.task_settings["nan_rank"])
    if nan_at and nan_rank in (-1, idist.get_rank()):  # -1: every rank
        def poison(on):
            def handler(engine):
                POISON["loss"] = on
            return handler
        trainer.add_event_handler(Events.ITERATION_STARTED(once=nan_at), poison(True))
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=nan_at), poison(False))


task = Task(datasets=datasets, model=model, optimizer=adamw, collate_fn=pad_batch,
            prepare_batch=prepare_batch, lr_scheduler=per_iteration_schedule,
            score=("accuracy", "max"), handlers=handlers, stateful=stateful,
            settings={"step_sleep": 0.0, "nan_at": 0, "nan_rank": -1, "schedule": "iteration"})


def own_step(model, optimizer, loss, config):
    """A task's own step (the kit's, written out), for the runs that draw one."""
    def update(engine, batch):
        x, y = prepare_batch(batch, idist.device(), True)
        optimizer.zero_grad()
        value = loss(model(x), y)
        value.backward()
        optimizer.step()
        return value

    return update


task_own_step = dataclasses.replace(task, train_step=own_step, name="preemption_course:task_own_step")
task_trains_on = dataclasses.replace(task, stop_on_non_finite=False,
                                     name="preemption_course:task_trains_on")
