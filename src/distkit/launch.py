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

import json
import os
import re
from datetime import timedelta

import ignite.distributed as idist
import torch

from distkit.errors import DistkitError
from distkit.failures import Reporter
from distkit.machine import (available_memory, check_address_resolves, check_port_free, free_port,
                             in_ipython, inside_launch, launched_externally, local_world_size,
                             ranks_on_this_host, set_ignite_verbosity, threads_per_process,
                             tpu_available)

CPU_DEFAULT_NPROC = 2


def resolve_backend(backend: str) -> str:
    """Turn ``auto`` into nccl (CUDA), xla-tpu (TPU) or gloo, and check that the chosen
    backend can run here."""
    if backend == "auto":
        if torch.cuda.is_available():
            return "nccl"
        if tpu_available():
            return "xla-tpu"
        return "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise DistkitError("--backend nccl needs CUDA GPUs and none is visible here: "
                           "use --backend gloo (CPU) or --backend auto")
    if backend == "xla-tpu":
        try:
            import torch_xla  # noqa: F401
        except Exception:
            raise DistkitError("--backend xla-tpu needs torch_xla, which is not importable: "
                               "pip install -r requirements-xla.txt in its own environment "
                               "(see README), or use --backend auto") from None
    if backend not in ("none",) and backend not in idist.available_backends():
        raise DistkitError(f"backend {backend!r} is not available in this torch build "
                           f"(available: {', '.join(idist.available_backends())}): use --backend auto")
    return backend


def default_nproc(backend: str) -> int:
    if backend == "nccl":
        return torch.cuda.device_count()
    if backend == "xla-tpu":
        # PJRT replicates over every device of the host (TPU v2/v3: 2 per chip, v4+: 1;
        # XLA:CPU: CPU_NUM_DEVICES, default 1); xmp.spawn takes 1 or all of them.
        from distkit.compat import xla_local_device_count

        return xla_local_device_count()
    if backend == "none":
        return 1  # one plain process, no process group
    return CPU_DEFAULT_NPROC


# Peak memory per sample while the synthetic set is built (templates[labels], the noise,
# their sum, labels, permutation; measured: 787 bytes per 1x8x8 sample with torch 2.15).
SYNTHETIC_BYTES_PER_SAMPLE = 800


def check_synthetic_fits_in_memory(config, processes: int | None) -> None:
    """Every process builds the whole synthetic set in memory: refuse a size that cannot
    fit, instead of swapping the machine to a halt."""
    if config.dataset != "synthetic":
        return
    from distkit.data import VAL_SIZE

    processes = max(1, processes or 1)
    need = (config.dataset_size + VAL_SIZE) * SYNTHETIC_BYTES_PER_SAMPLE * processes
    have = available_memory()
    if have is not None and need > have:
        fits = max(1, have // (SYNTHETIC_BYTES_PER_SAMPLE * processes) - VAL_SIZE)
        raise DistkitError(
            f"--dataset-size {config.dataset_size} needs about {need / 2**30:.1f} GiB of memory "
            f"({processes} process(es) each build the synthetic set) and {have / 2**30:.1f} GiB "
            f"are available: use --dataset-size {fits} or less")


def preflight(config, spawning: bool, task=None):
    """Resolve the backend and the process count and check everything that can be checked
    before a process starts (a checkpoint to resume from against ``task``'s model).
    Returns a new, complete config."""
    config = config.replace().validate()
    if config.nproc_per_node is not None and inside_launch():
        raise DistkitError(
            f"--nproc-per-node {config.nproc_per_node} inside a torchrun/SLURM launch, which "
            "starts the processes itself: drop --nproc-per-node (torchrun's --nproc_per_node "
            "sets the count), or run distkit train without torchrun")
    backend = resolve_backend(config.backend)
    from distkit.strategies import check_strategy

    check_strategy(getattr(config, "strategy", "ddp"), backend)  # --backend auto on a TPU, too
    nproc = config.nproc_per_node
    if spawning and nproc is None:
        nproc = default_nproc(backend)
    if backend == "nccl" and nproc is not None and nproc > torch.cuda.device_count():
        raise DistkitError(f"--nproc-per-node {nproc} with nccl needs {nproc} GPUs but this node "
                           f"has {torch.cuda.device_count()}: use --nproc-per-node "
                           f"{torch.cuda.device_count()} or fewer")
    if backend == "xla-tpu" and nproc not in (None, 1):
        from distkit.compat import pjrt_nprocs, xla_local_device_count

        pjrt_nprocs(nproc, xla_local_device_count())  # 1 or every device, else one line
    if backend == "none" and nproc not in (None, 1):
        raise DistkitError(f"--backend none runs one plain process, not {nproc}: use "
                           "--backend gloo to start several")
    if config.master_addr is not None:
        check_address_resolves(config.master_addr)
    check_synthetic_fits_in_memory(config, nproc if spawning else local_world_size())
    if not spawning and "WORLD_SIZE" in os.environ:
        config.check_batch_fits(int(os.environ["WORLD_SIZE"]))
    if spawning:
        config.check_batch_fits(nproc * config.nnodes)
        if config.nnodes == 1 and config.master_port is None:
            config.master_port = free_port()
        elif config.node_rank in (None, 0) and config.master_port is not None:
            check_port_free(config.master_port)
    if config.resume_from == "latest":  # the newest checkpoint under --output-dir, if any
        from distkit.checkpoint import resolve_resume_from

        config = resolve_resume_from(config)
    if config.resume_from:
        from distkit.checkpoint import check_checkpoint_fits

        world_size = nproc * config.nnodes if spawning else \
            int(os.environ.get("WORLD_SIZE", "1"))
        check_checkpoint_fits(config.resume_from, config, task, world_size)
    if spawning and config.dataset in ("mnist", "cifar10"):
        # Download once here, before any process starts, so an offline machine fails fast.
        from distkit.data import fetch_torchvision

        fetch_torchvision(config.dataset, config.data_dir)
    return config.replace(backend=backend, nproc_per_node=nproc)


def run(config, task=None) -> dict | None:
    """Run :func:`distkit.training.training` on ``task`` (default: ``config.task``, else
    the built-in task of ``config.dataset`` x ``config.model``) as the config says: spawn
    ``nproc_per_node`` processes, or join the torchrun / SLURM launch this process is part
    of. Returns rank 0's results (None on the other ranks of an external launch).

    Spawned processes receive ``task`` by pickling: its functions must be defined at the
    top level of a module (or of the script, guarded as below), not as lambdas::

        from distkit import Config, run

        if __name__ == "__main__":   # spawned processes import this file: don't recurse
            results = run(Config(nproc_per_node=2, epochs=1, progress_bar=False))
            print(f"val accuracy {results['final']['val_accuracy']:.3f}")
    """
    from distkit.checkpoint import check_output_dir, make_run_dir
    from distkit.tasks import resolve_task
    from distkit.training import training

    try:
        task = resolve_task(task if task is not None else config).check()  # a wrong task: one line, now
        spawning = config.nproc_per_node is not None or not launched_externally()
        config = preflight(config, spawning, task)
        check_output_dir(config.output_dir)
    except DistkitError as e:
        e.every_rank = True  # under torchrun every rank fails here alike: one of them says so
        raise
    if not spawning:
        return _join(config, Reporter(config, verbose=config.verbose), training, config, task)
    if config.backend == "none":
        config.run_dir = make_run_dir(config.output_dir, "none", 1)
        return training(0, config, task)

    check_picklable("the task", task)
    world_size = config.nproc_per_node * config.nnodes
    if config.nnodes == 1 or config.node_rank == 0:
        config.run_dir = make_run_dir(config.output_dir, config.backend, world_size)
    _spawn(config, Reporter(config, verbose=config.verbose), training, config, task)
    return read_results(config.run_dir) if config.run_dir else None


def launch_function(fn, *args, backend: str = "auto", nproc_per_node: int | None = None,
                    nnodes: int = 1, node_rank: int | None = None, master_addr: str | None = None,
                    master_port: int | None = None, timeout_s: float = 120.0,
                    threads_per_process: int | None = None, verbose: bool = False):
    """Run any training function ``fn(local_rank, *args)`` (ignite's examples write
    ``training(local_rank, config)``) on every rank, the way :func:`run` runs the kit's:
    the same checks before any process starts, a free port, threads pinned to each
    process's share of the cores, collectives bounded by ``timeout_s``, and a rank that
    dies or raises reported in one line (``DistkitError``) naming it, with the exception's
    type, first line and ``file:line``; the rank's full traceback goes to a file whose
    path the line gives (``verbose=True`` prints it too). Inside a torchrun / SLURM
    launch (and no ``nproc_per_node``) it joins the launch instead of spawning.

    Returns ``fn``'s return value in a joined or single (``backend="none"``) process;
    None after spawning (write results to files on rank 0, as ignite's examples do).
    ``fn`` and ``args`` must pickle (top-level functions of a module or of a script
    guarded by ``if __name__ == "__main__":``)::

        import ignite.distributed as idist
        from distkit import launch_function

        def training(local_rank, config):
            total = idist.all_reduce(idist.get_rank() + 1)
            if idist.get_rank() == 0:
                print(f"{idist.get_world_size()} ranks, sum of ranks+1 = {total}")

        if __name__ == "__main__":
            launch_function(training, {"lr": 0.1}, backend="gloo", nproc_per_node=2)
    """
    try:
        return _launch_function(fn, args, backend, nproc_per_node, nnodes, node_rank, master_addr,
                                master_port, timeout_s, threads_per_process, verbose)
    except DistkitError as e:  # its callers pass parameters, not distkit train's flags
        from distkit.failures import for_function_callers

        e.args = (for_function_callers(str(e)),)
        raise


def _launch_function(fn, args, backend, nproc_per_node, nnodes, node_rank, master_addr,
                     master_port, timeout_s, threads_per_process, verbose):
    from distkit.config import Config
    from distkit.failures import Reporter, default_folder

    spawning = nproc_per_node is not None or not launched_externally()
    nproc = nproc_per_node
    if spawning and nproc is None:
        nproc = default_nproc(resolve_backend(backend))
    # fn has no global batch: give the config the smallest one preflight's batch check passes.
    world = nproc * nnodes if spawning else int(os.environ.get("WORLD_SIZE", "1"))
    config = preflight(Config(backend=backend, nproc_per_node=nproc_per_node, nnodes=nnodes,
                              node_rank=node_rank, master_addr=master_addr,
                              master_port=master_port, timeout_s=timeout_s,
                              threads_per_process=threads_per_process, verbose=verbose,
                              batch_size=max(1, world)),
                       spawning)
    if not spawning:
        return _join(config, Reporter(verbose=verbose), _pinned, fn, config.threads_per_process,
                     *args)
    if config.backend == "none":
        return _pinned(0, fn, config.threads_per_process, *args)
    check_picklable("the training function and its arguments", (fn, args))
    # no run folder here: the ranks' tracebacks go to one temporary folder of this launch
    _spawn(config, Reporter(folder=default_folder(), verbose=verbose), _pinned, fn,
           config.threads_per_process, *args)
    return None


def _pinned(local_rank, fn, threads, *args):
    """``fn`` in this process, with this process's share of the cores."""
    torch.set_num_threads(threads or threads_per_process(ranks_on_this_host()))
    return fn(local_rank, *args)


def check_picklable(what: str, obj) -> None:
    """Spawned processes receive their function and arguments pickled; fail in one line
    here rather than in every child. (Forked processes, as in notebooks, need no pickle.)"""
    if in_ipython():
        return
    import pickle

    try:
        pickle.dumps(obj)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DistkitError(
            f"{what} cannot be sent to spawned processes ({why}): define its functions at the "
            "top level of an importable module, or of a script run under an "
            "`if __name__ == \"__main__\":` guard, not as lambdas or nested functions") from None


def _spawn(config, reporter, fn, *args) -> None:
    """``fn(local_rank, *args)`` in ``config.nproc_per_node`` spawned processes of this
    node; a failed rank becomes one line naming it (``reporter``: where a rank that
    raises writes its traceback, see :mod:`distkit.failures`)."""
    # Spawned processes inherit this: one thread pool per process, never oversubscribed.
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads(config)))
    spawn_kwargs = {}
    if config.backend in ("gloo", "nccl"):
        spawn_kwargs["timeout"] = timedelta(seconds=config.timeout_s)
    if _fork_is_safe(config):
        # Forked workers start with torch, ignite and the kit already imported: the
        # workers were ready 3.5 s after the command started instead of 13.7 s with
        # spawn on the busy 2-core VM (benchmarks/README.md, start-up).
        spawn_kwargs["start_method"] = "fork"
    logs = set_ignite_verbosity(config.verbose)  # the launcher's own INFO lines: --verbose only
    import multiprocessing

    before = set(multiprocessing.active_children())  # a notebook's other children stay
    watchdog = StoppedRankWatchdog(before, config.nproc_per_node)
    watchdog.start()
    try:
        with idist.Parallel(backend=config.backend, nproc_per_node=config.nproc_per_node,
                            nnodes=config.nnodes, node_rank=config.node_rank,
                            master_addr=config.master_addr, master_port=config.master_port,
                            **spawn_kwargs) as parallel:
            parallel.run(_own_session, reporter, fn, *args)
    except KeyboardInterrupt:
        # SIGINT to this process only (Jupyter's "interrupt kernel", kill -INT): the
        # workers are non-daemonic, so without this they train on to the last epoch while
        # the interpreter's exit waits for them.
        stopped = stop_workers(set(multiprocessing.active_children()) - before)
        raise KeyboardInterrupt(interrupted_message(config, stopped)) from None
    except Exception as e:
        watchdog.finish()
        first = (config.node_rank or 0) * config.nproc_per_node
        if watchdog.stopped:
            ranks = ", ".join(str(first + r) for r in watchdog.stopped)
            raise DistkitError(
                f"rank {ranks} stopped answering (its process was stopped: SIGSTOP, Ctrl-Z or a "
                f"debugger); the other ranks gave up after --timeout {config.timeout_s:g} s and "
                "the job was ended. Resume with --resume-from latest (the newest checkpoint "
                "under --output-dir)") from None
        failure = describe_process_failure(e, config.node_rank or 0, config.nproc_per_node)
        if failure is None:
            raise
        raise failure from None
    finally:
        watchdog.finish()
        logs.restore()  # a notebook's own ignite calls log as before
        _discard_if_empty(config.run_dir)


def _own_session(local_rank, reporter, fn, *args):
    """``fn(local_rank, *args)`` in a session of its own that ends with the launcher; an
    exception it raises becomes one line (``distkit.failures.run_reporting``).

    Why a session: torchrun starts its workers so (``start_new_session``), and with the
    kernel's autogroup scheduling (on by default) the processes of one session share
    one scheduling group. Workers left in the launcher's session ran tiny steps at 0.91
    of torchrun's speed; in sessions of their own, 1.05 (6 rounds each, quiet 2-core VM;
    benchmarks/README.md, tiny steps). A terminal's Ctrl-C and Ctrl-Z then reach the
    launcher only, which stops the workers itself (``stop_workers``).

    Why "ends with the launcher": outside the launcher's session a worker no longer gets
    the terminal's hang-up, so it asks the kernel (Linux) for SIGTERM when its parent
    dies: a killed launcher leaves no orphan training on."""
    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:  # already a session leader
            pass
    _end_with_parent()
    from distkit.failures import run_reporting

    return run_reporting(reporter, fn, local_rank, *args)


def _end_with_parent() -> None:
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher was already gone before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class StoppedRankWatchdog:
    """Watches the spawned ranks; once one has exited while another is *stopped* (state
    ``T``: SIGSTOP, Ctrl-Z of one process, a debugger), it kills the stopped ones and
    remembers their local ranks.

    Why: a stopped rank makes the others time out in their next collective (after
    ``--timeout``); torch then ends the job with SIGTERM, which a stopped process never
    handles, and waits 30 s before SIGKILL; and the failure it reports is the healthy
    rank that timed out. It reads ``/proc`` instead of polling the ``Process`` objects,
    whose reaping belongs to torch's own join."""

    def __init__(self, before: set, nproc: int, poll_s: float = 0.2):
        import threading

        self.before, self.nproc, self.poll_s = before, nproc, poll_s
        self.stopped: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="distkit-watchdog", daemon=True)

    def start(self) -> None:
        if os.path.isdir("/proc"):  # Linux only; elsewhere torch's own clean-up applies
            self._thread.start()

    def finish(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _watch(self) -> None:
        import multiprocessing

        workers = []
        while not self._done.wait(self.poll_s):
            if len(workers) < self.nproc:  # spawned in local-rank order
                workers = sorted(set(multiprocessing.active_children()) - self.before,
                                 key=lambda p: p._identity)
                continue
            states = [_process_state(p.pid) for p in workers]
            if any(state in (None, "Z", "X") for state in states):  # one has exited
                for rank, (process, state) in enumerate(zip(workers, states)):
                    if state == "T":
                        self.stopped.append(rank)
                        os.kill(process.pid, 9)  # SIGKILL works on a stopped process
                return


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (R, S, D, T, Z...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def stop_workers(children, grace_s: float = 3.0) -> int:
    """Stop these child processes (SIGTERM, then SIGKILL after ``grace_s``) and reap
    them; a repeated Ctrl-C meanwhile is ignored, so the cleanup cannot be cut short.
    Returns how many were running."""
    import signal
    import threading
    import time

    children = [c for c in children if c.is_alive()]
    if not children:
        return 0
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        for child in children:
            child.terminate()
        deadline = time.monotonic() + grace_s
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(2.0)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    return len(children)


def interrupted_message(config, stopped: int) -> str:
    """What an interrupt left behind, and how to go on from it."""
    from distkit.checkpoint import latest_checkpoint_in

    newest = latest_checkpoint_in(config.run_dir) if config.run_dir else None
    kept = (f"resume from the last complete checkpoint with --resume-from {newest}"
            if newest else "no checkpoint had been written yet, so nothing is left behind")
    return f"stopped {stopped} worker process(es); {kept}"


def _discard_if_empty(run_dir) -> None:
    """A run that ended before writing anything of value leaves no folder behind."""
    if run_dir:
        from distkit.checkpoint import remove_run_dir_if_empty

        remove_run_dir_if_empty(run_dir)


def _threads(config) -> int:
    return config.threads_per_process or threads_per_process(config.nproc_per_node)


def _fork_is_safe(config) -> bool:
    """Fork rather than spawn the workers: on Linux, with gloo, CUDA never initialised in
    this process, and one torch thread per worker. Why the last: OpenMP's (libgomp's)
    thread pool does not survive a fork, and a forked child that runs OpenMP regions
    with several threads after the parent used the pool can hang; one thread runs them
    inline."""
    import sys

    return (sys.platform == "linux" and config.backend == "gloo" and _threads(config) == 1
            and not torch.cuda.is_initialized())


def _join(config, reporter, fn, *args):
    """Join a torchrun / SLURM launch: this process is one rank; spawn nothing. A rank
    that raises prints one line (the first of its node) and records it for torchrun's
    summary (:func:`distkit.failures.report_from_worker`)."""
    from distkit.failures import RankFailed, report_from_worker, run_reporting

    kwargs = {}
    if config.backend in ("gloo", "nccl"):
        kwargs["timeout"] = timedelta(seconds=config.timeout_s)
    idist.initialize(config.backend, **kwargs)
    try:
        return run_reporting(reporter, fn, idist.get_local_rank(), *args)
    except RankFailed as e:
        raise report_from_worker(e) from None
    except BaseException:
        if idist.get_rank() == 0:  # training set config.run_dir; the folder is rank 0's
            _discard_if_empty(config.run_dir)
        raise
    finally:
        idist.finalize()


def read_results(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def describe_process_failure(error: Exception, node_rank: int, nproc: int) -> DistkitError | None:
    """Turn torch.multiprocessing's report of a dead or failed child into one line that
    names the rank."""
    index = getattr(error, "error_index", None)
    if index is None:
        return None
    rank = node_rank * nproc + index
    signal_name = getattr(error, "signal_name", None)
    exit_code = getattr(error, "exit_code", None)
    if signal_name:
        return DistkitError(f"rank {rank} (local rank {index}) was killed by {signal_name}; the other "
                            "processes were stopped. Resume with --resume-from latest (the newest checkpoint under --output-dir)")
    if exit_code is not None:
        return DistkitError(f"rank {rank} (local rank {index}) exited with code {exit_code}; the "
                            "other processes were stopped. See its output above")
    # ProcessRaisedException: the child's traceback as text; keep its last line.
    text = str(error).strip().splitlines()
    last = text[-1] if text else repr(error)
    m = re.match(r"^distkit\.failures\.RankFailed: (.*)$", last)
    if m:  # the rank's own line: type, first line, file:line, traceback file
        return DistkitError(m.group(1))
    m = re.match(r"^distkit\.errors\.DistkitError: (.*)$", last)
    if m:
        return DistkitError(f"rank {rank}: {m.group(1)}")
    return DistkitError(f"rank {rank} (local rank {index}) failed: {last}")
