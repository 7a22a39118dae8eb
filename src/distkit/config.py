"""Every knob of a training run, in one dataclass, validated in one place.

The CLI maps its flags one-to-one onto :class:`Config`; notebooks and courses build a
``Config`` directly::

    from distkit.config import Config
    cfg = Config(nproc_per_node=2, epochs=3)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import numbers
from dataclasses import dataclass
from typing import Optional

from distkit.errors import DistkitError

BACKENDS = ("auto", "gloo", "nccl", "xla-tpu", "none")
DATASETS = ("digits", "synthetic", "mnist", "cifar10", "text")
MODELS = ("cnn", "mlp", "resnet18", "gpt")
TEXT_DATASETS, TEXT_MODELS = ("text",), ("gpt",)  # sequences of tokens; the rest are images
DATASET_DEFAULTS = {
    # The GPT on 2 CPU cores: ~100 steps of 32 blocks (4096 characters) a step, one pass
    # over the text, at AdamW's usual lr for a model this small (distkit.builtin.text.adamw).
    "text": {"epochs": 1, "batch_size": 32, "lr": 3e-3},
}
"""Settings ``distkit train`` uses for a dataset when its flag is not given."""


def builtin_pairs() -> list:
    """The (dataset, model) pairs that make a built-in task: image datasets x image
    models, and ``text`` x ``gpt``."""
    image_data = [d for d in DATASETS if d not in TEXT_DATASETS]
    image_models = [m for m in MODELS if m not in TEXT_MODELS]
    return ([(d, m) for d in image_data for m in image_models]
            + [(d, m) for d in TEXT_DATASETS for m in TEXT_MODELS])
LOGGERS = ("none", "tensorboard", "mlflow")
# logger -> the package that must be importable (and the distkit extra that installs it)
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
STRATEGIES = ("ddp", "fsdp")
SHARDING_BACKENDS = ("gloo", "nccl")  # fully_shard needs a torch.distributed process group


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
    strategy: str = "ddp"
    """ddp: every rank holds the whole model (DistributedDataParallel); fsdp: each holds
    1/N of the parameters, gradients and optimizer state (FSDP2 fully_shard; gloo/nccl)."""
    task: Optional[str] = None
    """A course's own task, ``module:attr`` or ``path/to/file.py:attr`` naming a
    ``distkit.Task``; it replaces ``dataset`` and ``model`` (see ``distkit.tasks``)."""
    task_settings: dict = dataclasses.field(default_factory=dict)
    """The task's own settings, ``{name: value}`` (``--set name=value``): names the task
    declares in ``Task(settings=...)``; the launcher completes them with the task's
    defaults, and the task's functions read ``config.task_settings[name]``."""
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
    trace: bool = False
    """torch.profiler on every rank for a few steps after a warm-up; per-rank traces, one
    merged Chrome trace and its drawing in ``<run dir>/trace/`` (see ``distkit.observe.tracing``)."""
    progress_bar: bool = True
    """Show ignite's progress bar where someone watches it: stdout a terminal or a notebook.
    Elsewhere (CI logs, SLURM output files) one line per epoch instead."""
    verbose: bool = False
    """Let ignite's INFO lines through (launcher parameters, data loaders, model wrapping)."""
    logger: str = "none"
    """Experiment tracker, on rank 0: none, tensorboard or mlflow (see ``distkit.observe.tracking``)."""
    output_dir: str = "runs"
    """Parent folder: every run gets a fresh sub-folder, never overwriting another run."""
    checkpoint_every: int = 0
    """Also checkpoint every N iterations (a checkpoint is always saved at each epoch end)."""
    resume_from: Optional[str] = None
    max_iters: Optional[int] = None
    """Stop (and checkpoint) after this many iterations in total; for testing resume."""
    peak_flops: Optional[float] = None
    """The machine's peak FLOP/s (all processes together) that MFU is measured against.
    None: measured at the start of the run, a large matmul on every process at once."""

    def validate_processes(self) -> "Config":
        """Check the settings of the processes alone (backend, counts, node, port,
        timeout, threads): all that ``launch_function`` and ``run_per_rank`` have."""
        _choice("backend", self.backend, BACKENDS)
        for name, low, high in _WHOLE_NUMBERS:
            if name in PROCESS_FIELDS:
                _whole(name, getattr(self, name), low, high)
        for name, low, low_open, high, high_open in _REAL_NUMBERS:
            if name in PROCESS_FIELDS:
                _real(name, getattr(self, name), low, low_open, high, high_open)
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
        return self

    def validate(self) -> "Config":
        """Check every field that can be checked without touching the hardware: choices,
        and every number finite and in range (``nan <= 0`` is False, so a plain ``<= 0``
        test lets NaN through). The checks ``process_settings`` and ``training_settings``
        of :mod:`distkit.launch.checks`, in that order."""
        return self.validate_processes().validate_training()

    def validate_training(self) -> "Config":
        """Check the fields of training (all but the processes')."""
        _choice("dataset", self.dataset, DATASETS)
        _choice("model", self.model, MODELS)
        if self.task is None and (self.dataset, self.model) not in builtin_pairs():
            fix = ("--dataset text --model gpt" if self.dataset in TEXT_DATASETS
                   or self.model in TEXT_MODELS else "--model cnn")
            raise DistkitError(f"--model {self.model} cannot train on --dataset {self.dataset} "
                               f"(text needs gpt, images need cnn, mlp or resnet18): use {fix}")
        _choice("logger", self.logger, LOGGERS)
        check_logger_installed(self.logger)
        _choice("strategy", self.strategy, STRATEGIES)
        check_strategy(self.strategy, self.backend)
        if not isinstance(self.task_settings, dict) or not all(
                isinstance(k, str) for k in self.task_settings):
            raise DistkitError(f"Config.task_settings must be a dict {{name: value}}, got "
                               f"{self.task_settings!r}: e.g. task_settings={{'hidden': 64}}")
        for name, low, high in _WHOLE_NUMBERS:
            if name not in PROCESS_FIELDS:
                _whole(name, getattr(self, name), low, high)
        for name, low, low_open, high, high_open in _REAL_NUMBERS:
            if name not in PROCESS_FIELDS:
                _real(name, getattr(self, name), low, low_open, high, high_open)
        if self.peak_flops is not None:
            _real("peak_flops", self.peak_flops, 0.0, True, None, False)
        if self.warmup_epochs > self.epochs:
            raise DistkitError(f"--warmup-epochs {self.warmup_epochs} is longer than --epochs "
                               f"{self.epochs}: use --warmup-epochs {self.epochs} or less")
        if self.nproc_per_node is not None:
            self.check_batch_fits(self.nproc_per_node * self.nnodes)
        return self

    def check_batch_fits(self, world_size: int) -> None:
        """The global batch must split evenly: ``auto_dataloader`` gives every process
        ``batch_size // world_size``, so 3 on 2 processes would train with 2 while the
        run's records say 3."""
        if self.batch_size < world_size:
            raise DistkitError(
                f"global --batch-size {self.batch_size} is smaller than the world size "
                f"{world_size}: every process needs at least one sample; use --batch-size "
                f">= {world_size} or fewer processes")
        if self.batch_size % world_size:
            lower = self.batch_size // world_size * world_size
            raise DistkitError(
                f"global --batch-size {self.batch_size} does not divide by the world size "
                f"{world_size} (each process would get {self.batch_size // world_size}, "
                f"{lower} in all): use --batch-size {lower} or {lower + world_size}")

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_logger_installed(logger: str) -> None:
    """One line, before any process starts, if the tracker's package is missing."""
    package = LOGGER_PACKAGES.get(logger)
    if package is not None and importlib.util.find_spec(package) is None:
        raise DistkitError(f"--logger {logger} needs the {package} package, which is not installed: "
                           f"pip install {package} (the distkit[{logger}] extra), or use --logger none")


def check_strategy(strategy: str, backend: str) -> None:
    """Refuse, in one line, a strategy the backend cannot run (before any process starts;
    ``backend`` may be ``auto``, which is checked again once resolved)."""
    if strategy == "fsdp" and backend not in SHARDING_BACKENDS + ("auto",):
        raise DistkitError(
            f"--strategy fsdp needs a torch.distributed process group (gloo or nccl), and "
            f"--backend {backend} has none: use --backend gloo or nccl, or --strategy ddp")


# The fields of the processes (Config.validate_processes); the rest are training's.
PROCESS_FIELDS = {"nproc_per_node", "nnodes", "node_rank", "master_port", "threads_per_process",
                  "timeout_s"}
# Whole-number fields: (name, lowest, highest or None). None values of the Optional
# fields mean "choose for me" and are not checked.
_WHOLE_NUMBERS = (
    ("nproc_per_node", 1, None), ("nnodes", 1, None), ("node_rank", 0, None),
    ("master_port", 1, 65535), ("threads_per_process", 1, None), ("dataset_size", 1, None),
    ("epochs", 1, None), ("batch_size", 1, None), ("num_workers", 0, None),
    ("seed", 0, 2**32 - 1),  # numpy's seed (ignite's manual_seed sets it) takes 32 bits
    ("early_stopping_patience", 0, None), ("checkpoint_every", 0, None), ("max_iters", 1, None),
)
# Real-number fields, always finite: (name, lowest, lowest excluded, highest or None,
# highest excluded).
_REAL_NUMBERS = (
    # At most a day: beyond that a hung peer is never noticed (timedelta overflows ~1e14 s).
    ("timeout_s", 0.0, True, 86400.0, False),
    ("lr", 0.0, True, None, False),
    ("warmup_epochs", 0.0, False, None, False),
    ("momentum", 0.0, False, 1.0, True),  # momentum 1 never forgets a gradient
    ("weight_decay", 0.0, False, None, False),
    ("early_stopping_min_delta", 0.0, False, None, False),
)
# Fields whose CLI flag is not the field name with dashes, and fields with no flag.
_FLAGS = {"timeout_s": "timeout"}
_NO_FLAG = {"momentum", "weight_decay"}


def _flag(name: str) -> str:
    return _FLAGS.get(name, name.replace("_", "-"))


def _label(name: str) -> str:
    """How the learner set it: ``--flag`` on the command line, else ``Config.field``."""
    return f"Config.{name}" if name in _NO_FLAG else f"--{_flag(name)}"


def _choice(name, value, choices):
    if value not in choices:
        raise DistkitError(
            f"unknown --{_flag(name)} {value!r}: choose one of {', '.join(choices)}")


def _fix(name, where):
    default = Config.__dataclass_fields__[name].default
    return f"use a value {where}" + ("" if default is None else f", e.g. the default {default}")


def _whole(name, value, low, high):
    if value is None and name in _OPTIONAL:
        return
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) \
        and value >= low and (high is None or value <= high)
    if not ok:
        where = f">= {low}" if high is None else f"from {low} to {high}"
        raise DistkitError(f"{_label(name)} must be a whole number {where}, got {value!r}: "
                           f"{_fix(name, where)}")


def _real(name, value, low, low_open, high, high_open):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value) and (value > low if low_open else value >= low) \
        and (high is None or (value < high if high_open else value <= high))
    if not ok:
        where = f"{'>' if low_open else '>='} {low:g}"
        if high is not None:
            where += f" and {'<' if high_open else '<='} {high:g}"
        raise DistkitError(f"{_label(name)} must be a finite number {where}, got {value!r}: "
                           f"{_fix(name, where)}")


_OPTIONAL = {"nproc_per_node", "node_rank", "master_port", "threads_per_process", "max_iters"}
