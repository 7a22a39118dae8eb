"""``run(config, task)``: start ``training`` in as many processes as asked for, or join a
launch; ``launch_function(fn, ...)`` does the same for any training function.

- ``nproc_per_node`` given (or no launcher around): spawn that many processes on this
  node with ``idist.Parallel`` (one per GPU with nccl; 2 on a CPU-only machine).
- Launched by torchrun or SLURM (``WORLD_SIZE`` / ``SLURM_JOB_ID`` set, no
  ``nproc_per_node``): spawn nothing; this process joins the launch.

Everything checkable is checked before any process starts, so bad input fails in one
line within seconds, with nothing half-written.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import ignite.distributed as idist
import torch
import torch.distributed as dist

from distkit.train import signals
from distkit.checkpoint.saver import make_run_dir
from distkit.config import Config
from distkit.errors import DistkitError
from distkit.observe.failures import Reporter, default_folder, for_function_callers
from distkit.host.facts import ranks_on_this_host, threads_per_process
from distkit.host.layout import inside_launch, launched_externally
from distkit.launch.checks import check_picklable, check_run
# The process-start core and its supervision live in distkit.launch.supervise; these names stay
# importable from here, where courses and notebooks found them.
from distkit.launch.supervise import (_fork_is_safe, check_spawned_can_import,  # noqa: F401
                               describe_process_failure, first_unimportable, fork_threads,
                               openmp_pool_forks_cleanly, prepare_fork, start, stop_workers)
from distkit.launch.supervise import read_result, write_result
from distkit.launch.script import call_with_kits_group
from distkit.train.training import training


def run(config, task=None) -> dict | None:
    """Run :func:`distkit.train.training.training` on ``task`` (default: ``config.task``, else
    the built-in task of ``config.dataset`` x ``config.model``) as the config says: spawn
    ``nproc_per_node`` processes, or join the torchrun / SLURM launch this process is part
    of. Returns rank 0's results (on every rank of a torchrun / SLURM launch).

    Spawned processes receive ``task`` by pickling: its functions must be defined at the
    top level of a module (or of the script, guarded as below), not as lambdas::

        from distkit import Config, run

        if __name__ == "__main__":   # spawned processes import this file: don't recurse
            results = run(Config(nproc_per_node=2, epochs=1, progress_bar=False))
            print(f"val accuracy {results['final']['val_accuracy']:.3f}")
    """
    try:
        plan = check_run(config, task)  # every check, in one order: a wrong input is one line, now
    except DistkitError as e:
        if not hasattr(e, "every_rank"):  # a rank's own launcher variable (LayoutError) says so itself
            e.every_rank = True  # under torchrun every rank fails here alike: one of them says so
        raise
    config, task, launch = plan.config, plan.task, plan.launch
    if not launch.spawning:  # the run folder: rank 0's training makes it, tells the others
        return start(launch, Reporter(verbose=launch.verbose, timeout_s=launch.timeout_s), _training_everywhere, config, task)
    if launch.backend != "none":
        check_picklable("the task", task)
    launch = prepare_fork(launch)
    config = dataclasses.replace(config, threads_per_process=launch.threads_per_process)
    # The launcher makes the run folder where it can (one process, or node 0 of a spawn)
    # and passes it to training; on node 1 training learns it from rank 0.
    run_dir = None
    if launch.nnodes == 1 or launch.node_rank == 0:
        run_dir = make_run_dir(config.output_dir, launch.backend, launch.world_size)
    try:
        value = start(launch, Reporter(run_dir, verbose=launch.verbose, timeout_s=launch.timeout_s),
                      training, config, task, run_dir, run_dir=run_dir)
    except signals.Preempted as e:  # the line ends with the command that goes on
        if e.checkpoint:
            e.args = (f"{e}; resume with: {signals.resume_command(e.checkpoint)}",)
        raise
    if launch.backend == "none":
        return value
    return read_results(run_dir) if run_dir else None


def launch_function(fn, *args, backend: str = "auto", nproc_per_node: int | None = None,
                    nnodes: int = 1, node_rank: int | None = None, master_addr: str | None = None,
                    master_port: int | None = None, timeout_s: float = 120.0,
                    threads_per_process: int | None = None, verbose: bool = False,
                    all_ranks: bool = False):
    """Run any training function ``fn(local_rank, *args)`` (ignite's examples write
    ``training(local_rank, config)``) on every rank, the way :func:`run` runs the kit's:
    the same checks before any process starts, a free port, threads pinned to each
    process's share of the cores, collectives bounded by ``timeout_s``, and a rank that
    dies or raises reported in one line (``DistkitError``) naming it, with the exception's
    type, first line and ``file:line``; the rank's full traceback goes to a file whose
    path the line gives (``verbose=True`` prints it too). Inside a torchrun / SLURM
    launch it joins the launch instead of spawning (``nproc_per_node`` is then the
    launcher's to set, and ignored here).

    Returns what ``fn`` returned on rank 0, everywhere: to the caller after spawning, and
    on every rank of a joined launch; with ``all_ranks=True``, the list of every rank's
    return value (index = rank; after spawning with ``nnodes > 1``: this node's ranks,
    the others None). Return values must pickle. ``fn`` and ``args`` must pickle too
    (top-level functions of a module or of a script guarded by ``if __name__ ==
    "__main__":``)::

        import ignite.distributed as idist
        from distkit import launch_function

        def training(local_rank, config):
            total = idist.all_reduce(idist.get_rank() + 1)
            return f"{idist.get_world_size()} ranks, sum of ranks+1 = {total}"

        if __name__ == "__main__":
            print(launch_function(training, {"lr": 0.1}, backend="gloo", nproc_per_node=2))
    """
    try:
        return _launch_function(fn, args, backend, nproc_per_node, nnodes, node_rank, master_addr,
                                master_port, timeout_s, threads_per_process, verbose, all_ranks)
    except DistkitError as e:  # its callers pass parameters, not distkit train's flags
        e.args = (for_function_callers(str(e)),)
        raise


def _launch_function(fn, args, backend, nproc_per_node, nnodes, node_rank, master_addr,
                     master_port, timeout_s, threads_per_process, verbose, all_ranks):
    spawning = not inside_launch() and (nproc_per_node is not None or not launched_externally())
    if not spawning:
        nproc_per_node = None  # torchrun / srun started the processes: join them
    # the launch checks only: fn has no global batch, dataset or checkpoint to check
    launch = check_run(Config(backend=backend, nproc_per_node=nproc_per_node, nnodes=nnodes,
                              node_rank=node_rank, master_addr=master_addr,
                              master_port=master_port, timeout_s=timeout_s,
                              threads_per_process=threads_per_process, verbose=verbose),
                       spawning=spawning, scopes=("processes",)).launch
    if not spawning:
        return start(launch, Reporter(verbose=verbose, timeout_s=launch.timeout_s), _shared_result, fn,
                     launch.threads_per_process, all_ranks, *args)
    if launch.backend == "none":
        value = start(launch, Reporter(verbose=verbose, timeout_s=launch.timeout_s), pinned, fn,
                      launch.threads_per_process, *args)
        return [value] if all_ranks else value
    check_picklable("the training function and its arguments", (fn, args))
    launch = prepare_fork(launch)
    with tempfile.TemporaryDirectory(prefix="distkit-results-") as folder:
        # no run folder here: the ranks' tracebacks go to one temporary folder of this launch
        start(launch, Reporter(folder=default_folder(), verbose=verbose,
                       timeout_s=launch.timeout_s), _recorded, fn,
              launch.threads_per_process, folder, all_ranks, *args)
        return _read_recorded(folder, launch, all_ranks)


def _training_everywhere(local_rank, config, task):
    """``training`` in a joined rank; rank 0's results handed to every rank (a script
    written for spawn, ``results["final"]...``, then runs unchanged under torchrun)."""
    results = training(local_rank, config, task)
    if idist.get_world_size() == 1:
        return results
    text = idist.broadcast(json.dumps(results, default=str) if idist.get_rank() == 0 else "",
                           src=0, safe_mode=True)
    return results if idist.get_rank() == 0 else json.loads(text)


def _shared_result(local_rank, fn, threads, all_ranks, *args):
    """``fn`` in a joined rank; rank 0's value (or every rank's) handed to every rank."""
    value = pinned(local_rank, fn, threads, *args)
    if idist.get_world_size() == 1 or idist.backend() == "xla-tpu":  # XLA: no object collectives
        return [value] if all_ranks else value
    if all_ranks:
        values = [None] * idist.get_world_size()
        dist.all_gather_object(values, value)
        return values
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _recorded(local_rank, fn, threads, folder, all_ranks, *args):
    """``fn`` in a spawned rank; its value written to ``folder`` (rank 0's, or every rank's)."""
    value = pinned(local_rank, fn, threads, *args)
    if all_ranks or idist.get_rank() == 0:
        write_result(folder, idist.get_rank(), value)
    return value


def _read_recorded(folder, launch, all_ranks):
    def read(rank):
        return read_result(folder, rank, missing=None)

    if all_ranks:
        first = (launch.node_rank or 0) * launch.nproc_per_node
        mine = range(first, first + launch.nproc_per_node)
        return [read(r) if r in mine else None for r in range(launch.world_size)]
    return read(0)


def pinned(local_rank, fn, threads, *args):
    """``fn`` in this process, with ``threads`` torch threads, else its share of the cores
    (the one rule: the cores divided by the ranks on this host)."""
    torch.set_num_threads(threads or threads_per_process(ranks_on_this_host()))
    return call_with_kits_group(fn, local_rank, *args)  # fn's own init/destroy: one line


def read_results(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


