"""Exercise 02: one training function for every launcher, with idist.auto_*.

Topic: the training function. The same ``training(local_rank, config)`` runs in 1 plain
process, in N spawned processes, under torchrun and on a TPU; ``ignite.distributed``
adapts it to where it runs:

- ``idist.auto_dataloader(dataset, batch_size=GLOBAL, shuffle=True)`` gives each process
  its own shard of the data (a ``DistributedSampler``) and divides the GLOBAL batch size
  by the number of processes. The sampler draws its shuffle from ``seed + epoch``, and
  nothing in ignite's ``Engine`` tells it the epoch: without
  ``train_loader.sampler.set_epoch(epoch)`` at the start of every epoch, every epoch
  repeats the first one's order;
- ``idist.auto_model(model)`` wraps the model in ``DistributedDataParallel`` when there
  are several processes, so that their gradients are averaged and the replicas stay equal;
- ``idist.auto_optim(optimizer)`` adapts the optimizer (it matters on TPUs and with
  Horovod; elsewhere it returns the optimizer unchanged).

Task: write ``training(local_rank, config)``. ``config`` is a dict with ``"dataset"`` (a
map-style dataset of ``(x, y)`` pairs), ``"batch_size"`` (the GLOBAL batch size),
``"lr"`` and ``"epochs"``. Build the data loader, ``make_model()`` and an SGD optimizer
with the three ``auto_*`` calls, train with ignite's ``create_supervised_trainer`` (loss:
``nn.CrossEntropyLoss()``, device: ``idist.device()``) for ``config["epochs"]`` epochs,
reshuffling the shards every epoch (a handler on ``Events.EPOCH_STARTED`` that calls
``set_epoch``; ignite counts epochs from 1, the sampler from 0), and return
``(model, train_loader)``.

Check it:  pytest exercises -m ex02     (or: distkit check 02)
Stuck?     distkit check 02 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Events, create_supervised_trainer


def make_model() -> nn.Module:
    """Given: a small classifier for 1x4x4 images and 4 classes. Do not change it."""
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def training(local_rank: int, config: dict):
    """Train ``make_model()`` on ``config["dataset"]`` in this process, as one of
    ``idist.get_world_size()`` processes; return ``(model, train_loader)``."""
    # TODO: the loader, the model and the optimizer through idist.auto_dataloader,
    # idist.auto_model and idist.auto_optim; then a trainer that calls set_epoch at the
    # start of every epoch and runs config["epochs"].
    raise NotImplementedError("exercise 02: write training")
