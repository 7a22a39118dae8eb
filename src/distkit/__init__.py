"""distkit: a teaching kit for distributed data-parallel training with PyTorch-Ignite.

The same training function runs on 1 CPU process, N GPUs, a TPU and many nodes. The
public API (imported lazily: ``import distkit`` does not import torch)::

    from distkit import Config, Task, run, launch_function

- :class:`Config` — every knob of a run; :class:`Task` — a course's own data, model,
  loss, metrics and score (``distkit.tasks``).
- :func:`run` ``(config, task=None)`` — train, spawning processes or joining torchrun /
  SLURM (``distkit.launch``); :func:`launch_function` ``(fn, *args, ...)`` — the same
  launcher for any ``fn(local_rank, ...)`` training function; :func:`launch_script`
  ``(path, args, nproc_per_node=...)`` — any script that makes its own process group
  (``distkit launch``).
- ``distkit.training`` — ``training(local_rank, config, task)``, the function every
  launcher runs; ``distkit.sharding``, ``distkit.profiling``, ``distkit.plots``,
  ``distkit.checkpoint``: the kit's other core modules.

Notebook props live in ``distkit.lessons``, the command line in ``distkit.commands``.
"""
import importlib
import importlib.metadata
import re

__version__ = "0.1.0"

# The oldest torch the test suite runs on (the Colab-like environment's 2.9.0); the kit
# imports FSDP2's fully_shard, torch.distributed.pipelining and DTensor APIs that older
# releases lack. requirements.txt states the same floor (tests/test_packaging.py checks).
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

from distkit import compat as _compat  # noqa: E402

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
    "run": "distkit.launch",
    "launch_function": "distkit.launch",
    "launch_script": "distkit.script_launch",
}
_MODULES = ("tasks", "training", "launch", "checkpoint", "sharding", "profiling", "plots",
            "data", "models", "config", "runner", "compat", "errors", "machine",
            "preflight", "reporting", "schedules", "effective", "script_launch")

__all__ = ["__version__", *_EXPORTS, *_MODULES]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _MODULES:
        return importlib.import_module(f"distkit.{name}")
    raise AttributeError(f"module 'distkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
