"""One run, one set of settings: every rank's effective settings compared with rank 0's
before the first step, and the replicas compared at the end.

Each node is started by its own command line; nothing else makes them agree. Two nodes
started with another ``--lr``, ``--seed`` or ``--dataset`` of the same size train silently
apart (the replicas end different, exit 0); another ``--batch-size`` or ``--epochs``
breaks a collective much later with a message that names no flag. So before the first
step :func:`check_same_settings` gathers every rank's :func:`effective_settings` (one
``all_gather_object``) and, where any differs from rank 0's, every rank stops with the
same line naming the setting and both values. At the end :func:`check_replicas_identical`
turns replicas that differ into an error the user sees.

What is compared: every field of :class:`~distkit.config.Config` (after the task's own
settings are filled in), except those in :data:`PER_NODE`, which may differ by design; the
task's name and a SHA-256 of the source files of its functions; the world layout; the
distkit, torch, ignite and Python versions. A checkpoint to resume from is compared by its
recorded SHA-256, not its path (each node may mount the folder elsewhere)::

    >>> from distkit.config import Config
    >>> differences({"config.lr": 0.1, "config.seed": 0}, {"config.lr": 0.05, "config.seed": 0})
    [('config.lr', 0.1, 0.05)]
    >>> setting_label("config.lr"), setting_label("task.source_sha256")
    ('--lr', "the task's source (a SHA-256 of its module files)")
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import platform
import sys
from functools import partial

from distkit.errors import DistkitError

PER_NODE = {
    "node_rank": "differs between nodes by definition",
    "master_addr": "each node may name node 0 its own way (a hostname, an address); they met there",
    "threads_per_process": "resolved on each node from its own cores",
    "data_dir": "a path on each node's own disk (the data's size is compared through the task)",
    "output_dir": "only rank 0 writes; a checkpoint to resume from is compared by its checksum",
    "progress_bar": "what each node shows, not what it trains",
    "verbose": "what each node prints, not what it trains",
    "logger": "the tracker runs on rank 0 only",
}
"""Config fields that may differ between nodes, and why; every other field must agree."""


def effective_settings(config, task) -> dict:
    """What this rank will train: ``{"config.<field>": value, "task.name": ...,
    "task.source_sha256": ..., "world.<...>": ..., "versions.<...>": ...}`` (plain values,
    comparable with ``==``). ``config`` after ``task.configure``; call inside the process
    group (it reads the world layout)."""
    import ignite
    import ignite.distributed as idist
    import torch

    settings = {}
    for field in dataclasses.fields(config):
        if field.name in PER_NODE:
            continue
        value = getattr(config, field.name)
        if field.name == "resume_from" and value:
            value = _checkpoint_identity(value)
        settings[f"config.{field.name}"] = value
    settings["task.name"] = task.name
    settings["task.source_sha256"] = task_source_digest(task)
    settings["world.size"] = idist.get_world_size()
    settings["world.nnodes"] = idist.get_nnodes()
    settings["world.nproc_per_node"] = idist.get_nproc_per_node()
    settings["world.backend"] = idist.backend() or "none"
    settings["versions.distkit"] = distkit_version()
    settings["versions.torch"] = torch.__version__
    settings["versions.ignite"] = ignite.__version__
    settings["versions.python"] = platform.python_version()
    return settings


def distkit_version() -> str:
    """The installed distkit's version (its package metadata), "unknown" if not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("distkit")
    except PackageNotFoundError:
        return "unknown"


def _checkpoint_identity(path: str) -> str:
    from distkit.checkpoint.saver import read_checksum

    record = read_checksum(path)
    return f"sha256:{record['sha256'][:16]}" if record else f"file {os.path.basename(path)}"


def _functions(obj):
    """The plain functions (and classes) behind a task field: a partial's function and
    its arguments, searched through."""
    if isinstance(obj, partial):
        yield from _functions(obj.func)
        for arg in (*obj.args, *obj.keywords.values()):
            yield from _functions(arg)
    elif inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj):
        yield obj


def task_source_digest(task) -> str:
    """A SHA-256 of the source files of every module that defines one of ``task``'s
    functions (its datasets, model, loss, metrics, step ...), by content: the same file at
    another path on another node has the same digest."""
    files = set()
    for field in dataclasses.fields(task):
        for fn in _functions(getattr(task, field.name)):
            module = sys.modules.get(getattr(fn, "__module__", "") or "")
            path = getattr(module, "__file__", None)
            if path and os.path.isfile(path):
                files.add(os.path.realpath(path))
    contents = sorted(hashlib.sha256(open(p, "rb").read()).hexdigest() for p in files)
    return hashlib.sha256("\n".join(contents).encode()).hexdigest()[:16]


def differences(mine: dict, reference: dict) -> list:
    """``[(setting, mine, reference's)]`` for every setting that differs (or is missing
    from one of them), in ``reference``'s order."""
    names = list(reference) + [k for k in mine if k not in reference]
    missing = "<not set>"
    return [(k, mine.get(k, missing), reference.get(k, missing)) for k in names
            if mine.get(k, missing) != reference.get(k, missing)]


def setting_label(name: str) -> str:
    """How a user sets it: ``--lr``, ``Config.momentum``, "the task's source" ..."""
    from distkit.config import _label

    kind, _, field = name.partition(".")
    if kind == "config":
        if field == "task_settings":
            return "the task's settings (--set)"
        return _label(field)
    return {
        "task.name": "the task (--task, or --dataset/--model)",
        "task.source_sha256": "the task's source (a SHA-256 of its module files)",
        "world.size": "the world size",
        "world.nnodes": "the number of nodes",
        "world.nproc_per_node": "the processes per node (--nproc-per-node)",
        "world.backend": "the backend",
    }.get(name, name.replace("versions.", "the version of "))


def check_in_ranks(config, task) -> None:
    """The check ``agreement`` of :mod:`distkit.launch.checks`, the last one, run by every
    rank inside the process group before the first step: the global batch on the world
    this rank is part of (a notebook may call ``training`` without the launcher's checks),
    then :func:`check_same_settings`."""
    import ignite.distributed as idist

    if idist.get_world_size() == 1:
        return  # one process: every batch fits it, and it agrees with itself
    config.check_batch_fits(idist.get_world_size())
    check_same_settings(config, task)


def check_same_settings(config, task) -> None:
    """Compare this rank's :func:`effective_settings` with rank 0's (a collective: call on
    every rank, before the first step); where any rank differs, raise on every rank the
    same one-line DistkitError naming the setting(s), the values and the ranks."""
    import ignite.distributed as idist

    if idist.get_world_size() == 1 or idist.backend() in (None, "xla-tpu"):
        return  # one process agrees with itself; XLA has no object collectives
    import torch.distributed as dist

    mine = {"node": idist.get_node_rank(), "settings": effective_settings(config, task)}
    gathered = [None] * idist.get_world_size()
    dist.all_gather_object(gathered, mine)
    message = disagreement(gathered)
    if message:
        raise DistkitError(message)


def disagreement(gathered: list) -> str | None:
    """The one line that says where the ranks' settings (``[{"node": n, "settings": {...}}]``
    in rank order) differ from rank 0's, or None if they all agree::

        >>> a = {"node": 0, "settings": {"config.lr": 0.05, "config.seed": 0}}
        >>> b = {"node": 1, "settings": {"config.lr": 0.1, "config.seed": 0}}
        >>> print(disagreement([a, a, b, b]))
        settings differ between ranks: --lr is 0.1 on rank 2 (node 1) and 0.05 on rank 0 (node 0); nothing was trained: start every node with the same flags, task file and versions (rank 0's are the reference)
    """
    reference = gathered[0]["settings"]
    for rank, entry in enumerate(gathered):
        found = differences(entry["settings"], reference)
        if found:
            shown = "; ".join(
                f"{setting_label(name)} is {theirs!r} on rank {rank} (node {entry['node']}) and "
                f"{ours!r} on rank 0 (node {gathered[0]['node']})"
                for name, theirs, ours in found[:3])
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            return (f"settings differ between ranks: {shown}{more}; nothing was trained: start "
                    "every node with the same flags, task file and versions (rank 0's are the "
                    "reference)")
    return None


def check_replicas_identical(digests: dict) -> None:
    """Replicas that differ at the end of a run (``{"initial": [sha256 per rank],
    "final": [...]}``) are an error the user sees, not a field of results.json."""
    for when, values in digests.items():
        if len(set(values)) > 1:
            odd = [r for r, d in enumerate(values) if d != values[0]]
            raise DistkitError(
                f"the replicas' {when} parameters differ between ranks (rank(s) "
                f"{', '.join(map(str, odd))} differ from rank 0): the ranks did not train the "
                "same model; results.json records replicas_identical: false. Check that every "
                "node runs the same distkit, torch and task, and report it if they do")
