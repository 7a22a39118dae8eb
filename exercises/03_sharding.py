"""Exercise 03: every rank its own samples, reshuffled every epoch.

Topic: sharding. A learner wrote this loader for 2 processes, and both processes trained
on the same samples, so the run was no faster than one process:

    loader = DataLoader(dataset, batch_size=global_batch_size, shuffle=True)

Task: fix it, by hand this time (``idist.auto_dataloader`` does the same for you):

1. ``make_train_loader(dataset, global_batch_size, seed)``: a ``DataLoader`` whose
   ``DistributedSampler`` hands this rank its own shard (``num_replicas`` = world size,
   ``rank`` = this rank, shuffled with ``seed``), and whose batch size is this rank's
   share of the GLOBAL batch (``global_batch_size // world size``).
2. ``epoch_indices(loader, epoch)``: run through the loader for epoch ``epoch`` (0, 1,
   2, ...) and return the list of sample indices this rank read, in order. The dataset
   yields ``(x, y, index)``. The shuffle must change from one epoch to the next, and be
   the same on every rank (or the shards would overlap).

Check it:  pytest exercises -m ex03     (or: distkit check 03)
Stuck?     distkit check 03 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def make_train_loader(dataset, global_batch_size: int, seed: int = 0) -> DataLoader:
    """A loader over this rank's shard of ``dataset``, ``global_batch_size // world size``
    samples per batch, shuffled with ``seed``."""
    # TODO: a DistributedSampler for this rank, and a DataLoader that uses it.
    raise NotImplementedError("exercise 03: write make_train_loader")


def epoch_indices(loader: DataLoader, epoch: int) -> list:
    """The indices of the samples this rank reads in epoch ``epoch``, in order."""
    # TODO: make the shuffle depend on the epoch, then collect the indices of every batch.
    raise NotImplementedError("exercise 03: write epoch_indices")
