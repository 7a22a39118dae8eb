"""One way to run a function on N local ranks and get back what each returned.

:func:`run_per_rank` starts ``nproc_per_node`` processes with ``idist.Parallel`` (gloo,
nccl or xla-tpu), pins each to its share of the cores, bounds every collective by a
timeout, and returns the list of per-rank return values (index = rank). Notebooks,
lessons, ``distkit shard-check`` and the exercise checks all use it.

The port, the thread rule and the quieting of ignite's INFO lines come from
:mod:`distkit.machine`.

Example (a script: under spawn ``fn`` must be importable, hence the ``__main__`` guard)::

    import ignite.distributed as idist
    from distkit.runner import run_per_rank

    def whoami(local_rank):
        return idist.get_rank(), idist.get_world_size()

    if __name__ == "__main__":
        print(run_per_rank(whoami, 2))   # [(0, 2), (1, 2)]
"""
from __future__ import annotations

import os
import pickle
import tempfile
from datetime import timedelta

import ignite.distributed as idist
import torch

from distkit.errors import DistkitError
from distkit.machine import free_port, in_ipython, quiet_ignite_logs, threads_per_process


def run_per_rank(fn, nproc_per_node: int = 2, backend: str = "gloo", *args,
                 start_method: str | None = None, timeout_s: float = 120.0, **kwargs) -> list:
    """Run ``fn(local_rank, *args, **kwargs)`` in ``nproc_per_node`` fresh processes on
    this machine and return the list of what each rank returned (index = rank).

    Returned values must pickle. Collectives are bounded by ``timeout_s``. Under IPython the processes are forked
    (ignite's default there), so ``fn`` may be defined in a notebook cell; elsewhere they
    are spawned and ``fn`` must be importable (defined in a module), unless
    ``start_method="fork"``."""
    from distkit.config import Config
    from distkit.preflight import preflight

    if backend in ("nccl", "xla-tpu"):  # one line, before any process starts
        preflight(Config(backend=backend, nproc_per_node=nproc_per_node,
                         batch_size=max(64, nproc_per_node)), spawning=True)
    spawn_kwargs = {"start_method": start_method} if start_method else {}
    if backend in ("gloo", "nccl"):
        spawn_kwargs["timeout"] = timedelta(seconds=timeout_s)
    forking = start_method == "fork" or (start_method is None and in_ipython())
    if forking and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise DistkitError("CUDA is already initialised in this process, and a forked child cannot "
                           "use it: restart the kernel and start the processes before any cell "
                           "touches the GPU")
    threads = threads_per_process(nproc_per_node)
    # ignite's launcher logs here, its auto_* helpers in the ranks: the caller prints what matters
    with quiet_ignite_logs(), tempfile.TemporaryDirectory() as folder:
        with idist.Parallel(backend=backend, nproc_per_node=nproc_per_node,
                            master_port=free_port(), **spawn_kwargs) as parallel:
            parallel.run(_record_worker, fn, folder, threads, args, kwargs)
        return _read_per_rank(folder, nproc_per_node)


def _read_per_rank(folder, nproc_per_node):
    values = []
    for rank in range(nproc_per_node):
        with open(os.path.join(folder, f"rank{rank}.pkl"), "rb") as f:
            values.append(pickle.load(f))
    return values


def _record_worker(local_rank, fn, folder, threads, args, kwargs):
    torch.set_num_threads(threads)  # never more threads than this process's share of cores
    with quiet_ignite_logs():  # a spawned rank starts with ignite's default levels
        value = fn(local_rank, *args, **kwargs)
    # One file per rank (every backend can do that on one machine; XLA cannot gather objects).
    path = os.path.join(folder, f"rank{idist.get_rank()}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(value, f)
    os.replace(path + ".tmp", path)


