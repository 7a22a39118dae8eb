"""Checkpoints and run folders: where a run writes, what a checkpoint holds, loading it
safely (``weights_only=True``), and finding the one to resume from.

- ``distkit train --resume-from latest`` resumes from the newest checkpoint under
  ``--output-dir`` (:func:`latest_checkpoint`), or starts from scratch when there is
  none yet. That makes one command right for the first start *and* for every restart,
  which is what ``torchrun --max-restarts`` needs: torchrun re-runs the same command,
  and each start writes a fresh run folder, so the restart must look for the previous
  start's checkpoint. Give each job its own ``--output-dir``: ``latest`` means the newest
  checkpoint of any run under it. On several nodes the output dir must be on a file
  system every node sees (rank 0 writes the checkpoints, every rank reads them).
- Checkpoints are written atomically by ignite's ``DiskSaver(atomic=True)``: into a
  temporary file ``tmp*`` in the same folder, then renamed. A process killed during the
  save leaves that temporary file behind and every ``*.pt`` intact.
- Every checkpoint proves its contents: a sidecar ``<file>.pt.sha256`` (the SHA-256 of
  the file's bytes, its size and the iteration it holds) is written atomically after the
  checkpoint, and verified before anything is loaded (:func:`verify_checksum`); a file
  without one, or whose bytes differ, is never loaded. ``latest`` is the highest
  iteration recorded, not the newest file time (a ``cp -r`` renews those). See
  docs/safety.md.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
from datetime import datetime
from pathlib import Path

import torch

from distkit.host.files import remove_quietly, write_json
from distkit.errors import DistkitError
from distkit.host.layout import elastic, world_layout

CHECKPOINT_PREFIX = "training"
LATEST = "latest"
_ITERATION = re.compile(r"_(\d+)\.pt$")


def checkpoint_iteration(path) -> int:
    """The iteration a checkpoint was saved at, from its name ``training_checkpoint_<it>.pt``."""
    m = _ITERATION.search(str(path))
    return int(m.group(1)) if m else -1


def find_checkpoints(output_dir) -> list[Path]:
    """Every checkpoint of every run under ``output_dir``, oldest first: by the iteration
    it records (:func:`recorded_iteration`), then modification time. Not by time first:
    ``cp -r`` of a run folder renews every file's time. Temporary files of interrupted
    saves are not checkpoints."""
    return _by_iteration(Path(output_dir).glob("*/checkpoints/*.pt"))


def _by_iteration(paths) -> list[Path]:
    def key(p):
        try:
            mtime = p.stat().st_mtime_ns
        except OSError:  # removed meanwhile (a running job keeps its 2 newest)
            mtime = -1
        return recorded_iteration(p), mtime

    return sorted(paths, key=key)


def latest_checkpoint(output_dir) -> str | None:
    """The newest complete checkpoint under ``output_dir`` (the highest iteration whose
    checksum holds), or None if there is none."""
    for path in reversed(find_checkpoints(output_dir)):
        if checksum_problem(str(path)) is None:
            return str(path)
    return None


def latest_checkpoint_in(run_dir) -> str | None:
    """The newest complete checkpoint of one run folder (proven by its checksum), or None."""
    for path in reversed(_by_iteration(Path(run_dir).glob("checkpoints/*.pt"))):
        if checksum_problem(str(path)) is None:
            return str(path)
    return None


# --- checksums: a checkpoint proves its contents before it is loaded --------------------
# Why a sidecar rather than a record inside the zip: the checkpoint is written by torch.save
# through ignite's DiskSaver (a temporary file, then a rename); a record inside the zip
# would mean rewriting the archive after torch.save, or hashing something other than the
# bytes on disk. A sidecar is the SHA-256 of exactly the bytes a later torch.load reads,
# checked without parsing them (a flipped byte in the zip directory or the pickle is caught
# before any unpickler runs); written after the checkpoint, so a checkpoint whose sidecar
# is missing was never finished and is not trusted. Costs one read of the file per save.
CHECKSUM_SUFFIX = ".sha256"


def checksum_path(path) -> str:
    """The sidecar of a checkpoint: ``<path>.sha256``."""
    return str(path) + CHECKSUM_SUFFIX


def file_sha256(path) -> tuple[str, int]:
    """The SHA-256 (hex) of a file's bytes and its size."""
    import hashlib

    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def write_checksum(path, iteration: int | None = None) -> str:
    """Write the sidecar of checkpoint ``path`` atomically (a temporary file, fsync, then a
    rename: a reader sees none or all of it) and return its path. ``iteration``: the
    trainer's iteration the checkpoint holds (default: from the file name). Call it after
    the checkpoint itself is in place::

        >>> import tempfile, torch
        >>> from distkit.checkpoint.saver import write_checksum, verify_checksum
        >>> path = tempfile.mkdtemp() + "/training_checkpoint_7.pt"
        >>> torch.save({"w": torch.ones(2)}, path)
        >>> _ = write_checksum(path)
        >>> verify_checksum(path)["iteration"]
        7
    """
    digest, size = file_sha256(path)
    record = {"sha256": digest, "bytes": size,
              "iteration": checkpoint_iteration(path) if iteration is None else int(iteration)}
    return write_json(checksum_path(path), record, durable=True)


def read_checksum(path) -> dict | None:
    """The sidecar's record of checkpoint ``path`` (sha256, bytes, iteration), or None if
    it is missing or not a record."""
    try:
        with open(checksum_path(path)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str) \
            or not isinstance(record.get("bytes"), int) or not isinstance(record.get("iteration"), int):
        return None
    return record


def recorded_iteration(path) -> int:
    """The iteration checkpoint ``path`` holds: its sidecar's, else its file name's."""
    record = read_checksum(path)
    return record["iteration"] if record else checkpoint_iteration(path)


def checksum_problem(path) -> str | None:
    """Why checkpoint ``path`` cannot be trusted (a few words), or None if its bytes are
    the ones its sidecar records."""
    if not os.path.isfile(path):
        return "no such file"
    record = read_checksum(path)
    if record is None:
        return (f"no checksum beside it ({os.path.basename(checksum_path(path))} is missing or "
                "unreadable: the save did not finish, or the file was copied without it)")
    try:
        digest, size = file_sha256(path)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if size != record["bytes"]:
        return f"damaged: {size} bytes where {record['bytes']} were written"
    if digest != record["sha256"]:
        return "damaged: its bytes differ from the SHA-256 recorded when it was written"
    return None


def verify_checksum(path) -> dict:
    """Check checkpoint ``path`` against its sidecar before anything reads it; returns the
    sidecar's record, or raises a one-line DistkitError naming the file."""
    problem = checksum_problem(path)
    if problem is not None:
        raise DistkitError(f"checkpoint {str(path)!r} is not loaded: {problem}; pass another "
                           "checkpoint (the run's previous one, or --resume-from latest, which "
                           "passes over damaged files)")
    return read_checksum(path)


def load_verified(path, **kwargs):
    """``torch.load(path, map_location="cpu", weights_only=True)`` of a checkpoint whose
    checksum holds (:func:`verify_checksum`): the best model (``<run>/best/*.pt``) as
    well as the resumable checkpoints."""
    verify_checksum(path)
    return torch.load(path, map_location="cpu", weights_only=True, **kwargs)


def remove_run_dir_if_empty(run_dir) -> bool:
    """Remove a run folder that holds nothing of value: no complete checkpoint, no
    results and no recorded trace (an empty ``checkpoints/`` or the temporary file of an
    interrupted save do not count). Failures after start-up then leave no empty folders
    behind; a rank's traceback (``tracebacks/``, whose path its failure line gives) is
    kept. The one such rule for ``distkit train``'s and ``distkit launch --trace``'s runs."""
    import shutil

    path = Path(run_dir)
    if not path.is_dir() or latest_checkpoint_in(path) or (path / "results.json").exists() \
            or any(path.glob("tracebacks/*.txt")) or any(path.glob("trace/*.json")):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def resolve_resume_from(config):
    """Turn ``resume_from="latest"`` into the newest checkpoint under ``output_dir`` (or
    None: start from scratch). Every rank resolves it before the process group forms, so
    no rank of this start has written a checkpoint yet and all find the same file."""
    if config.resume_from != LATEST:
        return config
    found = find_checkpoints(config.output_dir)
    path, ckpt, unloadable = None, None, []
    for candidate in reversed(found):  # newest first; a damaged one is passed over
        try:
            ckpt = load_checkpoint(str(candidate))
            path = str(candidate)
            break
        except DistkitError as e:
            unloadable.append((str(candidate), str(e)))
    if found and path is None:
        raise DistkitError(
            f"--resume-from latest: none of the {len(found)} checkpoint(s) under "
            f"{config.output_dir!r} loads (newest: {found[-1]}): start a new run with its own "
            "--output-dir, or without --resume-from")
    if unloadable and world_layout().rank == 0:
        newest, why = unloadable[0]
        why = checksum_problem(newest) or why.split(": ")[0]
        print(f"distkit: warning: --resume-from latest: {len(unloadable)} newer checkpoint(s) do "
              f"not load (newest: {newest}: {why}): falling back to {path}", file=sys.stderr,
              flush=True)
    if path is not None and checkpoint_is_finished(ckpt, config.early_stopping_patience):
        raise DistkitError(
            f"--resume-from latest: the newest loadable checkpoint under {config.output_dir!r} ({path}) ends "
            "a finished run, so there is nothing to resume: give a new job its own --output-dir")
    if world_layout().rank == 0:
        restart = elastic().restart_count if elastic().run_id else None
        where = f"resuming from {path}" if path else "no checkpoint yet: starting from scratch"
        print(f"--resume-from latest{f' (TORCHELASTIC_RESTART_COUNT={restart})' if restart is not None else ''}: {where}",
              flush=True)
        warning = restart_store_warning()
        if warning:
            print(f"distkit: warning: {warning}", file=sys.stderr, flush=True)
    return config.replace(resume_from=path)


def restart_store_warning() -> str | None:
    """torchrun's static rendezvous (``--master_addr``/``--master_port``, no
    ``--rdzv-backend``) keeps one store for every restart; a restarted process can then
    read the addresses the dead attempt left there and fail to connect (torch 2.15 here:
    4 of 8 restarts failed so, with static or c10d rendezvous; see pytorch issue 135712).
    With a fresh store per attempt, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` and
    ``--rdzv-backend=c10d`` (or ``--standalone``), none of 15 failed;
    ``scripts/torchrun_nnodes.sh`` launches so. On one node the kit needs none of it: each
    attempt's group meets under a prefix of its own (``supervise.attempt_store``), 10 of 10
    restarts on the shared store in ``benchmarks/torchrun_restarts.py``; so the warning is
    for runs of several nodes only."""
    torchrun = elastic()
    if torchrun.max_restarts > 0 and not torchrun.one_node and torchrun.agent_store:
        return ("torchrun --max-restarts with a store shared across restarts: a restart may fail "
                "to reconnect; launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun "
                "--rdzv-backend=c10d, as scripts/torchrun_nnodes.sh does")
    return None


def check_output_dir(output_dir: str) -> None:
    """Fail in one line, before any process starts, if runs cannot be written under
    ``output_dir``: a file where a folder should be, or a folder this user cannot write."""
    path = Path(output_dir).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DistkitError(f"--output-dir {output_dir!r}: {str(existing)!r} is a file, not a "
                           "folder: pass a folder (it is created if missing)")
    # access() also says no on a read-only file system, even to root
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DistkitError(f"--output-dir {output_dir!r} is not writable ({str(existing)!r} is "
                           "read-only for this user): pass a folder you can write to")


def disk_error(error: OSError, where) -> DistkitError:
    """One line for an OSError while writing under ``where``; a full disk says so
    (torch.save reports it as ``RuntimeError ... unexpected pos``, see
    :func:`is_disk_full`)."""
    if getattr(error, "errno", None) == errno.ENOSPC:
        return DistkitError(f"no space left on {str(where)!r} while writing the run: free some "
                            "space or pass an --output-dir on another disk; the checkpoints "
                            "written before are intact (saves are atomic)")
    return DistkitError(f"cannot write under {str(where)!r} ({error.strerror or error}): pass an "
                        "--output-dir you can write to")


def checkpoint_saver(dirname: str):
    """ignite's ``DiskSaver`` (atomic: a temporary file, then a rename), whose failure to
    write is one line: torch.save reports a full disk as ``RuntimeError: [enforce fail at
    inline_container.cc] . unexpected pos``, which names neither the cause nor the disk."""
    from ignite.handlers import DiskSaver

    class OneLineDiskSaver(DiskSaver):
        def __call__(self, checkpoint, filename, metadata=None):
            try:
                super().__call__(checkpoint, filename, metadata)
                path = self.dirname / filename
                if path.exists() and self.save_on_rank == _rank():
                    try:
                        write_checksum(path, _saved_iteration(checkpoint, path))
                    except BaseException:
                        remove_quietly(path)  # a checkpoint that cannot prove itself is no checkpoint
                        raise
            except (OSError, RuntimeError) as e:
                raise save_error(e, checkpoint, self.dirname) from None

        def remove(self, filename):
            try:
                super().remove(filename)  # on the saving rank only
            except FileNotFoundError:  # a resumed run's best model of the run before
                pass
            if self.save_on_rank == _rank():  # (another rank would race it, or take a new sidecar)
                remove_quietly(checksum_path(self.dirname / filename))

    return OneLineDiskSaver(dirname, require_empty=False, atomic=True)


def _rank() -> int:
    import ignite.distributed as idist

    return idist.get_rank()


def _saved_iteration(checkpoint, path) -> int:
    """The trainer's iteration in a checkpoint being saved (a best model has no trainer:
    the number in its file name)."""
    trainer = checkpoint.get("trainer") if isinstance(checkpoint, dict) else None
    if isinstance(trainer, dict) and isinstance(trainer.get("iteration"), int):
        return trainer["iteration"]
    return checkpoint_iteration(path)


def save_error(error: Exception, checkpoint, dirname) -> Exception:
    """A DistkitError for a failed save: a full disk named as such, other OSErrors in one
    line; anything else unchanged."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return disk_error(error, dirname)
    if isinstance(error, RuntimeError) and "unexpected pos" in str(error):
        # A short write. DiskSaver has removed its temporary file, so the free space is
        # back to what it was before the save: less than the checkpoint needs = disk full.
        import shutil

        need = sum(t.numel() * t.element_size() for t in _tensors(checkpoint))
        free = shutil.disk_usage(dirname).free
        if free < need + (1 << 20):
            return disk_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), dirname)
    if isinstance(error, OSError):
        return disk_error(error, dirname)
    return error


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def make_run_dir(output_dir: str, backend: str, world_size: int) -> str:
    """Create a fresh folder ``<output_dir>/<time>-<backend>-<world_size>procs``; never
    reuse one (a suffix is added if the name exists)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"{stamp}-{backend}-{world_size}procs"
    for n in range(1000):
        path = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True, exist_ok=False)
            return str(path)
        except FileExistsError:
            continue
        except OSError as e:
            raise disk_error(e, output_dir) from None
    raise DistkitError(f"could not create a fresh run folder under {output_dir}: clean it up")


def to_save(trainer, model, optimizer, lr_scheduler, settings=None) -> dict:
    """What a checkpoint holds; the same dict is used to save and to load. ``settings``
    (a :class:`RunSettings`) records what a resumed run must share with this one."""
    objects = {"trainer": trainer, "model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler}
    if settings is not None:
        objects[SETTINGS] = settings
    return objects


SETTINGS = "settings"
# What a resumed run must share with the run that wrote the checkpoint, and why: the
# trainer, optimizer and lr schedule come back from the checkpoint as they were, so a
# changed value here would be silently ignored or would silently change the run. The
# layout (world size, nodes, strategy) is recorded too but may change: distkit.checkpoint.reshard.
_MUST_MATCH = {
    "task": ("--task (or --dataset/--model)", "the weights, data and metrics belong to it"),
    "dataset_size": ("--dataset-size", "the synthetic data and the epoch length depend on it"),
    "batch_size": ("--batch-size", "the epoch length and the order of batches depend on it"),
    "epochs": ("--epochs", "the lr schedule, restored from the checkpoint, ends at its last epoch"),
    "lr": ("--lr", "the lr schedule is restored from the checkpoint"),
    "scale_lr": ("--scale-lr", "the lr schedule is restored from the checkpoint"),
    "warmup_epochs": ("--warmup-epochs", "the lr schedule is restored from the checkpoint"),
    "momentum": ("Config.momentum", "the optimizer is restored from the checkpoint"),
    "weight_decay": ("Config.weight_decay", "the optimizer is restored from the checkpoint"),
    "seed": ("--seed", "the train/validation split and the data order depend on it"),
    "optimizer": ("the task's optimizer", "its state is restored from the checkpoint"),
    "task_settings": ("the task's settings (--set)", "the task's data, model or step depend on them"),
}


def resume_settings(config, task_name: str, world_size: int, optimizer: str | None = None) -> dict:
    """The values of ``_MUST_MATCH`` for this run (plain values: loadable with
    ``weights_only=True``); ``optimizer``: the optimizer's class name."""
    settings = {"task": task_name, "world_size": int(world_size), "nnodes": _nnodes(config),
                "strategy": config.strategy}
    if optimizer is not None:
        settings["optimizer"] = optimizer
    for name in _MUST_MATCH:
        if name not in settings and hasattr(config, name):
            settings[name] = getattr(config, name)
    if config.dataset != "synthetic" or getattr(config, "task", None):
        settings.pop("dataset_size", None)  # only the synthetic set has a size to choose
    return settings


def _nnodes(config) -> int:
    """The nodes of this run: the process group's where one is formed, else the config's."""
    import ignite.distributed as idist

    return int(idist.get_nnodes()) if idist.get_world_size() > 1 else int(config.nnodes)


class RunSettings:
    """The ``settings`` entry of every checkpoint: :func:`resume_settings` of the run
    that wrote it. Loading it changes nothing; :func:`check_checkpoint_fits` compares it
    with the resuming run's, before any process starts."""

    def __init__(self, settings: dict):
        self.settings = dict(settings)

    def state_dict(self) -> dict:
        return dict(self.settings)

    def load_state_dict(self, state: dict) -> None:
        pass


def check_settings_match(path: str, saved: dict, current: dict) -> None:
    """Refuse, in one line naming the flag, a resume whose settings differ from the
    checkpoint's (see ``_MUST_MATCH``)."""
    for name, (flag, why) in _MUST_MATCH.items():
        if name not in saved or name not in current or saved[name] == current[name]:
            continue
        if name == "task":
            fix = f"the task {saved[name]!r}"
        elif name == "optimizer":
            fix = f"a task whose optimizer is {saved[name]}"
        elif name == "task_settings":
            fix = " ".join(f"--set {k}={v}" for k, v in saved[name].items()) or "no --set"
        elif isinstance(saved[name], bool):
            fix = flag if saved[name] else f"no {flag}"
        else:
            fix = f"{flag} {saved[name]}"
        raise DistkitError(
            f"--resume-from {path!r} was written with {flag} = {saved[name]!r} and this run has "
            f"{current[name]!r} ({why}): resume with {fix}, or start a new run without --resume-from")


def load_checkpoint(path: str) -> dict:
    """Load a checkpoint file safely (``weights_only=True``), or fail in one line."""
    if not os.path.isfile(path):
        raise DistkitError(f"--resume-from {path!r}: no such file; pass a checkpoint "
                           "written by a previous run (<run dir>/checkpoints/*.pt)")
    problem = checksum_problem(path)
    if problem is not None:  # proven before torch.load reads a byte of it
        raise DistkitError(f"--resume-from {path!r} is not loaded: {problem}; pass another "
                           "checkpoint, or --resume-from latest (it passes over damaged files)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise DistkitError(f"--resume-from {path!r} is not a loadable checkpoint "
                           f"({type(e).__name__}): pass a .pt file written by distkit train") from None
    missing = {"trainer", "model", "optimizer", "lr_scheduler"} - set(ckpt if isinstance(ckpt, dict) else {})
    if missing:
        raise DistkitError(f"--resume-from {path!r} lacks {', '.join(sorted(missing))}: pass a "
                           "checkpoint written by distkit train")
    for name, keys in _REQUIRED_KEYS.items():
        entry = ckpt[name]
        if not isinstance(entry, dict):
            raise DistkitError(f"--resume-from {path!r}: its {name!r} entry is a "
                               f"{type(entry).__name__}, not a state dict: pass a checkpoint "
                               "written by distkit train")
        lacking = [k for k in keys if k not in entry]
        if lacking:
            raise DistkitError(f"--resume-from {path!r}: its {name!r} state lacks "
                               f"{', '.join(lacking)}: pass a checkpoint written by distkit train")
    counts = {k: ckpt["trainer"][k] for k in ("iteration", "epoch_length", "max_epochs")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()) \
            or counts["epoch_length"] == 0:
        raise DistkitError(f"--resume-from {path!r}: its trainer state is not a trainer's "
                           f"({counts}): pass a checkpoint written by distkit train")
    return ckpt


# Keys each entry's state dict must have for ignite to load it (the rest it checks itself).
_REQUIRED_KEYS = {"trainer": ("iteration", "epoch_length", "max_epochs"), "model": (),
                  "optimizer": ("state", "param_groups"), "lr_scheduler": ()}


def check_checkpoint_fits(path: str, config, task=None, world_size: int | None = None) -> None:
    """Fail early if the checkpoint was written for another task's model (``task``
    default: the config's, see ``distkit.tasks.resolve_task``), or with settings this
    run would silently change (see ``_MUST_MATCH``; ``world_size`` None: not compared;
    another world size, nodes or strategy is resharded: ``distkit.checkpoint.reshard``)."""
    from distkit.tasks import resolve_task

    ckpt = load_checkpoint(path)
    task = resolve_task(task if task is not None else config)
    model = task.model(config)
    try:
        model.load_state_dict(ckpt["model"])
    except Exception:  # RuntimeError for other shapes, TypeError/AttributeError for non-tensors
        flags = f"--task {config.task}" if config.task else \
            f"--model {config.model} --dataset {config.dataset}"
        raise DistkitError(
            f"--resume-from {path!r} holds weights for another model than the task {task.name!r} "
            f"({flags}): resume with the task and flags of the run that wrote it") from None
    if checkpoint_is_finished(ckpt, config.early_stopping_patience):
        done = ("stopped early by EarlyStopping" if stopped_early(ckpt, config.early_stopping_patience)
                else f"all {ckpt['trainer']['max_epochs']} epochs done")
        raise DistkitError(
            f"--resume-from {path!r} is the end of a finished run ({done}): nothing is left to "
            "resume; start a new run without --resume-from")
    if not isinstance(ckpt.get(SETTINGS), dict):
        raise DistkitError(
            f"--resume-from {path!r} does not record the settings it was trained with (written "
            "by an older distkit, or not by distkit train): start a new run without --resume-from")
    optimizer = type(task.optimizer(model.parameters(), config)).__name__
    current = resume_settings(config, task.name, world_size if world_size else 0, optimizer)
    if not world_size:
        current.pop("world_size")
    check_settings_match(path, ckpt[SETTINGS], current)


def checkpoint_is_finished(ckpt: dict, patience: int = 0) -> bool:
    """True if the checkpoint's trainer had done all its epochs (ignite would start a new
    run from it, epoch 1, lr schedule at its end, instead of resuming), or if its early
    stopping, with the resuming run's ``patience``, had ended the run: resuming would
    train epochs the run it belongs to never trained."""
    state = ckpt["trainer"]
    return state["iteration"] >= state["epoch_length"] * state["max_epochs"] or stopped_early(ckpt, patience)


def stopped_early(ckpt: dict, patience: int) -> bool:
    """True if the checkpoint's EarlyStopping had waited ``patience`` epochs without
    improvement: its run stopped at this checkpoint's epoch end."""
    stopper = ckpt.get("early_stopping")
    return bool(patience) and isinstance(stopper, dict) and stopper.get("counter", 0) >= patience


def write_results(run_dir: str, results: dict) -> None:
    """``<run_dir>/results.json``, whole or not at all: a temporary file, fsync, then a
    rename (readers never see a half-written file); a failure leaves no temporary file
    and is one line (a full disk named as such, see :func:`disk_error`)."""
    try:
        # strict JSON: a NaN or inf (a task that trains on through them) becomes null
        write_json(os.path.join(run_dir, "results.json"), finite_json(results), durable=True,
                   dump={"indent": 2, "default": str, "allow_nan": False})
    except OSError as e:
        raise disk_error(e, run_dir) from None


def finite_json(value):
    """``value`` with every NaN or infinite float replaced by None (JSON's ``null``)::

        >>> finite_json({"loss": float("nan"), "history": [1.5, float("inf")]})
        {'loss': None, 'history': [1.5, None]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
