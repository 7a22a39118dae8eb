"""Exercise 04: a download that is safe when several processes start at once. (Solution.)

See ``exercises/04_safe_download.py`` for the task.
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
    # local=True: each node has its own disk, so local rank 0 of EVERY node downloads
    # while the other processes of that node wait at the barrier. When they enter the
    # block the file is complete, is_downloaded() is True and they skip the download.
    # (On a file system shared by all nodes, local=True would let one process per node
    # download into the same folder at once: there, use one_rank_first() without it.)
    with idist.one_rank_first(local=True):
        if not is_downloaded(root):
            download(root)
    # Outside the block every process of the node knows the download has finished.
    return load(root)
