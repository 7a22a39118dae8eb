"""One way to run a function on N local ranks and get back what each returned.

:func:`run_per_rank` starts ``nproc_per_node`` processes with ``idist.Parallel`` (gloo,
nccl or xla-tpu), pins each to its share of the cores, bounds every collective by a
timeout, and returns the list of per-rank return values (index = rank). Notebooks,
lessons, ``distkit shard-check`` and the exercise checks all use it.

The port, the thread rule and the quieting of ignite's INFO lines come from
:mod:`distkit.host.facts`.

Example (a script: under spawn ``fn`` must be importable, hence the ``__main__`` guard)::

    import ignite.distributed as idist
    from distkit.launch.runner import run_per_rank

    def whoami(local_rank):
        return idist.get_rank(), idist.get_world_size()

    if __name__ == "__main__":
        print(run_per_rank(whoami, 2))   # [(0, 2), (1, 2)]
"""
from __future__ import annotations

import tempfile

import ignite.distributed as idist

from distkit.config import Config
from distkit.observe.failures import Reporter, default_folder
from distkit.launch.entry import pinned, prepare_fork, start
from distkit.host.facts import quiet_ignite_logs
from distkit.launch.checks import check_launch
from distkit.launch.supervise import read_result, write_result


def run_per_rank(fn, nproc_per_node: int = 2, backend: str = "gloo", *args,
                 start_method: str | None = None, timeout_s: float = 120.0, **kwargs) -> list:
    """Run ``fn(local_rank, *args, **kwargs)`` in ``nproc_per_node`` fresh processes on
    this machine and return the list of what each rank returned (index = rank).

    Returned values must pickle. Processes start as every launcher of the kit starts them
    (:func:`distkit.launch.supervise.start`): checked first (backend, port), threads pinned to each
    process's share of the cores, collectives bounded by ``timeout_s``, a failed rank
    reported in one line. They are forked where that is safe or under IPython (ignite's
    default there), so ``fn`` may be defined in a notebook cell; elsewhere they may be
    spawned and ``fn`` must be importable (defined in a module). ``start_method``
    ("fork", "spawn") overrides."""
    launch = check_launch(Config(backend=backend, nproc_per_node=nproc_per_node,
                                 timeout_s=timeout_s).validate_processes(), spawning=True)
    launch = prepare_fork(launch, start_method)
    with tempfile.TemporaryDirectory() as folder:
        start(launch, Reporter(folder=default_folder(), timeout_s=timeout_s), pinned, _record_worker,
              launch.threads_per_process, fn, folder, args, kwargs, start_method=start_method)
        return _read_per_rank(folder, nproc_per_node)


def _read_per_rank(folder, nproc_per_node):
    return [read_result(folder, rank) for rank in range(nproc_per_node)]


def _record_worker(local_rank, fn, folder, args, kwargs):
    with quiet_ignite_logs():  # a spawned rank starts with ignite's default levels
        value = fn(local_rank, *args, **kwargs)
    write_result(folder, idist.get_rank(), value)


