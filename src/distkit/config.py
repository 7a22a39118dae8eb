"""Every knob of a training run, in one dataclass, validated in one place.

The CLI maps its flags one-to-one onto :class:`Config`; notebooks and courses build a
``Config`` directly::

    from distkit.config import Config
    cfg = Config(nproc_per_node=2, epochs=3)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from distkit.errors import DistkitError

BACKENDS = ("auto", "gloo", "nccl", "xla-tpu", "none")
DATASETS = ("digits", "synthetic", "mnist", "cifar10")
MODELS = ("cnn", "mlp", "resnet18")


@dataclass
class Config:
    # --- where and how many processes -------------------------------------------------
    backend: str = "auto"
    """auto picks nccl with CUDA, xla-tpu with a TPU, else gloo; none = one plain process."""
    nproc_per_node: Optional[int] = None
    """Processes to spawn on this node. None: join a torchrun/SLURM launch if there is
    one, else 1 per GPU, or 2 on a CPU-only machine."""
    nnodes: int = 1
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    timeout_s: float = 120.0
    """Bound on every collective: a dead peer ends the run instead of hanging it."""
    threads_per_process: Optional[int] = None
    """torch threads per process. None: the cores this process may use divided by the
    processes on this node, so processes never oversubscribe the cores."""

    # --- what to train ----------------------------------------------------------------
    dataset: str = "digits"
    data_dir: str = "data"
    dataset_size: int = 2048
    """Samples in the synthetic dataset (train + validation)."""
    model: str = "cnn"
    epochs: int = 10
    batch_size: int = 64
    """GLOBAL batch: summed over all processes. Each process gets batch_size // world_size."""
    lr: float = 0.05
    scale_lr: bool = False
    """Linear scaling rule (Goyal et al. 2017): peak lr = lr * world_size."""
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    num_workers: int = 0
    """GLOBAL data-loader workers; auto_dataloader divides them among the processes."""
    seed: int = 0
    amp: bool = False
    """bfloat16 autocast on CUDA (and CPU)."""
    early_stopping_patience: int = 0
    """Stop when validation loss has not improved for this many epochs (0 = off)."""
    early_stopping_min_delta: float = 0.0

    # --- what to observe and keep ----------------------------------------------------
    profile: bool = False
    progress_bar: bool = True
    output_dir: str = "runs"
    """Parent folder: every run gets a fresh sub-folder, never overwriting another run."""
    run_dir: Optional[str] = None
    """Set by the launcher; leave None."""
    checkpoint_every: int = 0
    """Also checkpoint every N iterations (a checkpoint is always saved at each epoch end)."""
    resume_from: Optional[str] = None
    max_iters: Optional[int] = None
    """Stop (and checkpoint) after this many iterations in total; for testing resume."""

    def validate(self) -> "Config":
        """Check every field that can be checked without touching the hardware."""
        _choice("backend", self.backend, BACKENDS)
        _choice("dataset", self.dataset, DATASETS)
        _choice("model", self.model, MODELS)
        _positive("epochs", self.epochs)
        _positive("batch_size", self.batch_size)
        _positive("nnodes", self.nnodes)
        _positive("dataset_size", self.dataset_size)
        _positive("timeout_s", self.timeout_s)
        if self.nproc_per_node is not None:
            _positive("nproc_per_node", self.nproc_per_node)
        if self.threads_per_process is not None:
            _positive("threads_per_process", self.threads_per_process)
        if self.max_iters is not None:
            _positive("max_iters", self.max_iters)
        if self.lr <= 0:
            raise DistkitError(f"--lr must be > 0, got {self.lr}: pass a positive learning rate")
        for name in ("num_workers", "checkpoint_every", "early_stopping_patience", "warmup_epochs"):
            if getattr(self, name) < 0:
                raise DistkitError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.nnodes > 1:
            if self.master_addr is None:
                raise DistkitError(
                    f"--nnodes {self.nnodes} needs --master-addr: pass the address of the node "
                    "with --node-rank 0 (the same on every node)")
            if self.node_rank is None:
                raise DistkitError(
                    f"--nnodes {self.nnodes} needs --node-rank: pass 0 on the first node, "
                    f"1..{self.nnodes - 1} on the others")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise DistkitError(
                f"--node-rank {self.node_rank} is out of range for --nnodes {self.nnodes}: "
                f"use a value from 0 to {self.nnodes - 1}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise DistkitError(f"--master-port {self.master_port} is not a port: use 1..65535")
        if self.nproc_per_node is not None:
            self.check_batch_fits(self.nproc_per_node * self.nnodes)
        return self

    def check_batch_fits(self, world_size: int) -> None:
        if self.batch_size < world_size:
            raise DistkitError(
                f"global --batch-size {self.batch_size} is smaller than the world size "
                f"{world_size}: every process needs at least one sample; use --batch-size "
                f">= {world_size} or fewer processes")

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _choice(name, value, choices):
    if value not in choices:
        raise DistkitError(
            f"unknown --{_flag(name)} {value!r}: choose one of {', '.join(choices)}")


def _positive(name, value):
    if not isinstance(value, (int, float)) or value <= 0:
        raise DistkitError(f"--{_flag(name)} must be > 0, got {value!r}")
