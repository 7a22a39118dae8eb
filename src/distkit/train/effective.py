"""Which settings of a run act on its task: refuse the ones that would not, record the ones
that do.

A course's task brings its own data, model, optimizer, schedule and step; some of
``distkit train``'s flags then have nothing to act on. Every field of :class:`Config` is
in one of the groups below (``tests/tasks/test_foreign_code.py`` fails for a field in none):

- :data:`PROCESS_FIELDS`: how the processes start; the launcher uses them for every task;
- :data:`BUILTIN_ONLY`: they choose a built-in task (``--dataset``, ``--model``,
  ``--dataset-size``); given with a task of one's own they are refused;
- :data:`OPTIMIZER_FIELDS` (``--lr``, ``--warmup-epochs``, ``--scale-lr``,
  ``Config.momentum``, ``Config.weight_decay``): they act only where they reach the
  optimizer or the schedule the task trains with. The kit finds out by building the
  task's optimizer and schedule on a stand-in parameter twice, with the value and with
  another one: if nothing differs, the value is refused in one line (when given) and
  left out of ``results.json``'s config;
- :data:`TRAINING_FIELDS`: the kit acts on them for any task (epochs, global batch,
  seed, ``--amp`` — bfloat16 autocast around the kit's step or around the task's own
  ``train_step`` —, early stopping, checkpoints, output...). ``--early-stopping-min-delta``
  without a patience is refused; ``--peak-flops`` with a model that counts no FLOPs is
  refused by each rank before training.

Everything here runs in the launcher, before any process starts.
"""
from __future__ import annotations

import dataclasses
import re

from distkit.config import PROCESS_FIELDS, Config, _label
from distkit.errors import DistkitError
from distkit.train.schedules import (check_lr_scheduler, dummy_optimizer, schedule_kind,
                               task_lr_scheduler)

BUILTIN_ONLY = ("dataset", "model", "dataset_size")
OPTIMIZER_FIELDS = ("lr", "scale_lr", "warmup_epochs", "momentum", "weight_decay")
TRAINING_FIELDS = ("data_dir", "strategy", "task", "task_settings", "epochs", "batch_size",
                   "num_workers", "persistent_workers", "seed", "amp", "early_stopping_patience",
                   "early_stopping_min_delta", "profile", "trace", "progress_bar", "verbose", "logger",
                   "output_dir", "checkpoint_every", "resume_from", "max_iters", "peak_flops")
"""Fields the kit acts on for every task (data_dir reaches the task's functions as
``config.data_dir``, for a task that downloads)."""
DEFAULTS = Config()


def is_builtin(task) -> bool:
    from distkit.tasks import BUILTIN_TASKS

    return task.name in {t.name for t in BUILTIN_TASKS.values()}


def _fingerprint(task, config) -> str | None:
    """What the task's optimizer and schedule are, built from ``config`` on a stand-in
    parameter (None: they cannot be built without the real model)."""
    try:
        optimizer = dummy_optimizer(task, config)
        scheduler = None
        if schedule_kind(task) != "none":
            built, _ = task_lr_scheduler(task, config, optimizer, 100)
            scheduler = built.state_dict()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    except Exception:
        return None
    return re.sub(r" at 0x[0-9a-f]+", "", repr((groups, scheduler)))


def _other_value(name: str, config):
    value = getattr(config, name)
    if name == "lr":
        return value * 2
    if name == "momentum":
        return 0.5 if value != 0.5 else 0.25
    if name == "weight_decay":
        return value + 0.01
    if name == "warmup_epochs":
        return value + 0.5 if value + 0.5 <= config.epochs else value / 2
    raise KeyError(name)


def reaches(task, config, name: str) -> bool | None:
    """Does setting ``name`` change the optimizer or the schedule ``task`` trains with?
    None when the kit cannot tell (the task's factories need its real model)."""
    if name == "scale_lr":  # the linear scaling rule is the kit's schedule's
        return schedule_kind(task) == "kit"
    here = _fingerprint(task, config)
    there = _fingerprint(task, dataclasses.replace(config, **{name: _other_value(name, config)}))
    if here is None or there is None:
        return None
    return here != there


def _given(config, name: str) -> bool:
    return getattr(config, name) != getattr(DEFAULTS, name)


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_settings(task, config) -> None:
    """Refuse, in one line, a setting that would not act on ``task`` (see the module's
    docstring), and a task schedule the kit could not step. Call in the launcher."""
    check_lr_scheduler(task, config)
    if not is_builtin(task):
        for name in BUILTIN_ONLY:
            if _given(config, name):
                flag = _label(name)
                raise DistkitError(
                    f"{flag} {getattr(config, name)}: task {task.name!r} brings its own datasets "
                    f"and model, and {flag} chooses a built-in one: drop {flag} (or drop "
                    "--task to train the built-in task)")
    if config.early_stopping_min_delta and not config.early_stopping_patience:
        raise DistkitError(
            f"--early-stopping-min-delta {config.early_stopping_min_delta:g} does nothing without "
            "--early-stopping-patience: give a patience (e.g. --early-stopping-patience 3) or "
            "drop --early-stopping-min-delta")
    for name in OPTIMIZER_FIELDS:
        if _given(config, name) and reaches(task, config, name) is False:
            raise DistkitError(f"{_label(name)} {_shown(getattr(config, name))}: "
                               f"{_not_used_because(task, config, name)}")


def _not_used_because(task, config, name: str) -> str:
    kind = schedule_kind(task)
    try:
        optimizer = dummy_optimizer(task, config)
        opt = f"{type(optimizer).__name__}, lr {optimizer.param_groups[0]['lr']:g}"
    except Exception:
        opt = "its own"
    flag = _label(name)
    if name in ("warmup_epochs", "scale_lr"):
        if kind == "task":
            return (f"only the kit's schedule uses it, and task {task.name!r} trains with its own "
                    f"lr_scheduler: drop {flag}, or read config.{name} in that lr_scheduler")
        return (f"only the kit's schedule uses it, and task {task.name!r} keeps its optimizer's "
                f"lr ({opt}): drop {flag}, or ask for the kit's schedule with "
                "Task(lr_scheduler='kit')")
    what = "learning rate" if name == "lr" else name.replace("_", " ")
    if kind == "task":
        return (f"task {task.name!r}'s optimizer ({opt}) and its own lr_scheduler set the {what}, "
                f"and {flag} reaches neither: drop {flag}, or read config.{name} in the task's "
                "optimizer or lr_scheduler")
    return (f"task {task.name!r}'s optimizer ({opt}) sets the {what}, and {flag} does not reach "
            f"it: drop {flag}, or read config.{name} in the task's optimizer")


def effective_config(config, task) -> dict:
    """``config`` as results.json records it: the settings that acted on this run. With a
    task of its own: its name under ``task``, no built-in dataset or model, and no
    optimizer setting that reaches neither its optimizer nor its schedule."""
    record = config.to_dict()
    if task is None:
        return record
    if not is_builtin(task):
        for name in BUILTIN_ONLY:
            record.pop(name, None)
        record["task"] = task.name
    for name in OPTIMIZER_FIELDS:
        if reaches(task, config, name) is False:
            record.pop(name, None)
    return record


def every_field_grouped() -> dict:
    """``{field: group}`` for every field of :class:`Config` (a field in no group is an
    error: a new flag must say whether it acts on a task of one's own)."""
    groups = {}
    for group, names in (("process", PROCESS_FIELDS | {"backend", "master_addr"}),
                         ("builtin", BUILTIN_ONLY), ("optimizer", OPTIMIZER_FIELDS),
                         ("training", TRAINING_FIELDS)):
        for name in names:
            groups[name] = group
    return {f.name: groups.get(f.name) for f in dataclasses.fields(Config)}
