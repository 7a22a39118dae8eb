"""Learning-rate schedules: the kit's, none, or a task's own, each stepped the way it was built.

A task's ``lr_scheduler(optimizer, config, epoch_length)`` may return:

- an ignite param scheduler (``PiecewiseLinear``, ``CosineAnnealingScheduler``, ignite's
  ``LRScheduler`` wrapper...): attached at ``ITERATION_STARTED``, as ignite's docs attach
  them (``Task(scheduler_step="epoch")``: at ``EPOCH_STARTED``);
- a bare torch scheduler. Its class says what it counts: ``OneCycleLR`` and ``CyclicLR``
  count batches (built from ``epoch_length``), so the kit wraps them in ignite's
  ``LRScheduler`` and steps them once per iteration; ``StepLR``, ``MultiStepLR``,
  ``ExponentialLR``, ``CosineAnnealingLR``, ``PolynomialLR`` count epochs, so they step
  once at each epoch's end, after that epoch's validation. Any other class (``LambdaLR``,
  ``LinearLR``, ``SequentialLR``, a subclass of one's own...) can be built either way:
  the task says which with ``Task(scheduler_step="iteration" | "epoch")``, or the run is
  refused in one line before any process starts (:func:`check_lr_scheduler`).

``results.json`` records which (``"scheduler_step"``), and ``"lr_trace"`` holds the lr
each iteration trained at::

    >>> import torch
    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    >>> steps_per(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10))
    'iteration'
    >>> steps_per(torch.optim.lr_scheduler.StepLR(opt, step_size=1))
    'epoch'
    >>> steps_per(torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)) is None
    True
"""
from __future__ import annotations

import ignite.distributed as idist
from ignite.engine import Events

from distkit.errors import DistkitError

SCHEDULER_STEPS = ("iteration", "epoch")
# torch.optim.lr_scheduler classes by what their arguments count (exact classes only: a
# subclass may count otherwise, and says so with Task(scheduler_step=...)).
PER_ITERATION = ("OneCycleLR", "CyclicLR")
PER_EPOCH = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "PolynomialLR")


def steps_per(scheduler) -> str | None:
    """``"iteration"`` or ``"epoch"``: what a torch scheduler's class counts; None where
    the class does not say (``LambdaLR``, ``LinearLR``, a subclass...)."""
    cls = type(scheduler)
    if cls.__module__ != "torch.optim.lr_scheduler":
        return None
    if cls.__name__ in PER_ITERATION:
        return "iteration"
    if cls.__name__ in PER_EPOCH:
        return "epoch"
    return None


def peak_lr(config, world_size: int) -> float:
    """The linear scaling rule (Goyal et al. 2017), when asked for."""
    return config.lr * world_size if config.scale_lr else config.lr


def create_lr_scheduler(config, optimizer, epoch_length: int):
    """Linear warm-up from 0 to the peak lr (if any), then linear decay to 0."""
    from ignite.handlers import PiecewiseLinear

    peak = peak_lr(config, idist.get_world_size())
    total = config.epochs * epoch_length
    warmup = min(int(config.warmup_epochs * epoch_length), total - 1)
    milestones = [(0, 0.0), (warmup, peak)] if warmup > 0 else [(0, peak)]
    milestones.append((total, 0.0))
    return PiecewiseLinear(optimizer, "lr", milestones_values=milestones)


class NoSchedule:
    """The lr schedule of a task that keeps its optimizer's lr: nothing to step, an empty
    state to checkpoint."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def schedule_kind(task) -> str:
    """``"kit"``, ``"none"`` or ``"task"``: which lr schedule ``task`` trains with. A task
    that brings its own optimizer keeps that optimizer's lr unless it asks for the kit's
    schedule (``Task(lr_scheduler="kit")``)."""
    from distkit.tasks import sgd

    if task.lr_scheduler is None:
        return "kit" if task.optimizer is sgd else "none"
    return task.lr_scheduler if isinstance(task.lr_scheduler, str) else "task"


def task_lr_scheduler(task, config, optimizer, epoch_length: int):
    """``(scheduler, event)``: the lr schedule ``task`` asks for (see :class:`distkit.Task`)
    and the trainer event that steps it (None: nothing to step). The scheduler is what
    the checkpoint saves under ``lr_scheduler``; a per-iteration torch scheduler comes
    back wrapped in ignite's ``LRScheduler`` (stepped at ``ITERATION_STARTED``, so the
    first batch trains at the schedule's first lr)::

        >>> import torch
        >>> from distkit import Config, Task
        >>> from distkit.builtin.data import get_datasets
        >>> def adam(params, config):
        ...     return torch.optim.Adam(params, lr=1e-3)
        >>> task = Task(datasets=get_datasets, model=torch.nn.Linear, optimizer=adam)
        >>> opt = adam(torch.nn.Linear(2, 1).parameters(), Config())
        >>> scheduler, event = task_lr_scheduler(task, Config(), opt, epoch_length=10)
        >>> type(scheduler).__name__, event, opt.param_groups[0]["lr"]
        ('NoSchedule', None, 0.001)
    """
    from torch.optim.lr_scheduler import LRScheduler as TorchLRScheduler
    from torch.optim.lr_scheduler import ReduceLROnPlateau
    from ignite.handlers import LRScheduler, ParamScheduler

    kind = schedule_kind(task)
    if kind == "kit":
        return create_lr_scheduler(config, optimizer, epoch_length), Events.ITERATION_STARTED
    if kind == "none":
        return NoSchedule(), None
    scheduler = task.lr_scheduler(optimizer, config, epoch_length)
    stated = getattr(task, "scheduler_step", None)
    if isinstance(scheduler, ParamScheduler):  # ignite's own, LRScheduler included
        return scheduler, Events.EPOCH_STARTED if stated == "epoch" else Events.ITERATION_STARTED
    if isinstance(scheduler, ReduceLROnPlateau):
        raise DistkitError(
            f"task {task.name!r}: its lr_scheduler returned ReduceLROnPlateau, which steps on a "
            "metric: use ignite's ReduceLROnPlateauScheduler attached to the evaluator in "
            "Task(handlers=...)")
    if not isinstance(scheduler, TorchLRScheduler):
        raise DistkitError(
            f"task {task.name!r}: its lr_scheduler returned a {type(scheduler).__name__}: return "
            "an ignite param scheduler (e.g. PiecewiseLinear) or a "
            "torch.optim.lr_scheduler.LRScheduler")
    step = stated or steps_per(scheduler)
    if step is None:
        name = type(scheduler).__name__
        raise DistkitError(
            f"task {task.name!r}: its lr_scheduler returned a {name}, which can count batches or "
            f"epochs, and the kit cannot tell which this one was built for: say so with "
            f"Task(scheduler_step='iteration') (one step per batch) or "
            f"Task(scheduler_step='epoch') (one step per epoch)")
    if step == "iteration":
        return LRScheduler(scheduler), Events.ITERATION_STARTED
    return scheduler, Events.EPOCH_COMPLETED


def scheduler_step(task, event) -> str | None:
    """What results.json records as ``"scheduler_step"``: ``"iteration"``, ``"epoch"`` or
    None (no schedule)."""
    if event is None:
        return None
    return "epoch" if event in (Events.EPOCH_COMPLETED, Events.EPOCH_STARTED) else "iteration"


def scheduler_name(scheduler) -> str | None:
    """The class the task's factory returned (inside ignite's wrapper, if the kit added one)."""
    if isinstance(scheduler, NoSchedule):
        return None
    inner = getattr(scheduler, "lr_scheduler", None)
    return type(inner if inner is not None and type(scheduler).__name__ == "LRScheduler"
                else scheduler).__name__


def dummy_optimizer(task, config):
    """The task's optimizer over one stand-in parameter: what its factory makes of
    ``config``, built in the launcher, with no model and no data."""
    import torch

    return task.optimizer([torch.nn.Parameter(torch.zeros(1))], config)


def check_lr_scheduler(task, config, epoch_length: int = 100) -> None:
    """Build the task's schedule once on a stand-in optimizer, so that a scheduler the kit
    cannot step (a ``LambdaLR`` with no ``Task(scheduler_step=...)``, a ``ReduceLROnPlateau``)
    is refused in one line before any process starts. A factory that cannot be built this
    way (it needs the real model) is checked in every rank instead."""
    if schedule_kind(task) != "task":
        return
    try:
        optimizer = dummy_optimizer(task, config)
    except Exception:
        return
    try:
        task_lr_scheduler(task, config, optimizer, epoch_length)
    except DistkitError:
        raise
    except Exception:
        return


class LrTrace:
    """The lr every iteration trained at (one in ``every`` kept, at most ~2000 values),
    read at ``ITERATION_STARTED`` after the schedule has set it."""

    def __init__(self, optimizer, planned_iterations: int, limit: int = 2000):
        self.optimizer = optimizer
        self.every = max(1, -(-planned_iterations // limit))
        self.first = None
        self.values: list = []

    def attach(self, trainer) -> "LrTrace":
        trainer.add_event_handler(Events.ITERATION_STARTED, self)
        return self

    def __call__(self, engine) -> None:
        i = engine.state.iteration
        if self.first is None:
            self.first = i
        if (i - self.first) % self.every == 0:
            self.values.append(self.optimizer.param_groups[0]["lr"])

    def record(self) -> dict:
        return {"first_iteration": self.first, "every": self.every, "lr": self.values}
