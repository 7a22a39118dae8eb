"""Datasets and the distributed data flow.

- ``digits``: scikit-learn's 8x8 handwritten digits (1797 images), shipped inside the
  scikit-learn package: the offline default, no download.
- ``synthetic``: a learnable image classification set generated from a seed, with any
  size and shape (class templates plus noise).
- ``mnist`` / ``cifar10``: torchvision, downloaded by one rank per node first.
- ``text``: the standard library's ``pydoc_data.topics`` (about 465,000 characters, 103
  distinct with Python 3.11) as next-character blocks ``(x, y)`` of 128 token ids, ``y``
  ``x`` shifted by one: every Python install ships it, so it is offline everywhere.

:func:`get_dataflow` turns a dataset into the loaders every process uses, through
``idist.auto_dataloader`` (which inserts a ``DistributedSampler`` and divides the global
batch size and the workers by the world size).
"""
from __future__ import annotations

import math
import os
import socket
from collections import Counter
from functools import lru_cache

import ignite.distributed as idist
import torch
from torch.utils.data import Dataset, Subset

from distkit.errors import DistkitError

VAL_SIZE = 360  # digits/synthetic validation samples: divisible by 1, 2, 3, 4, 5, 6, 8


class TensorImageDataset(Dataset):
    """Images ``(N, C, H, W)`` float and labels ``(N,)`` long, held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        assert len(images) == len(labels)
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class IndexedDataset(Dataset):
    """Wraps any map-style dataset so that each sample also yields its index:
    ``(x, y, index)``. Used to check which process saw which sample."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        x, y = self.dataset[i][:2]
        return x, y, i


def digits_dataset() -> TensorImageDataset:
    """scikit-learn's digits as 1x8x8 images scaled to [0, 1]; no download."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    return TensorImageDataset(images, labels)


def synthetic_dataset(size: int = 2048, num_classes: int = 10, shape=(1, 8, 8),
                      noise: float = 1.0, seed: int = 0) -> TensorImageDataset:
    """A learnable set: each class has a random template; a sample is its class template
    plus Gaussian noise. The same seed gives the same data in every process."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(num_classes, *shape, generator=g)
    labels = torch.arange(size) % num_classes
    labels = labels[torch.randperm(size, generator=g)]
    images = templates[labels] + noise * torch.randn(size, *shape, generator=g)
    return TensorImageDataset(images, labels)


def split(dataset, val_size: int = VAL_SIZE, seed: int = 0):
    """A fixed random train/validation split, identical in every process."""
    perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(dataset, perm[val_size:]), Subset(dataset, perm[:val_size])


# --- text: characters of the Python documentation's topics ----------------------------

TEXT_BLOCK_SIZE = 128
TEXT_VAL_BLOCKS = 360  # validation blocks (46,080 characters): divisible by 1-6 and 8


@lru_cache(maxsize=1)
def text_corpus() -> str:
    """The topics of ``pydoc_data.topics`` (what ``help("assert")`` shows), in the order
    of their names, one after another: about 465,000 characters with Python 3.11."""
    from pydoc_data.topics import topics

    return "".join(topics[name] for name in sorted(topics))


class CharVocab:
    """The distinct characters of a text, sorted; ``encode`` / ``decode`` between
    strings and token ids::

        >>> v = CharVocab("hello")
        >>> len(v), v.encode("hole").tolist(), v.decode([3, 1, 2, 2, 3])
        (4, [1, 3, 2, 0], 'ohllo')
    """

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@lru_cache(maxsize=1)
def text_vocab() -> CharVocab:
    return CharVocab(text_corpus())


class CharBlocks(Dataset):
    """Next-character blocks of a token sequence: sample ``i`` is ``x = ids[s:s+T]`` and
    ``y = ids[s+1:s+T+1]`` with ``s = i * T`` (blocks side by side, each target its
    input shifted by one)."""

    def __init__(self, ids: torch.Tensor, block_size: int = TEXT_BLOCK_SIZE):
        self.ids, self.block_size = ids, block_size

    def __len__(self):
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        s = i * self.block_size
        chunk = self.ids[s:s + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def text_datasets(block_size: int = None, val_blocks: int = None):
    """(train, validation) :class:`CharBlocks` of :func:`text_corpus`: validation is the
    text's last ``val_blocks`` blocks, training everything before them (a split in
    position, so no validation character is ever a training target). Longer blocks keep
    about the default's validation text (360 blocks of 128: 46,080 characters), rounded
    up to a number of blocks that divides by 1 to 4, 6 and 8 (48 blocks of 1024: 49,152)."""
    block_size = block_size or TEXT_BLOCK_SIZE
    if val_blocks is None:
        val_blocks = -(-TEXT_VAL_BLOCKS * TEXT_BLOCK_SIZE // block_size // 24) * 24
    ids = text_vocab().encode(text_corpus())
    cut = len(ids) - val_blocks * block_size - 1
    return CharBlocks(ids[:cut + 1], block_size), CharBlocks(ids[cut:], block_size)


def unigram_entropy(text: str) -> float:
    """The entropy, in nats, of the text's character frequencies: the loss per character
    of the best model that ignores context (3.25 for :func:`text_corpus` with Python
    3.11). A model whose validation loss is below it has learned to use its context."""
    n = len(text)
    return -sum(c / n * math.log(c / n) for c in Counter(text).values())


def _torchvision_datasets(name: str, root: str, download: bool):
    import torchvision.transforms as T
    from torchvision import datasets

    if name == "mnist":
        tf = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))])
        cls = datasets.MNIST
    else:
        tf = T.Compose([T.ToTensor(), T.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))])
        cls = datasets.CIFAR10
    return (cls(root, train=True, transform=tf, download=download),
            cls(root, train=False, transform=tf, download=download))


def fetch_torchvision(name: str, root: str):
    """Load (downloading if needed) a torchvision dataset, or fail in one clear line."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(20)  # an unreachable mirror must fail, not hang
    try:
        return _torchvision_datasets(name, root, download=True)
    except Exception as e:  # torchvision raises URLError, RuntimeError, OSError...
        raise DistkitError(
            f"dataset {name!r} is not in {os.path.abspath(root)!r} and could not be downloaded "
            f"({type(e).__name__}); offline? use --dataset digits (the offline default) or "
            f"--dataset synthetic, or copy the files into --data-dir") from None
    finally:
        socket.setdefaulttimeout(previous)


def get_datasets(config, block_size: int = None):
    """(train, validation) datasets for ``config.dataset`` (text: blocks of ``block_size``
    characters, default :data:`TEXT_BLOCK_SIZE`)."""
    if config.dataset == "digits":
        return split(digits_dataset(), seed=config.seed)
    if config.dataset == "synthetic":
        full = synthetic_dataset(config.dataset_size + VAL_SIZE, seed=config.seed)
        return split(full, seed=config.seed)
    if config.dataset == "text":
        return text_datasets(block_size)
    # One process per node downloads; the others wait, then find the files. A failed
    # download raises in rank 0 only after the barrier, so no process is left waiting.
    error = None
    with idist.one_rank_first(local=True):
        try:
            datasets = fetch_torchvision(config.dataset, config.data_dir)
        except DistkitError as e:
            error = e
    if error is not None:
        raise error
    return datasets


def dataset_info(name: str) -> dict:
    """Image shape and number of classes (text: vocabulary and block size), without
    loading the images."""
    if name == "text":
        return {"vocab_size": len(text_vocab()), "block_size": TEXT_BLOCK_SIZE}
    return {
        "digits": {"in_channels": 1, "image_size": 8, "num_classes": 10},
        "synthetic": {"in_channels": 1, "image_size": 8, "num_classes": 10},
        "mnist": {"in_channels": 1, "image_size": 28, "num_classes": 10},
        "cifar10": {"in_channels": 3, "image_size": 32, "num_classes": 10},
    }[name]


def get_dataflow(config, datasets=None, collate_fn=None):
    """Train and validation loaders for this process, from ``datasets`` (a pair of
    (train, validation) datasets; default: :func:`get_datasets`); ``collate_fn`` (a
    task's own) goes to both loaders.

    ``auto_dataloader`` divides the GLOBAL ``batch_size`` and ``num_workers`` by the
    world size and adds a ``DistributedSampler`` (shuffling the training set). In one
    plain process the loaders take the whole batch::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from distkit import Config
        >>> pair = TensorDataset(torch.randn(100, 3)), TensorDataset(torch.randn(20, 3))
        >>> train, val = get_dataflow(Config(batch_size=32), pair)
        >>> len(train), train.batch_size, val.batch_size
        (4, 32, 64)
    """
    train_set, val_set = datasets if datasets is not None else get_datasets(config)
    pin = idist.device().type == "cuda"
    extra = {"collate_fn": collate_fn} if collate_fn is not None else {}
    if config.persistent_workers and config.num_workers > 0:
        extra["persistent_workers"] = True  # (Config refuses it without workers)
    train_loader = idist.auto_dataloader(
        train_set, batch_size=config.batch_size, num_workers=config.num_workers,
        drop_last=False, pin_memory=pin, **extra, **same_order_at_any_world_size(train_set))
    val_loader = validation_loader(val_set, 2 * config.batch_size, config.num_workers,
                                   pin_memory=pin, **extra)
    return train_loader, val_loader


def same_order_at_any_world_size(dataset) -> dict:
    """The sampler arguments of the training loader: shuffled by a ``DistributedSampler``
    at every world size. ``auto_dataloader`` adds one (seed 0, reshuffled per epoch by
    ``set_epoch``) when there are several processes; one process gets the same one
    (``num_replicas=1``) instead of a ``RandomSampler``, so the epoch's order is the same
    permutation at any world size W, and global batch i is ``perm[i*B:(i+1)*B]`` whether
    1, 2 or 4 processes train it: a run resumed on another world size continues the
    uninterrupted run's batches (distkit.checkpoint.reshard)."""
    if idist.get_world_size() > 1:
        return {"shuffle": True}
    from torch.utils.data.distributed import DistributedSampler

    return {"sampler": DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True)}


def validation_loader(dataset, batch_size: int, num_workers: int = 0, **kwargs):
    """The validation loader of this process: every sample exactly once over all ranks.

    ``idist.auto_dataloader``'s ``DistributedSampler`` pads a set whose size does not
    divide by the world size with repeated samples (101 samples on 2 or 3 ranks: 102
    counted), so the metrics would change with the world size. Here each rank takes
    every world-size-th sample (:class:`EvenValidationBatches`), unpadded, cut into the
    same number of batches on every rank, so a wrapped model that talks to the other
    ranks in its forward (DDP's buffer broadcast, FSDP's all-gathers) runs as many
    forwards on each. ignite's metrics all-reduce their sums at ``compute()``, so uneven
    shards give the exact global values. ``batch_size`` is GLOBAL, as for
    ``auto_dataloader``."""
    import warnings

    world_size = idist.get_world_size()
    if world_size == 1:
        return idist.auto_dataloader(dataset, batch_size=batch_size, num_workers=num_workers,
                                     shuffle=False, **kwargs)
    per_rank = max(1, batch_size // world_size)
    batches = EvenValidationBatches(len(dataset), world_size, idist.get_rank(), per_rank)
    with warnings.catch_warnings():  # "make sure that [batch_sampler] is compatible": it is
        warnings.filterwarnings("ignore", message="Found batch_sampler")
        return idist.auto_dataloader(dataset, batch_sampler=batches, num_workers=num_workers,
                                     **kwargs)


class EvenValidationBatches(torch.utils.data.Sampler):
    """Batches of indices for rank ``rank`` of ``world_size``: samples ``rank``,
    ``rank + world_size``, ... (no padding: together the ranks see each index once), in
    as many batches on every rank (the first rank's count at ``batch_size``), sizes
    differing by at most one. A set smaller than the world size leaves some ranks
    without a batch: validate on at least as many samples as processes::

        >>> [list(EvenValidationBatches(101, 2, r, 32)) == [] for r in (0, 1)]
        [False, False]
        >>> [len(b) for b in EvenValidationBatches(101, 2, 0, 32)]
        [26, 25]
        >>> [len(b) for b in EvenValidationBatches(101, 2, 1, 32)]
        [25, 25]
        >>> sorted(i for r in (0, 1, 2) for b in EvenValidationBatches(101, 3, r, 16) for i in b) == list(range(101))
        True
    """

    def __init__(self, size: int, world_size: int, rank: int, batch_size: int):
        self.indices = list(range(rank, size, world_size))
        most = len(range(0, size, world_size))  # rank 0's share, the largest
        least = size // world_size  # the last rank's share, the smallest
        # as many batches as rank 0 needs, but no more than the smallest share can fill
        # (then a batch may hold one sample more than batch_size); a set smaller than
        # the world size leaves some ranks without a batch
        self.count = max(1, min(-(-most // batch_size), least))
        self.count_here = min(self.count, len(self.indices))

    def __iter__(self):
        n, k = len(self.indices), self.count_here
        start = 0
        for b in range(k):
            stop = start + n // k + (1 if b < n % k else 0)
            yield self.indices[start:stop]
            start = stop

    def __len__(self):
        return self.count_here
