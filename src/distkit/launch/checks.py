"""The one place that decides whether a run may start: every check of a run's settings,
named, in one order, run by :func:`check_run`.

A wrong input ends here in one line (a :class:`~distkit.errors.DistkitError` whose
``check`` field names the check that refused), within seconds, with nothing started
and nothing half-written. The checks, in the order they run (:data:`CHECKS`):

========================  ==========  =====================================================
name                      scope       what it refuses (where its body lives)
========================  ==========  =====================================================
``process_settings``      processes   a backend, count, node, port, timeout or thread count
                                      out of range (``Config.validate_processes``)
``launch``                processes   a backend that cannot run here, a process count,
                                      address or port that cannot work (:func:`check_launch`)
``training_settings``     training    a dataset, model, logger, strategy or number out of
                                      range, NaN or inf; a global batch that does not split
                                      over the world the launch settled
                                      (``Config.validate_training``)
``task``                  training    a task that cannot be built or scored, an unknown
                                      ``--set`` name or a value of the wrong type
                                      (``distkit.tasks.configured_task``)
``flags_reach_task``      training    a flag with nothing to act on in the task
                                      (``distkit.train.effective.check_settings``)
``strategy_on_backend``   training    ``--strategy fsdp`` on the backend ``auto`` became
``synthetic_memory``      training    a synthetic set too large for this machine's memory
``checkpoint_fits``       training    a checkpoint to resume from that is missing, damaged,
                                      finished, of another model or of other settings
``max_iters_after_resume`` training   ``--max-iters`` at or below the resumed iteration
``download``              training    a dataset that needs a download this machine cannot do
``sizes``                 training    empty sets, a world or batch larger than the data
``output_dir``            training    an output folder that cannot be written
``agreement``             ranks       ranks whose settings differ from rank 0's
========================  ==========  =====================================================

The checks of scope ``processes`` are all that :func:`~distkit.launch.entry.launch_function`
has (a function, no training settings); ``distkit train`` and :func:`~distkit.launch.entry.run`
run every check of scopes ``processes`` and ``training`` before any process starts.
``agreement`` needs the process group: every rank runs it inside
:func:`distkit.train.training.training`, before the first step (its body,
:func:`distkit.train.agreement.check_in_ranks`, sits below this module so training can
call it; it is listed here so the order is read in one place)::

    >>> from distkit.config import Config
    >>> plan = check_run(Config(backend="gloo"), spawning=True)
    >>> plan.config.backend, plan.config.nproc_per_node, plan.launch.world_size
    ('gloo', 2, 2)
    >>> [c.name for c in CHECKS][:3]
    ['process_settings', 'launch', 'training_settings']
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Callable

import ignite.distributed as idist
import torch

from distkit.builtin.data import VAL_SIZE, fetch_torchvision
from distkit.checkpoint.saver import (check_checkpoint_fits, check_output_dir, recorded_iteration,
                                      resolve_resume_from)
from distkit.compat.shims import pjrt_nprocs, xla_local_device_count
from distkit.config import check_strategy
from distkit.errors import DistkitError
from distkit.host.facts import (available_memory, check_address_resolves, check_port_free, free_port,
                                in_ipython, tpu_available)
from distkit.host.layout import (check_not_sbatch_without_srun, elastic, inside_launch,
                                 launched_externally, local_world_size, world_layout)
from distkit.tasks import configured_task, resolve_task
from distkit.train import agreement, effective

CPU_DEFAULT_NPROC = 2


def resolve_backend(backend: str) -> str:
    """Turn ``auto`` into nccl (CUDA), xla-tpu (TPU) or gloo, and check that the chosen
    backend can run here."""
    if backend == "auto":
        if torch.cuda.is_available():
            return "nccl"
        if tpu_available():
            return "xla-tpu"
        return "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise DistkitError("--backend nccl needs CUDA GPUs and none is visible here: "
                           "use --backend gloo (CPU) or --backend auto")
    if backend == "xla-tpu":
        try:
            import torch_xla  # noqa: F401
        except Exception:
            raise DistkitError("--backend xla-tpu needs torch_xla, which is not importable: "
                               "pip install -r requirements-xla.txt in its own environment "
                               "(scripts/make_xla_env.sh; on a Colab TPU, notebook 03), or use --backend auto") from None
    if backend not in ("none",) and backend not in idist.available_backends():
        raise DistkitError(f"backend {backend!r} is not available in this torch build "
                           f"(available: {', '.join(idist.available_backends())}): use --backend auto")
    return backend


def default_nproc(backend: str) -> int:
    if backend == "nccl":
        return torch.cuda.device_count()
    if backend == "xla-tpu":
        # PJRT replicates over every device of the host (TPU v2/v3: 2 per chip, v4+: 1;
        # XLA:CPU: CPU_NUM_DEVICES, default 1); xmp.spawn takes 1 or all of them.
        return xla_local_device_count()
    if backend == "none":
        return 1  # one plain process, no process group
    return CPU_DEFAULT_NPROC


# Peak memory per sample while the synthetic set is built (templates[labels], the noise,
# their sum, labels, permutation; measured: 787 bytes per 1x8x8 sample with torch 2.15).
SYNTHETIC_BYTES_PER_SAMPLE = 800


def check_synthetic_fits_in_memory(config, processes: int | None) -> None:
    """Every process builds the whole synthetic set in memory: refuse a size that cannot
    fit, instead of swapping the machine to a halt."""
    if config.dataset != "synthetic":
        return
    processes = max(1, processes or 1)
    need = (config.dataset_size + VAL_SIZE) * SYNTHETIC_BYTES_PER_SAMPLE * processes
    have = available_memory()
    if have is not None and need > have:
        fits = max(1, have // (SYNTHETIC_BYTES_PER_SAMPLE * processes) - VAL_SIZE)
        raise DistkitError(
            f"--dataset-size {config.dataset_size} needs about {need / 2**30:.1f} GiB of memory "
            f"({processes} process(es) each build the synthetic set) and {have / 2**30:.1f} GiB "
            f"are available: use --dataset-size {fits} or less")


@dataclass
class Launch:
    """How the processes of a run start, settled by :func:`check_launch` before any does:
    what the process-start core of :mod:`distkit.launch.entry` needs, and nothing of training."""

    backend: str
    """Resolved: nccl, xla-tpu, gloo or none (never auto)."""
    spawning: bool
    """True: this launcher starts ``nproc_per_node`` processes; False: join torchrun/SLURM."""
    nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    timeout_s: float = 120.0
    threads_per_process: int | None = None
    verbose: bool = False

    def replace(self, **changes) -> "Launch":
        return dataclasses.replace(self, **changes)

    @property
    def world_size(self) -> int:
        if self.spawning:
            return self.nproc_per_node * self.nnodes
        return world_layout().world_size  # as torchrun or srun set it


def check_launch(config, spawning: bool | None = None) -> Launch:
    """The launch checks: the backend (``auto`` resolved), the process count, the master
    address and port (a free one picked on a single node). Reads only the process fields
    of ``config`` (``Config`` or any object with them); changes nothing in it.
    ``spawning`` None: spawn unless torchrun / SLURM launched this process (and no
    ``nproc_per_node`` was asked for)."""
    nproc = config.nproc_per_node
    if spawning is None:
        spawning = nproc is not None or not launched_externally()
    if not spawning:
        check_not_sbatch_without_srun()  # one process of a job of several tasks: say so now
    if nproc is not None and inside_launch():
        raise DistkitError(
            f"--nproc-per-node {nproc} inside a torchrun/SLURM launch, which "
            "starts the processes itself: drop --nproc-per-node (torchrun's --nproc_per_node "
            "sets the count), or run distkit train without torchrun")
    backend = resolve_backend(config.backend)
    if spawning and nproc is None:
        nproc = default_nproc(backend)
    if backend == "nccl" and nproc is not None and nproc > torch.cuda.device_count():
        raise DistkitError(f"--nproc-per-node {nproc} with nccl needs {nproc} GPUs but this node "
                           f"has {torch.cuda.device_count()}: use --nproc-per-node "
                           f"{torch.cuda.device_count()} or fewer")
    if backend == "xla-tpu" and nproc not in (None, 1):
        pjrt_nprocs(nproc, xla_local_device_count())  # 1 or every device, else one line
    if backend == "none" and nproc not in (None, 1):
        raise DistkitError(f"--backend none runs one plain process, not {nproc}: use "
                           "--backend gloo to start several")
    if config.master_addr is not None:
        check_address_resolves(config.master_addr)
    port = config.master_port
    if spawning:
        if config.nnodes == 1 and port is None:
            port = free_port()
        elif config.node_rank in (None, 0) and port is not None:
            check_port_free(port)
    return Launch(backend=backend, spawning=spawning, nproc_per_node=nproc, nnodes=config.nnodes,
                  node_rank=config.node_rank, master_addr=config.master_addr, master_port=port,
                  timeout_s=config.timeout_s, threads_per_process=config.threads_per_process,
                  verbose=config.verbose)


def restarted_by_torchrun() -> bool:
    """True in a worker group that ``torchrun --max-restarts`` started again after a
    failure (``TORCHELASTIC_RESTART_COUNT`` > 0): the same command, the same run."""
    return elastic().restart_count > 0


def dataset_sizes(config, task=None) -> tuple[int, int] | None:
    """``(training samples, validation samples)`` of ``task`` (default: the config's),
    built once here as every process will build them; None where they have no length or
    building them fails (the ranks then report it as they would)."""

    try:
        train_set, val_set = resolve_task(task if task is not None else config).datasets(config)
        return len(train_set), len(val_set)
    except DistkitError:
        raise
    except Exception:
        return None


def check_sizes(config, world_size: int, task=None) -> None:
    """Refuse, in one line before any process starts, sizes that would train on nothing
    or on something else than asked: an empty training or validation set, a world larger
    than the training set (``DistributedSampler`` would pad every rank's share with
    repeated samples), a global batch larger than the training set (one step an epoch,
    of fewer samples than the batch the records say)::

        >>> from distkit.config import Config
        >>> check_sizes(Config(batch_size=4096), world_size=2)
        Traceback (most recent call last):
        ...
        distkit.errors.DistkitError: global --batch-size 4096 is larger than the training set of 'digits/cnn' (1437 samples): an epoch would be one step of 1437 samples; use --batch-size 1436 or less (the default is 64)
    """
    sizes = dataset_sizes(config, task)
    if sizes is None:
        return

    name = resolve_task(task if task is not None else config).name
    n_train, n_val = sizes
    for what, n in (("training", n_train), ("validation", n_val)):
        if n == 0:
            raise DistkitError(
                f"the {what} set of {name!r} is empty (0 samples): nothing to "
                f"{'train on' if what == 'training' else 'validate on'}; check the task's "
                "datasets(config) (its data, its --set settings, --data-dir)")
    if world_size > n_train:
        raise DistkitError(
            f"the world size {world_size} is larger than the training set of {name!r} "
            f"({n_train} samples): some processes would train on repeated samples only; use "
            f"{n_train} processes or fewer in all")
    if config.batch_size > n_train:
        default = type(config).__dataclass_fields__["batch_size"].default
        fits = n_train // world_size * world_size
        raise DistkitError(
            f"global --batch-size {config.batch_size} is larger than the training set of "
            f"{name!r} ({n_train} samples): an epoch would be one step of {n_train} samples; "
            f"use --batch-size {fits} or less (the default is {default})")


# More processes than this many per core is "far more": each runs its own interpreter,
# torch and copy of the data, and they take turns on the cores.
OVERSUBSCRIBED = 4


def process_memory() -> int | None:
    """Bytes this process holds for itself now (resident less shared pages,
    ``/proc/self/statm``): roughly what one more process of the kit, with torch and
    ignite imported and the data built, holds (the shared libraries are counted once)."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def oversubscription_warning(nproc: int | None, cores: int | None = None) -> str | None:
    """A warning (one line) when ``nproc`` processes on this node are far more than its
    cores, with an estimate of the memory they take and what is available. A warning, not
    a refusal: a larger world than the machine's cores can be worth rehearsing, and the
    estimate is rough (forked processes share pages)::

        >>> oversubscription_warning(4, cores=2) is None
        True
        >>> oversubscription_warning(64, cores=2)  # doctest: +ELLIPSIS
        '--nproc-per-node 64 on 2 cores: 32 processes per core take turns ... GiB of memory ...'
    """
    if not nproc:
        return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if nproc <= OVERSUBSCRIBED * cores:
        return None
    each = process_memory() or 0
    have = available_memory()
    estimate = (f"about {nproc * each / 2**30:.1f} GiB of memory ({nproc} x {each / 2**20:.0f} "
                "MiB, what this process holds for itself)"
                + (f", {have / 2**30:.1f} GiB available" if have is not None else ""))
    return (f"--nproc-per-node {nproc} on {cores} cores: {nproc // cores} processes per core "
            f"take turns (each step waits for the slowest), in {estimate}; use "
            f"--nproc-per-node {cores} for speed, more only to rehearse a larger world")


def check_picklable(what: str, obj) -> None:
    """Spawned processes receive their function and arguments pickled; fail in one line
    here rather than in every child. (Forked processes, as in notebooks, need no pickle.)"""
    if in_ipython():
        return
    try:
        pickle.dumps(obj)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DistkitError(
            f"{what} cannot be sent to spawned processes ({why}): define its functions at the "
            "top level of an importable module, or of a script run under an "
            "`if __name__ == \"__main__\":` guard, not as lambdas or nested functions") from None


@dataclass
class Plan:
    """What the checks settle, passed from one to the next: the config as it will train
    (backend and process count resolved, ``--resume-from latest`` replaced by its file,
    the task's settings complete), the task, and the :class:`Launch`."""

    config: object
    task: object = None
    spawning: bool | None = None
    launch: Launch | None = None


@dataclass(frozen=True)
class Check:
    name: str
    scope: str
    """``processes`` (any launch), ``training`` (a training run), ``ranks`` (inside the
    process group)."""
    body: Callable


def _task(plan):
    plan.task, plan.config = configured_task(
        plan.task if plan.task is not None else plan.config, plan.config)


def _process_settings(plan):
    plan.config.validate_processes()


def _training_settings(plan):
    launch = plan.launch
    # the global batch on the world the launch settled (torchrun's and SLURM's too)
    world = launch.world_size if launch.spawning or world_layout().launcher != "none" else None
    plan.config.validate_training(world)
    plan.config = dataclasses.replace(plan.config, backend=launch.backend,
                                      nproc_per_node=launch.nproc_per_node)


def _flags_reach_task(plan):
    effective.check_settings(plan.task, plan.config)


def _launch(plan):
    plan.launch = check_launch(plan.config, plan.spawning)
    plan.spawning = plan.launch.spawning
    if plan.spawning:  # a warning, not a refusal: a large world can be worth rehearsing
        warning = oversubscription_warning(plan.launch.nproc_per_node)
        if warning:
            print(f"distkit: warning: {warning}", file=sys.stderr, flush=True)


def _strategy_on_backend(plan):
    # training_settings checked it against the backend asked for, which may be auto
    check_strategy(plan.config.strategy, plan.launch.backend)


def _synthetic_memory(plan):
    launch = plan.launch
    check_synthetic_fits_in_memory(
        plan.config, launch.nproc_per_node if launch.spawning else local_world_size())


def _checkpoint_fits(plan):
    config = plan.config
    if not config.resume_from and restarted_by_torchrun():
        # the same run, started again: it goes on from its newest checkpoint by itself
        config = dataclasses.replace(config, resume_from="latest")
    if config.resume_from == "latest":  # the newest checkpoint under --output-dir, if any
        config = resolve_resume_from(config)
    if config.resume_from:
        check_checkpoint_fits(config.resume_from, config, plan.task, plan.launch.world_size)
    plan.config = config


def _max_iters_after_resume(plan):
    config = plan.config
    if config.resume_from and config.max_iters is not None:
        done = recorded_iteration(config.resume_from)
        if config.max_iters <= done:
            raise DistkitError(
                f"--max-iters {config.max_iters} is not beyond the {done} iterations "
                f"{config.resume_from!r} already holds: nothing is left to train; use "
                f"--max-iters {done + 1} or more, or drop --max-iters")


def _download(plan):
    config, launch = plan.config, plan.launch
    if launch.spawning and config.dataset in ("mnist", "cifar10") and config.task is None:
        # Download once here, before any process starts, so an offline machine fails fast.
        fetch_torchvision(config.dataset, config.data_dir)


def _sizes(plan):
    check_sizes(plan.config, plan.launch.world_size, plan.task)


def _output_dir(plan):
    check_output_dir(plan.config.output_dir)


def _agreement(plan):
    agreement.check_in_ranks(plan.config, plan.task)


CHECKS = (
    Check("process_settings", "processes", _process_settings),
    Check("launch", "processes", _launch),
    Check("training_settings", "training", _training_settings),
    Check("task", "training", _task),
    Check("flags_reach_task", "training", _flags_reach_task),
    Check("strategy_on_backend", "training", _strategy_on_backend),
    Check("synthetic_memory", "training", _synthetic_memory),
    Check("checkpoint_fits", "training", _checkpoint_fits),
    Check("max_iters_after_resume", "training", _max_iters_after_resume),
    Check("download", "training", _download),
    Check("sizes", "training", _sizes),
    Check("output_dir", "training", _output_dir),
    Check("agreement", "ranks", _agreement),
)
"""Every check, in the order it runs."""


def check_run(config, task=None, spawning: bool | None = None, scopes=("processes", "training"),
              ) -> Plan:
    """Run the checks of ``scopes`` in :data:`CHECKS`' order on a copy of ``config`` (the
    caller's is left as it was); the first that refuses raises its ``DistkitError``, with
    ``check`` set to its name. Returns the :class:`Plan` the launcher starts.
    ``spawning`` None: spawn unless torchrun / SLURM launched this process."""
    plan = Plan(config=dataclasses.replace(config), task=task, spawning=spawning)
    for check in CHECKS:
        if check.scope not in scopes:
            continue
        try:
            check.body(plan)
        except DistkitError as e:
            e.check = check.name
            raise
    return plan


def preflight(config, spawning: bool | None = None, task=None):
    """Every check before a process starts (:func:`check_run`), for notebooks that show a
    refusal: returns the config as it will train and the :class:`Launch`; the caller's
    config is left as it was."""
    plan = check_run(config, task, spawning)
    return plan.config, plan.launch
