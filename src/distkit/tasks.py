"""``Task``: everything about the *problem*; the kit keeps everything about *distribution*.

A task says which data, which model, which loss, which metrics, and which validation
metric decides "better" (early stopping and the best-model checkpoint follow it). It says
nothing about ranks, devices, samplers or DDP: :func:`distkit.training.training` adds
those, the same way for every task.

A course brings its own task in a module of its own (``course.py``)::

    import torch
    import torch.nn as nn
    from torch.utils.data import TensorDataset
    from ignite.metrics import MeanSquaredError
    from distkit import Task

    def make_datasets(config):            # runs in every process: no download here
        g = torch.Generator().manual_seed(config.seed)
        x = torch.randn(512, 8, generator=g)
        y = x @ torch.ones(8, 1) + 0.1 * torch.randn(512, 1, generator=g)
        return TensorDataset(x[:384], y[:384]), TensorDataset(x[384:], y[384:])

    def make_model(config):               # a plain module: the kit calls idist.auto_model
        return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def make_metrics():
        return {"mse": MeanSquaredError()}

    task = Task(datasets=make_datasets, model=make_model, loss=nn.MSELoss,
                metrics=make_metrics, score=("mse", "min"))

and trains it with ``distkit train --task course:task`` (``course.py`` in the current
folder) or ``--task path/to/course.py:task``, or from Python with
``distkit.run(Config(...), task=task)``.

Spawned processes receive the task by pickling, which stores each function by its module
and name: define them at the top level of a module (a script guarded by
``if __name__ == "__main__":`` works too), not as lambdas or nested functions.

The built-in datasets x models (``--dataset`` / ``--model``) are tasks too, in
:data:`BUILTIN_TASKS`.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from distkit.errors import DistkitError

SCORE_MODES = ("min", "max")


def accuracy_metrics() -> dict:
    """The default metrics: ``{"accuracy": ignite.metrics.Accuracy()}``."""
    from ignite.metrics import Accuracy

    return {"accuracy": Accuracy()}


def cross_entropy():
    """The default loss: ``nn.CrossEntropyLoss()``."""
    import torch.nn as nn

    return nn.CrossEntropyLoss()


def sgd(params, config):
    """The default optimizer: SGD with ``config.lr``, ``config.momentum`` and
    ``config.weight_decay`` (the lr schedule then drives the lr)."""
    import torch

    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


@dataclass
class Task:
    """A training problem: data, model, loss, metrics and the score to follow.

    - ``datasets(config) -> (train_dataset, val_dataset)``: plain map-style torch
      Datasets; the kit shards them (``idist.auto_dataloader``). Called in every process.
    - ``model(config) -> nn.Module``: plain; the kit seeds every rank alike before calling
      it, then wraps it (``idist.auto_model``).
    - ``loss() -> nn.Module``: default ``nn.CrossEntropyLoss``.
    - ``metrics() -> {name: ignite Metric}``: computed on the validation set, reported as
      ``val_<name>``; a ``"loss"`` metric (the task's loss) is always added.
    - ``score=(name, "min" | "max")``: the validation metric that early stopping and the
      best-model checkpoint follow; default ``("loss", "min")``.
    - ``optimizer(params, config) -> torch.optim.Optimizer``: default SGD from the config.
    - ``name``: how results, checkpoints and messages call the task (default:
      ``module:attr``, where its module holds it).
    - ``summary(model, config) -> dict``: optional; called on every rank after training
      (a collective under fsdp), its values go to results.json's ``"task_summary"`` and
      the end-of-run summary (the text task: a sampled line).

    Example::

        >>> import torch.nn as nn
        >>> from distkit.data import get_datasets
        >>> from distkit.tasks import Task
        >>> def mlp(config):
        ...     return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> task = Task(datasets=get_datasets, model=mlp, score=("accuracy", "max"))
        >>> task.metric_names()
        ['accuracy', 'loss']
    """

    datasets: Callable
    model: Callable
    loss: Callable = cross_entropy
    metrics: Callable = accuracy_metrics
    score: tuple = ("loss", "min")
    optimizer: Callable = sgd
    name: str = ""
    summary: Optional[Callable] = None

    def __post_init__(self):
        if self.summary is not None and not callable(self.summary):
            raise DistkitError(f"Task(summary=...) must be a function, got "
                               f"{type(self.summary).__name__}: pass the function itself")
        for field in ("datasets", "model", "loss", "metrics", "optimizer"):
            if not callable(getattr(self, field)):
                raise DistkitError(
                    f"Task({field}=...) must be a function, got {type(getattr(self, field)).__name__}: "
                    f"pass the function itself, e.g. Task({field}=make_{field})")
        if not isinstance(self.loss, type) and hasattr(self.loss, "parameters"):
            # nn.MSELoss() is callable too, but calling it with no arguments fails later
            name = type(self.loss).__name__
            raise DistkitError(f"Task(loss={name}()) is a loss module; pass what makes one: "
                               f"Task(loss=nn.{name}) (no parentheses)")
        score = tuple(self.score) if isinstance(self.score, (tuple, list)) else ()
        if len(score) != 2 or not isinstance(score[0], str) or score[1] not in SCORE_MODES:
            raise DistkitError(f"Task(score={self.score!r}) must be (metric name, 'min' or 'max'), "
                               "e.g. score=('mse', 'min')")
        self.score = score
        if not self.name:
            self.name = getattr(self.model, "__module__", None) or "task"

    def build_metrics(self, criterion) -> dict:
        """The validation metrics: the task's own, plus ``"loss"`` (the task's loss)
        unless the task defines one; checks that the score names one of them."""
        from ignite.metrics import Loss

        metrics = dict(self.metrics())
        metrics.setdefault("loss", Loss(criterion))
        if self.score[0] not in metrics:
            raise DistkitError(
                f"task {self.name!r}: score {self.score[0]!r} is not one of its metrics "
                f"({', '.join(metrics)}): name one of them in Task(score=(name, mode))")
        return metrics

    def check(self) -> "Task":
        """Build its loss and metrics once, so a score naming no metric fails in one line
        before any process starts; returns the task."""
        self.build_metrics(self.loss())
        return self

    def metric_names(self) -> list:
        """The names its validation metrics are reported under (without ``val_``)."""
        names = list(self.metrics())
        return names if "loss" in names else names + ["loss"]

    def sign(self) -> float:
        """+1 if a larger score is better, -1 if a smaller one is."""
        return 1.0 if self.score[1] == "max" else -1.0


# --- the built-in tasks: every dataset of distkit.data x every model of distkit.models ----

def _builtin_datasets(dataset: str, config):
    from distkit.data import get_datasets

    return get_datasets(dataclasses.replace(config, dataset=dataset))


def _builtin_model(dataset: str, model: str, config):
    from distkit.data import dataset_info
    from distkit.models import get_model

    return get_model(model, **dataset_info(dataset))


def builtin_task(dataset: str, model: str) -> Task:
    """The task for ``--dataset dataset --model model``: classification, cross-entropy,
    accuracy, early stopping on the validation loss (as ``distkit train`` always did).
    ``text`` x ``gpt``: next-character prediction (cross entropy and accuracy over every
    position, AdamW, a sampled line at the end; :mod:`distkit.text`)."""
    datasets, net = partial(_builtin_datasets, dataset), partial(_builtin_model, dataset, model)
    if dataset == "text":
        from distkit import text

        return Task(datasets=datasets, model=net, loss=text.TokenCrossEntropy,
                    metrics=text.token_metrics, optimizer=text.adamw, name=f"{dataset}/{model}",
                    summary=text.text_summary)
    return Task(datasets=datasets, model=net, name=f"{dataset}/{model}")


def _registry() -> dict:
    from distkit.config import builtin_pairs

    return {(d, m): builtin_task(d, m) for d, m in builtin_pairs()}


BUILTIN_TASKS: dict = _registry()
"""``{(dataset, model): Task}`` for the built-in datasets and models."""


# --- a task by name -------------------------------------------------------------------

def resolve_task(spec) -> Task:
    """The task meant by ``spec``: a :class:`Task` (returned as is); a config (its
    ``task`` if set, else the built-in task for its ``dataset`` and ``model``); or a
    string ``"module:attr"`` (module importable from the current folder) or
    ``"path/to/file.py:attr"``. Anything else fails in one line.

    Example::

        >>> from distkit.config import Config
        >>> from distkit.tasks import resolve_task
        >>> resolve_task(Config(dataset="digits", model="mlp")).name
        'digits/mlp'
        >>> resolve_task("distkit.tasks:NO_SUCH_TASK")
        Traceback (most recent call last):
        ...
        distkit.errors.DistkitError: --task 'distkit.tasks:NO_SUCH_TASK': module 'distkit.tasks' has no attribute 'NO_SUCH_TASK': name a Task defined at its top level
    """
    if isinstance(spec, Task):
        return _named(spec)
    if isinstance(spec, str):
        return load_task(spec)
    if hasattr(spec, "dataset") and hasattr(spec, "model"):  # a Config
        if getattr(spec, "task", None):
            return load_task(spec.task)
        try:
            return BUILTIN_TASKS[(spec.dataset, spec.model)]
        except KeyError:
            raise DistkitError(f"no built-in task for --dataset {spec.dataset} --model {spec.model}: "
                               "pick them from distkit train --help, or pass --task module:attr") from None
    raise DistkitError(f"task {spec!r} is a {type(spec).__name__}: pass a distkit.Task, a Config or "
                       "'module:attr'")


def load_task(spec: str) -> Task:
    """Import ``"module:attr"`` or ``"path/to/file.py:attr"`` and return that Task."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise DistkitError(f"--task {spec!r} is not module:attr: pass e.g. --task course:task "
                           "(course.py in the current folder) or --task path/to/course.py:task")
    module = _import(spec, module_name)
    if not hasattr(module, attr):
        raise DistkitError(f"--task {spec!r}: module {module.__name__!r} has no attribute {attr!r}: "
                           "name a Task defined at its top level")
    task = getattr(module, attr)
    if not isinstance(task, Task):
        raise DistkitError(f"--task {spec!r} is a {type(task).__name__}, not a distkit.Task: "
                           "point it at an object made with distkit.Task(...)")
    return _named(task)


def _named(task: Task) -> Task:
    """A task named by default (its module) gets the name ``module:attr`` under which its
    module holds it, the same whether it came by object, ``module:attr`` or a file path
    (a resumed run is checked against the task name its checkpoint records)."""
    module_name = getattr(task.model, "__module__", None)
    if task.name != module_name or module_name not in sys.modules:
        return task  # named by its author, or a built-in task
    attr = next((k for k, v in vars(sys.modules[module_name]).items() if v is task), None)
    return dataclasses.replace(task, name=f"{module_name}:{attr}") if attr else task


def _import(spec: str, module_name: str):
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise DistkitError(f"--task {spec!r}: no such file {str(path)!r}: pass the path of "
                               "the .py file that defines the task")
        folder, name = str(path.parent), path.stem
        with _on_path(folder):  # spawned processes inherit sys.path, so they import it too
            module = _import_module(spec, name)
            if Path(getattr(module, "__file__", "") or "").resolve() != path:
                raise DistkitError(f"--task {spec!r}: the name {name!r} is already taken by "
                                   f"{getattr(module, '__file__', None) or 'a built-in module'}: "
                                   "rename the file")
        return module
    with _on_path(os.getcwd()):  # `distkit` as a console script does not search the cwd
        return _import_module(spec, module_name)


@contextmanager
def _on_path(folder: str):
    """``folder`` first on ``sys.path``; it stays there only if the block succeeds. A
    refused spec must not leave its folder behind: a file named like a standard module
    (``json.py``) would shadow that module in every process started afterwards."""
    added = folder not in sys.path and not (folder == os.getcwd() and "" in sys.path)
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    except BaseException:
        if added and folder in sys.path:
            sys.path.remove(folder)
        raise


def _import_module(spec: str, name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.split(".")[0] != e.name.split(".")[0] and not name.startswith(e.name):
            raise DistkitError(f"--task {spec!r}: importing {name!r} failed: {e}: install "
                               f"{e.name!r} or fix the import") from None
        raise DistkitError(f"--task {spec!r}: no module {name!r} importable from "
                           f"{os.getcwd()!r}: run from the folder that holds {name}.py, or pass "
                           f"--task path/to/{name.split('.')[-1]}.py:attr") from None
    except DistkitError:
        raise
    except Exception as e:  # the course module itself is broken: name it and the error
        raise DistkitError(f"--task {spec!r}: importing {name!r} raised "
                           f"{type(e).__name__}: {e}: fix that module") from None
