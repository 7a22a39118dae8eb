"""What a finished run reports: ``results.json``, the learning curves, the summary lines.

:func:`distkit.train.training.training` measures; this module writes it down. Training fills a
:class:`RunRecord` (what it measured, on every rank) and rank 0 hands it to
:func:`report`, which turns it into the results dict (the same dict ``run`` returns and
``results.json`` holds), writes both files and returns the dict. :func:`run_summary` is
the few lines ``distkit train`` prints from such a dict::

    >>> from distkit.observe.reporting import run_summary
    >>> print(run_summary({"backend": "gloo", "world_size": 2, "nnodes": 1, "device": "cpu",
    ...                    "final": {"val_accuracy": 0.95}, "epochs_completed": 3,
    ...                    "iterations": 48, "seconds_per_epoch": 1.5,
    ...                    "samples_per_second": 2000.0, "run_dir": "runs/x"}))
    backend gloo  world size 2  nodes 1  device cpu
    final validation accuracy 0.9500  after 3 epoch(s), 48 iterations
    1.50 s per epoch (training only)  2000 samples/s (end to end)
    results, checkpoints and plots in runs/x
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

import ignite
import ignite.distributed as idist
import torch

from distkit.observe import profiling, throughput
from distkit.host.files import whole
from distkit.checkpoint.saver import write_results


@dataclass
class RunRecord:
    """What one run of :func:`distkit.train.training.training` measured; :func:`report` turns it
    into the results dict."""

    run_dir: str
    config: object  # distkit.config.Config
    task: object  # distkit.tasks.Task
    settings: dict
    """The settings that acted on this run (``distkit.train.effective.effective_config``)."""
    history: list
    """One dict per validated epoch: epoch, train_loss, val_<metric>..., epoch_time_s, lr."""
    iterations: int
    samples_trained: int
    """Over all ranks, this run only (a resumed run counts from where it resumed)."""
    wall_time_s: float
    first_step_unix_s: float | None
    peak_lr: float
    last_checkpoint: str | None
    best_model: str | None
    profile: dict | None = None
    replica_digests: dict = field(default_factory=dict)
    """``{"initial": [sha256 per rank], "final": [...]}``: all equal = replicas in sync."""
    peak_memory_per_rank: dict | None = None
    extras: dict = field(default_factory=dict)
    """Added to the results as they are (tokens_per_second, mfu, throughput, task_summary)."""


def results_of(record: RunRecord) -> dict:
    """The results dict of ``record`` (what results.json holds). Reads the process group
    (backend, world size, device) of the process that calls it."""
    history, task, config = record.history, record.task, record.config
    train_time = sum(h["epoch_time_s"] for h in history)
    wall = record.wall_time_s
    digests = record.replica_digests
    return {
        "backend": idist.backend() or "none",
        "world_size": idist.get_world_size(),
        "nnodes": idist.get_nnodes(),
        "device": str(idist.device()),
        "threads_per_process": torch.get_num_threads(),
        "run_dir": record.run_dir,
        "config": record.settings,  # what acted on this run
        "task": {"name": task.name, "score": list(task.score), "loss": type(task.loss()).__name__,
                 "metrics": [f"val_{name}" for name in task.metric_names()]},
        "peak_lr": record.peak_lr,
        "history": history,
        "iterations": record.iterations,
        "epochs_completed": history[-1]["epoch"] if history else 0,  # resumed runs included
        "epochs_this_run": sum(1 for h in history if not h.get("before_resume")),
        "final": history[-1] if history else None,
        "best": best_epoch(history, task),
        "wall_time_s": wall,
        "first_step_unix_s": record.first_step_unix_s,
        "train_time_s": train_time,
        "seconds_per_epoch": train_time / len(history) if history else None,
        "samples_trained": record.samples_trained,
        # end to end: validation and checkpoints included
        "samples_per_second": record.samples_trained / wall if wall > 0 else None,
        "last_checkpoint": record.last_checkpoint,
        "best_model": record.best_model,
        "profile": record.profile,
        # One SHA-256 of the parameters per rank: all equal = replicas in sync.
        "replica_param_sha256": digests,
        "replicas_identical": all(len(set(d)) == 1 for d in digests.values()),
        "strategy": config.strategy,
        # the checkpoint this run went on from, and the layout that wrote it
        "resumed_from": resume_record(getattr(config, "resume_from", None)),
        "peak_memory_per_rank": record.peak_memory_per_rank,  # {"bytes": [rank 0, ...], "measure": ...}
        "versions": versions(),
        **record.extras,
    }


def resume_record(path: str | None) -> dict | None:
    """What results.json says of the checkpoint a run resumed from (None: it did not)."""
    if not path:
        return None
    from distkit.checkpoint.reshard import resumed_from
    from distkit.checkpoint.saver import load_checkpoint

    return resumed_from(path, load_checkpoint(path))  # proven by its checksum, as at the resume


def best_epoch(history: list, task) -> dict | None:
    """``{"epoch", "metric", "value"}``: the epoch whose validation score (the task's) was
    best, the first of equals, as the best-model checkpoint keeps it."""
    name = f"val_{task.score[0]}"
    scored = [h for h in history if isinstance(h.get(name), (int, float))]
    if not scored:
        return None
    sign = task.sign()
    best = max(scored, key=lambda h: sign * h[name])  # max keeps the first of equals
    return {"epoch": best["epoch"], "metric": name, "value": best[name]}


def report(record: RunRecord) -> dict:
    """Write ``<run_dir>/results.json``, then ``learning_curves.png`` (call on rank 0
    only); return the results dict. results.json comes first, whole (a finished run is
    never lost to an optional output); a plot that fails is a warning (redraw it with
    ``distkit plot RUN_DIR``), but a full disk is the kit's one-line error, results.json
    written whole before it."""
    results = results_of(record)
    write_results(record.run_dir, results)
    if record.history:
        optional_output("learning_curves.png", record.run_dir,
                        lambda: draw_learning_curves(record.run_dir, results))
    return results


def optional_output(name: str, run_dir: str, write) -> bool:
    """Run ``write()`` (an optional output: the plot, a tracker's files); a failure is a
    warning line, except a full disk, which is the kit's error naming the folder (a
    DistkitError). Returns True if it was written."""
    import errno
    import sys

    from distkit.checkpoint.saver import disk_error

    try:
        write()
        return True
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            error = disk_error(e, run_dir)
            error.args = (f"{error}; results.json is whole, {name} was not written (redraw it: "
                          f"distkit plot {run_dir})",)
            raise error from None
        why = f"{type(e).__name__}: {e.strerror or e}"
    except Exception as e:  # an optional output never costs the run its results
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    print(f"distkit: warning: {name} was not written ({why}); results.json is whole: redraw "
          f"with distkit plot {run_dir}", file=sys.stderr, flush=True)
    return False


def draw_learning_curves(run_dir: str, results: dict | None = None) -> str:
    """Draw ``<run_dir>/learning_curves.png`` from ``results`` (default: the run's
    results.json), atomically: a temporary file renamed into place, removed if the
    drawing fails (never a 0-byte or half-written png). Returns the png's path.
    ``distkit plot RUN_DIR`` calls it."""
    import json

    import matplotlib.pyplot as plt

    from distkit.observe.plots import learning_curves

    if results is None:
        with open(os.path.join(run_dir, "results.json")) as f:
            results = json.load(f)
    path = os.path.join(run_dir, "learning_curves.png")
    fig = learning_curves([results])
    try:
        with whole(path) as partial:
            fig.savefig(partial, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path


def saved_path(run_dir: str, folder: str, checkpoint) -> str | None:
    """Where an ignite ``Checkpoint`` handler saving to ``<run_dir>/<folder>`` put its
    latest file (None before its first save)."""
    if checkpoint.last_checkpoint is None:
        return None
    return os.path.join(run_dir, folder, os.path.basename(str(checkpoint.last_checkpoint)))


def run_summary(results: dict) -> str:
    """The few lines `distkit train` prints at the end of a run, from its results dict
    (what :func:`distkit.train.training.training` returns on rank 0 and writes to results.json)."""
    f = results["final"] or {}
    metrics = "  ".join(f"{k[4:]} {v:.4f}" for k, v in f.items()
                        if k.startswith("val_") and isinstance(v, float)) or "none"
    task = results.get("task") or {}
    lines = [
        f"backend {results['backend']}  world size {results['world_size']}  "
        f"nodes {results['nnodes']}  device {results['device']}"
        + (f"  task {task['name']}" if task.get("name") else ""),
        f"final validation {metrics}  after {results['epochs_completed']} epoch(s), "
        f"{results['iterations']} iterations",
        *_best_and_stop(results),
        (f"{results['seconds_per_epoch']:.2f} s per epoch (training only)  "
         if results["seconds_per_epoch"] else "no whole epoch ran (no time per epoch)  ")
        + f"{results['samples_per_second']:.0f} samples/s (end to end)",
        f"results, checkpoints and plots in {results['run_dir']}",
    ]
    if throughput.format_report(results):
        lines.insert(-1, throughput.format_report(results))
    for key, value in (results.get("task_summary") or {}).items():
        lines.insert(-1, f"{key}: {value!r}" if isinstance(value, str) else f"{key}: {value}")
    if results.get("profile"):
        lines.insert(-1, profiling.format_summary(results["profile"], top=5))
    if results.get("trace"):  # --trace
        lines.insert(-1, f"trace of every rank: {results['trace']['merged']} (open it in "
                         f"https://ui.perfetto.dev), drawn in {results['trace']['png']}")
    return "\n".join(lines)


def _best_and_stop(results: dict) -> list:
    """The summary's lines on the best epoch (and where its model is) and on an early stop."""
    lines = []
    best = results.get("best")
    if best:
        where = f"; model in {results['best_model']}" if results.get("best_model") else ""
        lines.append(f"best validation {best['metric'][4:]} {best['value']:.4f} at epoch "
                     f"{best['epoch']}{where}")
    if results.get("non_finite") == "train on":
        lines.append("NaN or inf losses and weights do not stop this run (the task's "
                     "stop_on_non_finite=False)")
    stop = results.get("stopped_early")
    if stop:
        lines.append(f"stopped early after epoch {stop['after_epoch']} of {stop['of_epochs']} "
                     f"by {stop['by']}")
    return lines


def versions() -> dict:
    """Python, torch, ignite (and torchvision, if importable) versions, for the record."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "ignite": ignite.__version__}
    try:
        import torchvision

        out["torchvision"] = torchvision.__version__
    except Exception:
        pass
    return out
