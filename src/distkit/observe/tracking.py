"""What a run tells the people watching it: the console, and an experiment tracker.

Console: ignite's progress bar only where someone watches it live (stdout a terminal, or
a notebook); anywhere else (CI logs, SLURM output files, a pipe) a bar is a wall of
carriage returns, so training prints one line per epoch instead. ignite's INFO lines
(launcher parameters, data-loader arguments, model wrapping) are kept for ``--verbose``.

Tracker (``--logger tensorboard`` / ``--logger mlflow``): ignite's own
``TensorboardLogger`` / ``MLflowLogger`` from ``ignite.handlers``, on rank 0 only
(the metrics are already reduced over the ranks: one writer, one set of files). Per
epoch: ``training/loss`` (the epoch's mean batch loss), ``training/lr/group_0``,
``validation/<metric>`` for every scalar metric of the task; with ``--profile``, at
the end, ``profile/<handler or phase>`` in mean seconds over the ranks (MLflow, as
ignite names them there: ``training loss``, ``validation accuracy``...). TensorBoard's
files go to ``<run_dir>/tensorboard`` (``tensorboard --logdir runs`` shows every run);
MLflow's to ``MLFLOW_TRACKING_URI`` if set, else ``<run_dir>/mlflow.db`` (sqlite: MLflow 3
refuses its old ``mlruns`` folder store unless told otherwise); ``mlflow ui
--backend-store-uri sqlite:///runs/<run>/mlflow.db`` shows it.
"""
from __future__ import annotations

import importlib.util
import numbers
import os
import re
import sys
from pathlib import Path

from distkit.config import check_logger_installed
from distkit.host.facts import set_ignite_verbosity


# --------------------------------------------------------------------------------------
# Console
# --------------------------------------------------------------------------------------

def interactive_output() -> bool:
    """True where a progress bar is read live: a Jupyter kernel with ipywidgets (also in
    the processes ``idist.Parallel`` forks from it, which inherit the kernel's shell), or a terminal on
    both stdout (the per-epoch lines) and stderr (where tqdm draws the bar)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is not None and getattr(shell, "kernel", None) is not None:
        # tqdm draws a widget in a notebook; without ipywidgets it warns "IProgress not
        # found" and writes every frame of a text bar into the cell: one line per epoch instead
        return importlib.util.find_spec("ipywidgets") is not None
    return _isatty(sys.stdout) and _isatty(sys.stderr)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def console(config) -> bool:
    """Set ignite's log level for this process; return whether to show the progress bar
    (``config.progress_bar`` and someone watching) rather than one line per epoch."""
    set_ignite_verbosity(config.verbose)
    return bool(config.progress_bar) and interactive_output()


# --------------------------------------------------------------------------------------
# Experiment tracker
# --------------------------------------------------------------------------------------

class Tracker:
    """An ignite logger attached to the trainer and evaluator; ``close(profile)`` adds the
    profile (if any) and flushes. A run without ``--logger`` (and every rank but 0) gets
    one that does nothing, so training calls it unconditionally."""

    def __init__(self, kind: str = "none", logger=None):
        self.kind, self.logger = kind, logger

    def close(self, profile: dict | None = None) -> None:
        if self.logger is None:
            return
        if profile:
            self._log_profile(profile)
        self.logger.close()

    def _log_profile(self, profile: dict) -> None:
        step = profile.get("epochs") or 0
        values = {f"profile/{_tag(r['kind'])}/{_tag(r['name'])}": r["mean_s"]
                  for r in profile["rows"] if r["source"] == "HandlersTimeProfiler" and r["mean_s"] is not None}
        values["profile/data_share"] = profile.get("data_share")
        values = {k: float(v) for k, v in values.items() if isinstance(v, numbers.Number)}
        if self.kind == "tensorboard":
            from distkit.observe.profiling import format_summary

            for tag, value in values.items():
                self.logger.writer.add_scalar(tag, value, step)
            self.logger.writer.add_text("profile", "```\n" + format_summary(profile) + "\n```", step)
        else:
            self.logger.log_metrics(values, step=step)  # MLflowLogger passes it on to mlflow


def _tag(name: str) -> str:
    """A name both TensorBoard and MLflow accept (MLflow refuses parentheses, commas...)."""
    return re.sub(r"[^\w.\- ]+", "", name).strip().replace(" ", "_")


def _scalar_metrics(engine) -> dict:
    """The evaluator's metrics that are one number (a confusion matrix is not)."""
    out = {}
    for name, value in engine.state.metrics.items():
        if hasattr(value, "ndim") and value.ndim == 0:
            value = value.item()
        if isinstance(value, numbers.Number):
            out[name] = value
    return out


def attach(config, trainer, evaluator, optimizer, run_dir: str) -> Tracker:
    """Attach ``config.logger`` to the trainer (loss, lr per epoch) and the evaluator
    (validation metrics per epoch), on rank 0. Call on every rank (the others get a
    tracker that does nothing); ``tracker.close(profile)`` after ``trainer.run``."""
    import ignite.distributed as idist
    from ignite.engine import Events
    from ignite.handlers import global_step_from_engine

    if config.logger == "none" or idist.get_rank() != 0:
        return Tracker()
    check_logger_installed(config.logger)
    if config.logger == "tensorboard":
        from ignite.handlers import TensorboardLogger

        logger = TensorboardLogger(log_dir=os.path.join(run_dir, "tensorboard"))
    else:
        from ignite.handlers import MLflowLogger

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir, 'mlflow.db').resolve()}"
        logger = MLflowLogger(tracking_uri=uri)
        logger.log_params({k: str(v) for k, v in config.to_dict().items()})
    logger.attach_output_handler(
        trainer, event_name=Events.EPOCH_COMPLETED, tag="training",
        output_transform=lambda _: {"loss": trainer.state.metrics["train_loss"]})
    logger.attach_opt_params_handler(trainer, event_name=Events.EPOCH_COMPLETED, optimizer=optimizer,
                                     param_name="lr", tag="training")
    logger.attach_output_handler(
        evaluator, event_name=Events.COMPLETED, tag="validation",
        output_transform=lambda _: _scalar_metrics(evaluator),
        global_step_transform=global_step_from_engine(trainer, Events.EPOCH_COMPLETED))
    return Tracker(config.logger, logger)
