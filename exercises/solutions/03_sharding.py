"""Exercise 03: every rank its own samples, reshuffled every epoch. (Solution.)

See ``exercises/03_sharding.py`` for the task.
"""
import ignite.distributed as idist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def make_train_loader(dataset, global_batch_size: int, seed: int = 0) -> DataLoader:
    """A loader over this rank's shard of ``dataset``, ``global_batch_size // world size``
    samples per batch, shuffled with ``seed``."""
    world_size = idist.get_world_size()
    # Every rank shuffles ALL indices with the same seed (so all ranks agree on the
    # permutation), then keeps every world_size-th one starting at its rank: disjoint
    # shards that together cover the dataset (padded by repeats if it does not divide).
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=idist.get_rank(),
                                 shuffle=True, seed=seed)
    # The sampler does the shuffling: a DataLoader must not shuffle on top of it.
    return DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)


def epoch_indices(loader: DataLoader, epoch: int) -> list:
    """The indices of the samples this rank reads in epoch ``epoch``, in order."""
    # The permutation is drawn from seed + epoch: without set_epoch every epoch repeats
    # the same order. Every rank calls it with the same epoch, so they still agree.
    loader.sampler.set_epoch(epoch)
    return [int(i) for _, _, index in loader for i in index]
