"""``Task``: everything about the *problem*; the kit keeps everything about *distribution*.

A task says which data, which model, which loss, which metrics, and which validation
metric decides "better" (early stopping and the best-model checkpoint follow it). It says
nothing about ranks, devices, samplers or DDP: :func:`distkit.train.training.training` adds
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
from typing import Any, Callable, Optional

from distkit.errors import DistkitError

SCORE_MODES = ("min", "max")


def cross_entropy():
    """The default loss: ``nn.CrossEntropyLoss()``."""
    import torch.nn as nn

    return nn.CrossEntropyLoss()


def prepare_xy(batch, device=None, non_blocking: bool = False):
    """The default ``prepare_batch``: ``(batch[0], batch[1])`` moved to ``device`` (ignite's
    ``convert_tensor``, so tensors, tuples and dicts of tensors all move). Like ignite's
    ``_prepare_batch``, but it also takes samples with more than two entries."""
    from ignite.utils import convert_tensor

    return (convert_tensor(batch[0], device=device, non_blocking=non_blocking),
            convert_tensor(batch[1], device=device, non_blocking=non_blocking))


def sgd(params, config):
    """The default optimizer: SGD with ``config.lr``, ``config.momentum`` and
    ``config.weight_decay`` (the lr schedule then drives the lr)."""
    import torch

    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


@dataclass
class Task:
    """A training problem: data, model, loss, metrics and the score to follow, plus, when a
    course needs them, its own batches, training step, schedule, handlers and settings.

    - ``datasets(config) -> (train_dataset, val_dataset)``: plain map-style torch
      Datasets; the kit shards them (``idist.auto_dataloader``). Called in every process.
    - ``model(config) -> nn.Module``: plain; the kit seeds every rank alike before calling
      it, then wraps it (``idist.auto_model``).
    - ``loss() -> nn.Module``: default ``nn.CrossEntropyLoss``.
    - ``metrics() -> {name: ignite Metric}``: computed on the validation set, reported as
      ``val_<name>``; a ``"loss"`` metric (the task's loss) is always added. Default: what
      fits the loss (:func:`metrics_for_loss`: accuracy for a classification loss, ``mse``
      for ``MSELoss``, ``mae`` for ``L1Loss``, the loss alone otherwise).
    - ``score=(name, "min" | "max")``: the validation metric that early stopping and the
      best-model checkpoint follow; default ``("loss", "min")``.
    - ``optimizer(params, config) -> torch.optim.Optimizer``: default SGD from the config.
    - ``name``: how results, checkpoints and messages call the task (default:
      ``module:attr``, where its module holds it).
    - ``collate_fn(samples) -> batch``: passed to both data loaders (as to any
      ``DataLoader``); default torch's.
    - ``prepare_batch(batch, device, non_blocking) -> (x, y)``: as ignite's
      ``create_supervised_trainer`` / ``create_supervised_evaluator`` take it; the kit's
      step and its evaluator call ``loss(model(x), y)`` and the metrics on it. ``x`` may be
      a tensor, a tuple or a dict (``model(x)`` receives it as is). Default
      :func:`prepare_xy` (``batch[0]``, ``batch[1]``).
    - ``train_step(model, optimizer, loss, config) -> update``: a factory, called once per
      process, returning ignite's ``update(engine, batch)`` (gradient clipping,
      accumulation, a loss on several outputs). ``update`` returns the batch's loss (a
      float or a one-element tensor) or a dict with ``"loss"`` and optionally
      ``"batch_size"`` (else the kit counts ``len(y)`` of ``prepare_batch(batch, None,
      False)``) and keys of its own (kept in ``engine.state.output``). The kit averages
      the losses into ``train_loss``, counts samples, checkpoints, resumes and profiles
      as with its own step. Default: the kit's step (zero_grad, ``loss(model(x), y)``,
      backward, step; bfloat16 autocast with ``--amp``).
    - ``lr_scheduler``: ``None`` (default): the kit's schedule (``--lr``,
      ``--warmup-epochs``, ``--scale-lr``, linear decay to 0) when the optimizer is the
      kit's SGD, and none (the optimizer's own lr, constant) when the task brings its own
      optimizer; ``"kit"``: the kit's schedule on the task's optimizer; ``"none"``: no
      schedule; or a factory ``(optimizer, config, epoch_length) -> scheduler``: an
      ignite param scheduler (stepped at every iteration, at ``ITERATION_STARTED`` as
      ignite's docs attach them) or a torch scheduler, stepped as its class counts:
      ``OneCycleLR``/``CyclicLR`` once per iteration (wrapped in ignite's
      ``LRScheduler``), ``StepLR``/``MultiStepLR``/``ExponentialLR``/
      ``CosineAnnealingLR``/``PolynomialLR`` once per epoch (at its end, after
      validation); any other class needs ``scheduler_step`` (below). Every one is
      checkpointed and resumed (:mod:`distkit.train.schedules`).
    - ``scheduler_step``: ``None`` (default: as the scheduler's class says),
      ``"iteration"`` or ``"epoch"``: how often the task's own ``lr_scheduler`` steps.
      Needed for a torch scheduler whose class can count either (``LambdaLR``,
      ``LinearLR``, ``SequentialLR``, a subclass of one's own): without it such a run is
      refused in one line before any process starts.
    - ``handlers(trainer, evaluator, config)``: attaches handlers of the task's own to
      ignite's trainer and evaluator, after the kit's (``EarlyStopping`` on another score,
      a log line of its own); called once per process.
    - ``stateful(trainer, evaluator, config) -> {name: object}``: attaches the task's
      handlers that carry state (a metric, an EMA of the weights, a scheduler wrapper:
      anything with ``state_dict`` / ``load_state_dict``) and returns them by name; each
      is saved in every checkpoint (under ``task.<name>``) and loaded back on resume, so
      a resumed run continues them exactly. Called once per process, after ``handlers``.
      The checkpoint holds rank 0's copy; an object whose state is kept per rank says
      ``reshardable = False``, and a resume on another layout is then refused.
    - ``settings={name: default}``: the task's own settings; each is given on the
      command line as ``--set name=value`` (converted to its default's type) or in
      ``Config(task_settings={...})``, and reaches every function of the task as
      ``config.task_settings[name]``.
    - ``stop_on_non_finite``: ``True`` (default): a NaN or inf loss or weight stops the
      run on every rank in one line naming the iteration, the rank(s) and the last finite
      checkpoint (:mod:`distkit.train.finite`); ``False``: the task trains on through
      them (its own loss scaling, say), and results.json and the summary say so.
    - ``summary(model, config) -> dict``: optional; called on every rank after training
      (a collective under fsdp), its values go to results.json's ``"task_summary"`` and
      the end-of-run summary (the text task: a sampled line).

    Example::

        >>> import torch.nn as nn
        >>> from distkit.builtin.data import get_datasets
        >>> from distkit.tasks import Task
        >>> def mlp(config):
        ...     return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        >>> task = Task(datasets=get_datasets, model=mlp, score=("accuracy", "max"))
        >>> task.metric_names()
        ['accuracy', 'loss']
        >>> Task(datasets=get_datasets, model=mlp, loss=nn.MSELoss).metric_names()
        ['mse', 'loss']
    """

    datasets: Callable
    model: Callable
    loss: Callable = cross_entropy
    metrics: Optional[Callable] = None
    score: tuple = ("loss", "min")
    optimizer: Callable = sgd
    name: str = ""
    collate_fn: Optional[Callable] = None
    prepare_batch: Optional[Callable] = None
    train_step: Optional[Callable] = None
    lr_scheduler: Any = None
    handlers: Optional[Callable] = None
    settings: dict = dataclasses.field(default_factory=dict)
    summary: Optional[Callable] = None
    stateful: Optional[Callable] = None
    scheduler_step: Optional[str] = None
    stop_on_non_finite: bool = True

    def __post_init__(self):
        if self.metrics is None:
            self.metrics = partial(metrics_for_loss, self.loss)
        for field in ("datasets", "model", "loss", "metrics", "optimizer"):
            if not callable(getattr(self, field)):
                raise DistkitError(
                    f"Task({field}=...) must be a function, got {type(getattr(self, field)).__name__}: "
                    f"pass the function itself, e.g. Task({field}=make_{field})")
        for field in ("collate_fn", "prepare_batch", "train_step", "handlers", "summary", "stateful"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise DistkitError(
                    f"Task({field}=...) must be a function or None, got {type(value).__name__}: "
                    f"pass the function itself, e.g. Task({field}=my_{field})")
        if not (self.lr_scheduler is None or self.lr_scheduler in LR_SCHEDULES
                or callable(self.lr_scheduler)):
            raise DistkitError(
                f"Task(lr_scheduler={self.lr_scheduler!r}) must be None, 'kit', 'none' or a "
                "function (optimizer, config, epoch_length) -> scheduler")
        if self.scheduler_step not in (None, "iteration", "epoch"):
            raise DistkitError(
                f"Task(scheduler_step={self.scheduler_step!r}) must be None, 'iteration' (one "
                "step of the lr_scheduler per batch) or 'epoch' (one per epoch)")
        if not isinstance(self.settings, dict) or not all(
                isinstance(k, str) and k.isidentifier() for k in self.settings):
            raise DistkitError(f"Task(settings={self.settings!r}) must be a dict of "
                               "{name: default value}, names like 'hidden' or 'max_norm'")
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
        # Where the Task(...) call is written: its module will hold it under some attr
        # (found later by resolve_task, once the assignment has happened).
        if not self.name:
            caller = sys._getframe(2).f_globals.get("__name__", "")  # __init__, then the call
            self.__dict__["_defined_in"] = caller
            self.name = caller or getattr(self.model, "__module__", None) or "task"

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
        """Build its loss and metrics once, so a score naming no metric, or a metric that
        cannot apply to the loss (accuracy of a regression), fails in one line before any
        process starts; returns the task."""
        criterion = self.loss()
        metrics = self.build_metrics(criterion)
        check_metrics_fit_loss(self.name, criterion, metrics)
        return self

    def metric_names(self) -> list:
        """The names its validation metrics are reported under (without ``val_``)."""
        names = list(self.metrics())
        return names if "loss" in names else names + ["loss"]

    def sign(self) -> float:
        """+1 if a larger score is better, -1 if a smaller one is."""
        return 1.0 if self.score[1] == "max" else -1.0

    def configure(self, config):
        """``config`` with ``task_settings`` complete: the task's defaults, overridden by
        the values given (``--set name=value`` gives strings, converted to the default's
        type). An unknown name or a value of the wrong type fails in one line."""
        given = dict(getattr(config, "task_settings", None) or {})
        unknown = sorted(set(given) - set(self.settings))
        if unknown:
            known = ", ".join(f"{k}={v!r}" for k, v in self.settings.items()) or "none"
            raise DistkitError(
                f"--set {unknown[0]}: task {self.name!r} has no setting {unknown[0]!r} (its "
                f"settings: {known}): name one of them, or declare it in Task(settings=...)")
        values = {name: _setting_value(self.name, name, default, given[name])
                  if name in given else default for name, default in self.settings.items()}
        return dataclasses.replace(config, task_settings=values)


LR_SCHEDULES = ("kit", "none")
# Losses whose targets are real numbers: metrics that count classes cannot apply.
REGRESSION_LOSSES = ("MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "GaussianNLLLoss",
                     "PoissonNLLLoss")
CLASS_METRICS = ("Accuracy", "Precision", "Recall", "Fbeta", "ConfusionMatrix",
                 "TopKCategoricalAccuracy", "ClassificationReport")


def metrics_for_loss(loss) -> dict:
    """The default metrics, following the task's loss (``loss`` is what makes it):
    ``accuracy`` for ``CrossEntropyLoss`` / ``NLLLoss`` (and ``BCEWithLogitsLoss`` /
    ``BCELoss``, on the thresholded output), ``mse`` (``MeanSquaredError``) for ``MSELoss``,
    ``mae`` (``MeanAbsoluteError``) for ``L1Loss``, and none (the ``"loss"`` metric alone)
    for any other loss::

        >>> import torch.nn as nn
        >>> sorted(metrics_for_loss(nn.MSELoss)), sorted(metrics_for_loss(nn.CrossEntropyLoss))
        (['mse'], ['accuracy'])
    """
    from ignite.metrics import Accuracy, MeanAbsoluteError, MeanSquaredError
    import torch.nn as nn

    criterion = loss()
    if isinstance(criterion, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return {"accuracy": Accuracy()}
    if isinstance(criterion, nn.BCEWithLogitsLoss):
        return {"accuracy": Accuracy(output_transform=_logits_to_labels)}
    if isinstance(criterion, nn.BCELoss):
        return {"accuracy": Accuracy(output_transform=_probabilities_to_labels)}
    if isinstance(criterion, nn.MSELoss):
        return {"mse": MeanSquaredError()}
    if isinstance(criterion, nn.L1Loss):
        return {"mae": MeanAbsoluteError()}
    return {}


def _logits_to_labels(output):
    y_pred, y = output
    return (y_pred > 0).long(), y.long()


def _probabilities_to_labels(output):
    y_pred, y = output
    return (y_pred > 0.5).long(), y.long()


def check_metrics_fit_loss(name: str, criterion, metrics: dict) -> None:
    """Refuse a metric that counts classes (``Accuracy``...) for a regression loss
    (``MSELoss``...): it would fail inside every rank after the first epoch."""
    loss_type = type(criterion).__name__
    if loss_type not in REGRESSION_LOSSES:
        return
    for metric_name, metric in metrics.items():
        if type(metric).__name__ in CLASS_METRICS:
            raise DistkitError(
                f"task {name!r}: metric {metric_name!r} ({type(metric).__name__}) counts classes, "
                f"but its loss {loss_type} is a regression loss: give regression metrics, e.g. "
                "Task(metrics=lambda: {'mse': MeanSquaredError()}), or leave metrics out "
                "(the default follows the loss)")


def _setting_value(task: str, name: str, default, value):
    """``value`` as the type of ``default``: strings from ``--set`` are converted."""
    import ast

    kind = type(default)
    if isinstance(value, str) and kind is not str:
        text = value.strip()
        try:
            if kind is bool:
                lowered = text.lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                value = lowered in ("true", "1", "yes")
            elif kind in (int, float):
                value = kind(text)
            else:
                value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise DistkitError(
                f"--set {name}={value}: task {task!r} wants {_kind_name(kind)} for {name!r} "
                f"(default {default!r}): give e.g. --set {name}={default}") from None
    ok = default is None or isinstance(value, kind) or (kind is float and isinstance(value, int)
                                                         and not isinstance(value, bool))
    if kind is int and isinstance(value, bool):
        ok = False
    if not ok:
        raise DistkitError(
            f"Config.task_settings[{name!r}] = {value!r}: task {task!r} wants {_kind_name(kind)} "
            f"(default {default!r}): give e.g. {name}={default!r}")
    if kind is float and isinstance(value, int):
        value = float(value)
    return value


def _kind_name(kind) -> str:
    return {bool: "true or false", int: "a whole number", float: "a number",
            str: "a string"}.get(kind, f"a {kind.__name__}")


# --- the built-in tasks: every dataset of distkit.builtin.data x every model of distkit.builtin.models ----

def _builtin_datasets(dataset: str, config):
    from distkit.builtin.data import get_datasets

    return get_datasets(dataclasses.replace(config, dataset=dataset), **_gpt_sizes(config, "block_size"))


def _builtin_model(dataset: str, model: str, config):
    from distkit.builtin.data import dataset_info
    from distkit.builtin.models import get_model

    return get_model(model, **{**dataset_info(dataset), **_gpt_sizes(config)})


def _gpt_sizes(config, *only) -> dict:
    """The GPT's sizes that ``--set size=NAME`` chose ({} for the other tasks)."""
    name = (getattr(config, "task_settings", None) or {}).get("size")
    if name is None:
        return {}
    from distkit.builtin.models import gpt_size

    sizes = gpt_size(name)
    return {k: v for k, v in sizes.items() if not only or k in only}


def builtin_task(dataset: str, model: str) -> Task:
    """The task for ``--dataset dataset --model model``: classification, cross-entropy,
    accuracy, early stopping on the validation loss (as ``distkit train`` always did).
    ``text`` x ``gpt``: next-character prediction (cross entropy and accuracy over every
    position, AdamW, a sampled line at the end; :mod:`distkit.builtin.text`)."""
    datasets, net = partial(_builtin_datasets, dataset), partial(_builtin_model, dataset, model)
    if dataset == "text":
        from distkit.builtin import text

        # --set size=gpt2-small: GPT-2 small's shape (distkit.builtin.models.GPT_SIZES)
        return Task(datasets=datasets, model=net, loss=text.TokenCrossEntropy,
                    metrics=text.token_metrics, optimizer=text.adamw, name=f"{dataset}/{model}",
                    summary=text.text_summary, lr_scheduler="kit", settings={"size": "default"})
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


def configured_task(spec, config) -> tuple:
    """``(task, config)``: the task ``spec`` means (see :func:`resolve_task`), checked
    (:meth:`Task.check`), and ``config`` with its settings complete and typed
    (:meth:`Task.configure`): what the launcher's ``task`` check settles."""
    task = resolve_task(spec).check()
    return task, task.configure(config)


def load_task(spec: str) -> Task:
    """Import ``"module:attr"`` or ``"path/to/file.py:attr"`` and return that Task."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise DistkitError(f"--task {spec!r} is not module:attr: pass e.g. --task course:task "
                           "(course.py in the current folder) or --task path/to/course.py:task")
    module = import_spec(spec, module_name)
    if not hasattr(module, attr):
        raise DistkitError(f"--task {spec!r}: module {module.__name__!r} has no attribute {attr!r}: "
                           "name a Task defined at its top level")
    task = getattr(module, attr)
    if not isinstance(task, Task):
        raise DistkitError(f"--task {spec!r} is a {type(task).__name__}, not a distkit.Task: "
                           "point it at an object made with distkit.Task(...)")
    return _named(task, module, attr)


def _named(task: Task, module=None, attr: str | None = None) -> Task:
    """A task its author did not name gets the name ``module:attr``: the module whose
    ``Task(...)`` call made it and the attribute that holds it there, the same whether it
    came by object, ``module:attr`` or a file path (a resumed run is checked against the
    task name its checkpoint records, so two tasks of one module must not share a name).
    ``module``/``attr``: where the spec found it, used if its own module does not hold it."""
    defined_in = task.__dict__.get("_defined_in")
    if defined_in is None or task.name != defined_in:
        return task  # named by its author, a built-in task, or named already
    home = sys.modules.get(defined_in)
    found = next((k for k, v in vars(home).items() if v is task), None) if home else None
    if found:
        return dataclasses.replace(task, name=f"{defined_in}:{found}")
    if module is not None and attr:
        return dataclasses.replace(task, name=f"{module.__name__}:{attr}")
    return task


def import_spec(spec: str, module_name: str):
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
