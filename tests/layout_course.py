"""A course task for the resume-on-another-layout tests (tests/checkpoint/test_resume_layout.py): the
course task of tests/preemption_course.py (dict batches padded per batch, dropout, AdamW,
its own per-iteration lr schedule, its own early stopping and best model on accuracy)
whose samples carry their index, and a handler that records, at every iteration, the
indices this rank trained: one JSON line per iteration in
``<output_dir>/batches-<pid>.json``, so a test can rebuild each global batch over the
ranks. ``--task layout_course:task`` (tests/ on the path).
"""
from __future__ import annotations

import json
import os

import ignite.distributed as idist
import torch
from ignite.engine import Events

from distkit import Task
from preemption_course import Sequences, adamw, model, pad_batch, per_iteration_schedule, prepare_batch

TRAIN_SIZE = 96  # divides by 1, 2, 3 and 4: no sampler pads, so every global batch is exact


class Indexed(Sequences):
    def __getitem__(self, i):
        return {**self.samples[i], "index": i}


def datasets(config):
    return Indexed(TRAIN_SIZE, config.seed), Sequences(48, config.seed + 1)


def collate(samples):
    batch = pad_batch(samples)
    if "index" in samples[0]:
        batch["index"] = torch.tensor([s["index"] for s in samples])
    return batch


def handlers(trainer, evaluator, config):
    path = os.path.join(config.output_dir, f"batches-{os.getpid()}.json")

    @trainer.on(Events.ITERATION_COMPLETED)
    def record(engine):
        with open(path, "a") as f:
            f.write(json.dumps({"iteration": engine.state.iteration, "rank": idist.get_rank(),
                                "world_size": idist.get_world_size(),
                                "indices": engine.state.batch["index"].tolist()}) + "\n")


def global_batches(output_dir) -> dict:
    """``{iteration: sorted sample indices over every rank}`` of the runs recorded under
    ``output_dir``."""
    from pathlib import Path

    batches = {}
    for path in Path(output_dir).glob("batches-*.json"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            batches.setdefault(entry["iteration"], []).extend(entry["indices"])
    return {it: sorted(ix) for it, ix in batches.items()}


task = Task(datasets=datasets, model=model, optimizer=adamw, collate_fn=collate,
            prepare_batch=prepare_batch, lr_scheduler=per_iteration_schedule,
            score=("accuracy", "max"), handlers=handlers)
