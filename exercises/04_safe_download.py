"""Exercise 04: a download that is safe when several processes start at once.

Topic: real datasets. Every process of a run executes the same code, so a naive
"download if missing" runs in every process at the same moment: they all see no file,
all download into the same file, and the fastest one starts reading a file that another
one is still writing. With 4 processes on a node that is 4 downloads and a crash.

``download``, ``is_downloaded`` and ``load`` below are GIVEN: a pretend download that
takes almost a second and, like many real ones, writes straight into its final file (so for
a moment the file exists but is incomplete), and a loader that refuses an incomplete file.

Task: write ``get_dataset(root)`` so that, called by every process at once:

- the dataset is downloaded ONCE per node (only if it is not there yet),
- no process reads it before the download has finished,
- every process returns ``load(root)``.

Tool: ``idist.one_rank_first(local=True)``: a context manager; local rank 0 runs the
block first, the others wait at a barrier and run it afterwards.

``local=True`` is right when every node has its own disk. On a file system that all
nodes share (NFS, Lustre), local rank 0 of EVERY node would download into the same
folder at once: the very race of this exercise, between nodes. There use
``idist.one_rank_first()`` (rank 0 of the whole run first), or download before the run.

Check it:  pytest exercises -m ex04     (or: distkit check 04)
Stuck?     distkit check 04 --hint     (or read exercises/hints.md)
"""
import os
import time

import ignite.distributed as idist
import torch

DATA_FILE = "numbers.bin"
PAYLOAD = bytes(range(256)) * 64  # the "dataset": 16 KiB
DOWNLOAD_SECONDS = 0.8


class IncompleteDataset(RuntimeError):
    """The dataset file is missing or still being written."""


def download(root: str) -> None:
    """Given: pretend to download the dataset into ``root`` (almost a second). Each
    call notes itself in ``root/downloads.log``. Do not change it."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "downloads.log"), "a") as log:
        log.write(f"{idist.get_rank()}\n")
    with open(os.path.join(root, DATA_FILE), "wb") as f:
        half = len(PAYLOAD) // 2
        f.write(PAYLOAD[:half])
        f.flush()
        time.sleep(DOWNLOAD_SECONDS)  # the network is slow
        f.write(PAYLOAD[half:])


def is_downloaded(root: str) -> bool:
    """Given: True when the file exists (like many helpers, it does not check that the
    file is complete). Do not change it."""
    return os.path.exists(os.path.join(root, DATA_FILE))


def load(root: str) -> torch.Tensor:
    """Given: the dataset as a tensor of bytes, or ``IncompleteDataset``. Do not change it."""
    path = os.path.join(root, DATA_FILE)
    if not os.path.exists(path):
        raise IncompleteDataset(f"{path} is missing: it has not been downloaded (yet)")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != len(PAYLOAD):
        raise IncompleteDataset(f"{path} is incomplete ({len(data)} of {len(PAYLOAD)} bytes): "
                                "another process is still writing it")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def get_dataset(root: str) -> torch.Tensor:
    """Download the dataset into ``root`` once per node, then load it, in every process."""
    # TODO: one process downloads (if needed) while the others wait; then everyone loads.
    raise NotImplementedError("exercise 04: write get_dataset")
