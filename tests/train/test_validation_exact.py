"""Validation counts every sample exactly once at any world size: 101 validation samples
(a size that divides by neither 2 nor 3) and a model with BatchNorm buffers, trained by
the unchanged ``training`` at 1, 2 and 3 processes. Each run's validation metrics equal
a plain 1-process evaluation of its own final checkpoint, and the samples counted are
101 (``idist.auto_dataloader``'s padding ``DistributedSampler`` counts 102)."""
from __future__ import annotations

import textwrap

import pytest
import torch

from distkit.builtin.data import EvenValidationBatches

VAL = 101

COURSE = '''
import torch
import torch.nn as nn
from ignite.metrics import Accuracy, Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from distkit import Task
from distkit.builtin.data import synthetic_dataset


class SampleCount(Metric):
    """How many validation samples the metrics saw, summed over the ranks."""

    @reinit__is_reduced
    def reset(self):
        self._count = torch.tensor(0.0, dtype=torch.float64, device=self._device)

    @reinit__is_reduced
    def update(self, output):
        self._count += len(output[1])

    @sync_all_reduce("_count")
    def compute(self):
        return self._count.item()


def datasets(config):
    full = synthetic_dataset(240 + 101, seed=3)
    return (torch.utils.data.Subset(full, range(240)),
            torch.utils.data.Subset(full, range(240, 341)))


def model(config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, 10))


def metrics():
    return {"accuracy": Accuracy(), "count": SampleCount()}


task = Task(datasets=datasets, model=model, metrics=metrics)
'''


def test_even_validation_batches_cover_every_sample_once_in_equal_batch_counts():
    for size in (1, 2, 7, 100, 101, 360):
        for world in (1, 2, 3, 4, 8):
            for batch in (1, 5, 32):
                shards = [list(EvenValidationBatches(size, world, r, batch)) for r in range(world)]
                seen = sorted(i for shard in shards for b in shard for i in b)
                assert seen == list(range(size)), (size, world, batch)
                if size >= world:  # every rank has a sample: the same number of batches
                    assert len({len(shard) for shard in shards}) == 1, (size, world, batch)
                assert all(len(b) > 0 for shard in shards for b in shard)
                assert max(len(b) for shard in shards for b in shard) <= batch + 1 or world == 1


def reference_metrics(task, checkpoint_path):
    """The final checkpoint evaluated in this one process, with plain torch."""
    from distkit import Config
    from distkit.checkpoint.saver import load_checkpoint

    model = task.model(Config())
    model.load_state_dict(load_checkpoint(checkpoint_path)["model"])
    model.eval()
    _, val = task.datasets(Config())
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.stack([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    accuracy = (logits.argmax(1) == y).double().mean().item()
    return len(y), loss, accuracy


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_101_validation_samples_counted_once_at_1_2_and_3_processes(tmp_path, monkeypatch,
                                                                      fast_config):
    (tmp_path / "oddval.py").write_text(textwrap.dedent(COURSE))
    monkeypatch.syspath_prepend(str(tmp_path))
    import oddval

    from distkit.launch.entry import run

    for world in (1, 2, 3):
        res = run(fast_config(nproc_per_node=world, epochs=1, batch_size=30,
                              output_dir=str(tmp_path / f"w{world}")), task=oddval.task)
        final = res["final"]
        count, loss, accuracy = reference_metrics(oddval.task, res["last_checkpoint"])
        assert count == VAL
        assert final["val_count"] == VAL, (world, final)
        assert final["val_loss"] == pytest.approx(loss, abs=1e-6), world
        assert final["val_accuracy"] == pytest.approx(accuracy, abs=1e-6), world
