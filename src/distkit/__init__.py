"""distkit: a teaching kit for distributed data-parallel training with PyTorch-Ignite.

The same training function runs on 1 CPU process, N GPUs, a TPU and many nodes. The
public API (imported lazily: ``import distkit`` does not import torch)::

    from distkit import Config, Task, run, launch_function, launch_script

- :class:`Config` — every knob of a run; :class:`Task` — a course's own data, model,
  loss, metrics and score (``distkit.tasks``).
- :func:`run` ``(config, task=None)`` — train, spawning processes or joining torchrun /
  SLURM; :func:`launch_function` ``(fn, *args, ...)`` — the same launcher for any
  ``fn(local_rank, ...)`` training function; :func:`launch_script` ``(path, args,
  nproc_per_node=...)`` — any script that makes its own process group (``distkit launch``).

The core lives in rooms named for their jobs (docs/architecture.md): ``host`` (facts
about this machine and launch), ``compat``, ``builtin`` (data, models, text),
``checkpoint``, ``observe``, ``train``, ``launch``. Notebook props live in
``distkit.lessons``, the command line in ``distkit.commands``.
"""
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import re
import sys

__version__ = "0.1.0"

# The oldest torch the test suite runs on (the Colab-like environment's 2.9.0); the kit
# imports FSDP2's fully_shard, torch.distributed.pipelining and DTensor APIs that older
# releases lack. requirements.txt states the same floor (tests/package/test_packaging.py checks).
TORCH_NEEDED = (2, 9)


def torch_too_old(version: str, needed: tuple = TORCH_NEEDED) -> str | None:
    """The one-line refusal for an installed torch ``version`` older than ``needed``, or
    None when it will do (``"2.8.0+cu126"``: the line; ``"2.10.0a0+git1"``: None)."""
    found = tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:2])
    if found >= needed:
        return None
    want = ".".join(map(str, needed))
    return f"distkit needs torch >= {want}, found torch {version}: pip install 'torch>={want}'"


def _check_torch() -> None:
    # read from the installed metadata: `import distkit` still imports no torch
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return  # no torch at all: the first module that needs it says so
    problem = torch_too_old(version)
    if problem:
        raise ImportError(problem)


_check_torch()

from distkit.compat import shims as _compat  # noqa: E402

# ignite and torch_xla are patched before anything uses them; without torch_xla this only
# sets an environment variable (no torch import).
_compat.apply()

# name -> module that defines it; looked up on first use (PEP 562), so `import distkit`
# and `distkit --help` stay fast.
_EXPORTS = {
    "Config": "distkit.config",
    "Task": "distkit.tasks",
    "resolve_task": "distkit.tasks",
    "DistkitError": "distkit.errors",
    "run": "distkit.launch.entry",
    "launch_function": "distkit.launch.entry",
    "launch_script": "distkit.launch.script",
}
# The module names that notebooks and courses imported before the core had rooms; each
# is the same module object as its room's (``distkit.machine is distkit.host.facts``).
# Recorded notebooks keep their code (and its digest), so these names stay public.
PUBLIC_MODULES = {
    "machine": "host.facts", "compat": "compat", "data": "builtin.data",
    "models": "builtin.models", "text": "builtin.text", "checkpoint": "checkpoint",
    "failures": "observe.failures", "reporting": "observe.reporting",
    "tracking": "observe.tracking", "profiling": "observe.profiling",
    "throughput": "observe.throughput", "tracing": "observe.tracing",
    "script_tracing": "observe.script_tracing", "plots": "observe.plots",
    "training": "train.training", "strategies": "train.strategies",
    "schedules": "train.schedules", "stopping": "train.stopping",
    "signals": "train.signals", "agreement": "train.agreement",
    "effective": "train.effective", "launch": "launch", "preflight": "launch.checks",
    "supervise": "launch.supervise", "runner": "launch.runner",
    "rendezvous": "launch.rendezvous", "script_launch": "launch.script",
    "script_worker": "launch.script_worker",
    "tasks": "tasks", "config": "config", "errors": "errors", "sharding": "sharding",
}


class _PublicNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``distkit.machine`` (a name of PUBLIC_MODULES with no file of its own) as
    the room's module itself, so that both names are one module object."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        room = PUBLIC_MODULES.get(name) if head == "distkit" else None
        if room is None or room == name or room.split(".")[0] == name:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module("distkit." + PUBLIC_MODULES[spec.name.split(".", 1)[1]])
        spec.loader_state = module.__spec__  # importlib sets __spec__ on what this returns
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_PublicNames())

__all__ = ["__version__", *_EXPORTS, *PUBLIC_MODULES]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in PUBLIC_MODULES:
        return importlib.import_module("distkit." + PUBLIC_MODULES[name])
    raise AttributeError(f"module 'distkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
