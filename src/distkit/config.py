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


def _cli(default=None, factory=None, **how) -> dataclasses.Field:
    """A field whose ``distkit train`` flag needs more than the field itself gives:
    ``flag`` (the name, where not the field's with dashes), ``alias`` (torchrun's
    spelling), ``metavar``, ``choices``, ``group`` (the help section this field and the
    ones after it are listed in), ``action``. ``distkit.commands.train`` makes every flag
    from the fields, these and the fields' docstrings (the help text)."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"cli": how})
    return dataclasses.field(default=default, metadata={"cli": how})


@dataclass
class Config:
    # --- where and how many processes -------------------------------------------------
    backend: str = _cli("auto", choices=BACKENDS, group="processes and nodes")
    """auto: nccl with CUDA, xla-tpu with a TPU, else gloo; none: one plain process."""
    nproc_per_node: Optional[int] = _cli(None, alias="--nproc_per_node", metavar="N")
    """Processes to spawn on this node (default: join torchrun/SLURM if launched by one,
    else one per GPU, or 2 on a CPU)."""
    nnodes: int = _cli(1, metavar="N")
    """Machines (nodes) in the run, each started with the same flags."""
    node_rank: Optional[int] = _cli(None, alias="--node_rank", metavar="R")
    """This node's number: 0 on the node at --master-addr, 1..nnodes-1 on the others."""
    master_addr: Optional[str] = _cli(None, alias="--master_addr", metavar="ADDR")
    """Address of the node with --node-rank 0, the same on every node."""
    master_port: Optional[int] = _cli(None, alias="--master_port", metavar="PORT")
    """Port on the master node (default: a free port, on a single node)."""
    timeout_s: float = _cli(120.0, flag="timeout", metavar="S")
    """Seconds any collective may wait before the run fails: a dead peer ends the run
    instead of hanging it."""
    threads_per_process: Optional[int] = _cli(None, metavar="N")
    """torch threads per process (default: this machine's cores / the processes of the run
    on this machine, so processes never oversubscribe the cores; all launches: two
    torchrun "nodes" on one machine share it)."""

    # --- what to train ----------------------------------------------------------------
    dataset: str = _cli("digits", choices=DATASETS, group="data, model and optimization")
    """The built-in dataset; digits, synthetic and text need no download."""
    data_dir: str = _cli("data", metavar="DIR")
    """Folder of downloaded datasets (mnist, cifar10), also given to a task's functions."""
    dataset_size: int = _cli(2048, metavar="N")
    """Training samples of the synthetic dataset."""
    model: str = _cli("cnn", choices=MODELS)
    """The built-in model; gpt trains on --dataset text, the others on images."""
    strategy: str = _cli("ddp", choices=STRATEGIES)
    """ddp: a whole model per process (DistributedDataParallel); fsdp: each process holds
    1/N of the parameters, gradients and optimizer state (FSDP2 fully_shard; gloo or nccl)."""
    task: Optional[str] = _cli(None, metavar="MODULE:ATTR")
    """A course's own distkit.Task: module:attr (module importable from the current folder)
    or path/to/file.py:attr; replaces --dataset/--model (see ``distkit.tasks``)."""
    task_settings: dict = _cli(factory=dict, flag="set", action="append", metavar="NAME=VALUE")
    """A setting of the --task's own, declared in Task(settings=...): e.g. --set hidden=64
    --set max_norm=1.0, repeated for each (from Python: ``{name: value}``). The launcher
    completes them with the task's defaults; the task's functions read
    ``config.task_settings[name]``."""
    epochs: int = _cli(10, metavar="E")
    """Passes over the training set."""
    batch_size: int = _cli(64, metavar="B")
    """GLOBAL batch size, summed over all processes: each of N processes gets
    batch-size / N samples per step."""
    lr: float = 0.05
    """Peak learning rate of the kit's schedule (the optimizer's lr for a task that keeps its own)."""
    scale_lr: bool = False
    """Linear scaling rule (Goyal et al. 2017): peak lr = lr x world size."""
    warmup_epochs: float = _cli(0.0, metavar="W")
    """Epochs of linear warm-up to the peak lr, then cosine decay to the end."""
    momentum: float = _cli(0.9, flag=None)
    """SGD momentum of the built-in tasks (no flag: set it from Python)."""
    weight_decay: float = _cli(1e-4, flag=None)
    """SGD weight decay of the built-in tasks (no flag: set it from Python)."""
    num_workers: int = _cli(0, metavar="W")
    """GLOBAL data-loader workers, divided among the processes (auto_dataloader)."""
    persistent_workers: bool = False
    """Keep each loader's worker processes from one epoch to the next (DataLoader's
    persistent_workers) instead of starting them again every epoch; needs --num-workers 1
    or more. A resumed run goes on exactly as without it."""
    seed: int = _cli(0, metavar="S")
    """Seed of every random generator (each rank derives its own from it)."""
    amp: bool = False
    """bfloat16 autocast (on CUDA and CPU), around the kit's step or a task's own."""
    early_stopping_patience: int = _cli(0, metavar="N")
    """Stop after this many epochs without a better validation score (the task's; built-in
    tasks: a lower validation loss) (0: off)."""
    early_stopping_min_delta: float = _cli(0.0, metavar="D")
    """The smallest improvement of the score that counts as better (with a patience)."""

    # --- what to observe and keep ----------------------------------------------------
    profile: bool = _cli(False, group="output")
    """Profile handlers and data/compute time; summary in results.json."""
    trace: bool = False
    """torch.profiler on every rank for a few steps after a warm-up: per-rank traces, one
    merged Chrome trace (one row per rank, clocks aligned) and its timeline.png in
    <run dir>/trace/, named in results.json (see ``distkit.observe.tracing``)."""
    progress_bar: bool = _cli(True, flag="no-progress", action="store_false")
    """One line per epoch even in a terminal (the progress bar shows only when output goes
    to a terminal or a notebook; in logs, CI and SLURM output files, one line per epoch)."""
    verbose: bool = False
    """Also print ignite's INFO lines (launcher parameters, data loaders, model wrapping)."""
    logger: str = _cli("none", choices=LOGGERS)
    """Experiment tracker on rank 0 (ignite's TensorboardLogger / MLflowLogger): loss, lr,
    validation metrics per epoch, the profile with --profile; pip install tensorboard /
    mlflow first (see ``distkit.observe.tracking``)."""
    output_dir: str = _cli("runs", metavar="DIR")
    """Each run writes to a fresh sub-folder of this, never overwriting another run."""
    checkpoint_every: int = _cli(0, metavar="N")
    """Also checkpoint every N iterations (always at each epoch end)."""
    resume_from: Optional[str] = _cli(None, metavar="PATH")
    """Checkpoint .pt file to resume from, or 'latest': the newest checkpoint under
    --output-dir (none yet: start from scratch; for torchrun --max-restarts)."""
    max_iters: Optional[int] = _cli(None, metavar="N")
    """Stop (with a checkpoint) after this many iterations in total."""
    peak_flops: Optional[float] = _cli(None, metavar="FLOPS")
    """The machine's peak FLOP/s, all processes together, for the MFU of models that count
    their FLOPs (--model gpt) (default: measured at the start, a large matmul on every
    process at once)."""

    def validate_processes(self) -> "Config":
        """Check the settings of the processes alone (backend, strategy, counts, node,
        port, timeout, threads): all that ``launch_function`` and ``run_per_rank`` have."""
        _choice("backend", self.backend, BACKENDS)
        # how the model is spread over the processes: a contradiction with --backend is
        # known before any hardware is looked at (auto is checked again once resolved)
        _choice("strategy", self.strategy, STRATEGIES)
        check_strategy(self.strategy, self.backend)
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

    def validate_training(self, world_size: int | None = None) -> "Config":
        """Check the fields of training (all but the processes'), and the global batch on
        ``world_size`` processes (None: on ``nproc_per_node`` x ``nnodes`` if given)."""
        _choice("dataset", self.dataset, DATASETS)
        _choice("model", self.model, MODELS)
        if self.task is None and (self.dataset, self.model) not in builtin_pairs():
            fix = ("--dataset text --model gpt" if self.dataset in TEXT_DATASETS
                   or self.model in TEXT_MODELS else "--model cnn")
            raise DistkitError(f"--model {self.model} cannot train on --dataset {self.dataset} "
                               f"(text needs gpt, images need cnn, mlp or resnet18): use {fix}")
        _choice("logger", self.logger, LOGGERS)
        check_logger_installed(self.logger)
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
        if self.persistent_workers and self.num_workers == 0:  # torch: a ValueError per rank
            raise DistkitError("--persistent-workers keeps the data loaders' worker processes, "
                               "and --num-workers 0 starts none: add --num-workers 2 (or more), "
                               "or drop --persistent-workers")
        if self.warmup_epochs > self.epochs:
            raise DistkitError(f"--warmup-epochs {self.warmup_epochs} is longer than --epochs "
                               f"{self.epochs}: use --warmup-epochs {self.epochs} or less")
        if world_size is None and self.nproc_per_node is not None:
            world_size = self.nproc_per_node * self.nnodes
        if world_size is not None:
            self.check_batch_fits(world_size)
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
        if self.batch_size % world_size and self.resume_from:  # the global batch must stay
            near = sorted((w for w in range(1, self.batch_size + 1) if self.batch_size % w == 0),
                          key=lambda w: (abs(w - world_size), w))[:2]
            raise DistkitError(
                f"global --batch-size {self.batch_size} does not divide by the world size "
                f"{world_size}, and a run resumed with --resume-from keeps its global batch: resume on "
                f"{' or '.join(map(str, sorted(near)))} processes")
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
def cli_spec(name: str) -> dict:
    """How field ``name`` is given on the command line (see :func:`_cli`)."""
    return dict(Config.__dataclass_fields__[name].metadata.get("cli", {}))


def _flag(name: str) -> str | None:
    """The flag's name without dashes (None: the field has no flag)."""
    spec = cli_spec(name)
    return spec["flag"] if "flag" in spec else name.replace("_", "-")


def _label(name: str) -> str:
    """How the learner set it: ``--flag`` on the command line, else ``Config.field``."""
    flag = _flag(name)
    return f"Config.{name}" if flag is None else f"--{flag}"


def field_docs() -> dict:
    """``{field: docstring}``: the string under each field of :class:`Config`, its help
    text on the command line too."""
    global _DOCS
    if _DOCS is None:
        import ast
        import inspect
        import textwrap

        body = ast.parse(textwrap.dedent(inspect.getsource(Config))).body[0].body
        _DOCS = {}
        for field, doc in zip(body, body[1:]):
            if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr) \
                    and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                _DOCS[field.target.id] = inspect.cleandoc(doc.value.value)
    return _DOCS


_DOCS = None


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
