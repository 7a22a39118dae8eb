"""Starting the processes of a launch and watching them: the process-start core behind
:func:`distkit.launch.entry.run`, :func:`distkit.launch.entry.launch_function` and
:func:`distkit.launch.runner.run_per_rank`.

- :func:`start`: spawn (or fork, where safe: :func:`prepare_fork`) ``nproc_per_node``
  workers with ``idist.Parallel``, each in a session of its own that ends with the
  launcher; or join a torchrun / srun launch as one rank (:func:`_join`).
- Supervision: a rank that raises, dies or is stopped (SIGSTOP) becomes one line naming
  it (:func:`describe_process_failure`, :class:`StoppedRankWatchdog`); the stop signals as
  :data:`distkit.launch.stop_signals.TRAINING` says: Ctrl-C stops every worker; SIGTERM,
  SIGUSR1 and SIGHUP to the launcher are passed on to the workers, which stop at the same
  iteration with a checkpoint (:mod:`distkit.train.signals`, :mod:`distkit.train.stopping`),
  and the launch ends with :class:`~distkit.train.signals.Preempted`.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import fields, is_dataclass
from datetime import timedelta

import ignite.distributed as idist
import torch

from distkit.train import signals
from distkit.checkpoint.saver import latest_checkpoint_in, remove_run_dir_if_empty
from distkit.host.files import write_whole
from distkit.errors import DistkitError
from distkit.observe import hang_records
from distkit.observe.failures import (RankFailed, Reporter, first_on_this_node, read_records,
                                     report_from_worker, run_dir_of_this_process, run_reporting)
from distkit.host.facts import (CPU_ONLY_ENVIRONMENT, cpu_only_processes, cuda_driver_initialised, end_with_parent,
                             in_ipython,
                             stop_processes,
                             process_state, restore_environment, set_ignite_verbosity, socket_interface,
                             threads_per_process)
from distkit.host.layout import elastic, world_layout
from distkit.launch.checks import Launch
from distkit.launch.rendezvous import host_master_store, node0_waiting_line, wait_for_master
from distkit.launch.stop_signals import TRAINING, StopSignals

AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def prepare_fork(launch: Launch, start_method: str | None = None) -> Launch:
    """``launch`` as it will fork (:func:`fork_threads`), or as it is where it spawns."""
    if start_method == "fork" or (start_method is None and _fork_is_safe(launch)):
        return fork_threads(launch)
    return launch


def start(launch: Launch, reporter: Reporter, fn, *args, run_dir: str | None = None,
          start_method: str | None = None):
    """The one process-start core: ``run``, ``launch_function`` and
    ``distkit.launch.runner.run_per_rank`` are thin callers of it. ``fn(local_rank, *args)`` on
    every rank of ``launch`` (:func:`distkit.launch.checks.check_launch` made it): collectives
    bounded by ``launch.timeout_s``, a failed rank reported in one line by ``reporter``.

    - joining torchrun / SLURM (``launch.spawning`` False): this process is one rank;
      returns ``fn``'s value.
    - backend ``none``: ``fn(0, *args)`` in this process; returns its value.
    - else ``launch.nproc_per_node`` processes with ``idist.Parallel``, forked where safe
      (``start_method`` overrides); returns None.

    ``run_dir``: the run folder this launcher made, removed if the run leaves it empty."""
    if not launch.spawning:
        return _join(launch, reporter, fn, *args)
    if launch.backend == "none":
        try:
            return fn(0, *args)
        except BaseException:
            _discard_if_empty(run_dir)
            raise
    _spawn(launch, reporter, fn, *args, run_dir=run_dir, start_method=start_method)
    return None


def _timeout(launch: Launch) -> dict:
    """The process group's bound on every collective (gloo and nccl take one)."""
    if launch.backend in ("gloo", "nccl"):
        return {"timeout": timedelta(seconds=launch.timeout_s)}
    return {}


def _spawn(launch: Launch, reporter: Reporter, fn, *args, run_dir: str | None = None,
           start_method: str | None = None) -> None:
    """``fn(local_rank, *args)`` in ``launch.nproc_per_node`` spawned processes of this
    node; a failed rank becomes one line naming it (``reporter``: where a rank that
    raises writes its traceback, see :mod:`distkit.observe.failures`)."""
    config = launch  # the process fields, under the names Config gives them
    # Spawned processes inherit this: one thread pool per process, never oversubscribed.
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads(config)))
    spawn_kwargs = {**_timeout(launch), **_start_method(config, fn, args, start_method)}
    interface, master_store = None, None
    logs = set_ignite_verbosity(config.verbose)  # the launcher's own INFO lines: --verbose only
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    spawn_level = spawn_log.level
    if not config.verbose:  # "Terminating process N via signal SIGTERM": the kit's line says it
        spawn_log.setLevel(logging.ERROR)
    before = set(multiprocessing.active_children())  # a notebook's other children stay
    hangs = hang_records.folder_for_ranks()  # the ranks inherit it; the doctor reads it
    watchdog = StoppedRankWatchdog(before, config.nproc_per_node)
    watchdog.start()
    forwarding = StopSignals(lambda: set(multiprocessing.active_children()) - before, TRAINING)
    # each rank's failure record, read back below: how a rank's cause crosses to here
    reporter.records = tempfile.mkdtemp(prefix="distkit-records-")
    with forwarding:  # from before the first rank starts until the last has ended
        try:
            if config.nnodes > 1:
                interface, master_store = _meet_other_nodes(config)
            with cpu_only_processes() if config.backend == "gloo" else nullcontext(), \
                    idist.Parallel(backend=config.backend, nproc_per_node=config.nproc_per_node,
                                   nnodes=config.nnodes, node_rank=config.node_rank,
                                   master_addr=config.master_addr, master_port=config.master_port,
                                   **spawn_kwargs) as parallel:
                parallel.run(_own_session, reporter, fn, *args)
        except KeyboardInterrupt:
            # SIGINT to this process only (Jupyter's "interrupt kernel", kill -INT): the
            # workers are non-daemonic, so without this they train on to the last epoch while
            # the interpreter's exit waits for them.
            raise KeyboardInterrupt(interrupted_message(run_dir, forwarding.interrupt())) from None
        except Exception as e:
            watchdog.finish()
            if not forwarding.signum:  # ranks that lost a peer to a stop asked for are not hung
                hang_records.print_doctor_lines(hangs, config.nproc_per_node * config.nnodes)
            failure = _spawn_failure(e, config, watchdog, forwarding, reporter, run_dir)
            if failure is None:
                raise
            raise failure from None
        finally:
            watchdog.finish()
            logs.restore()  # a notebook's own ignite calls log as before
            spawn_log.setLevel(spawn_level)
            restore_environment(interface)
            hang_records.drop_folder(hangs)
            del master_store  # node 0's store closes with the run
            _discard_if_empty(run_dir)
            shutil.rmtree(reporter.records, ignore_errors=True)
            reporter.records = None


def _start_method(config, fn, args, start_method: str | None) -> dict:
    """``{"start_method": ...}`` for ``idist.Parallel`` (empty: ignite's default), checked:
    fork where it is safe, spawn where CUDA is already initialised here."""
    if start_method is None and _fork_is_safe(config):
        # Forked workers start with torch, ignite and the kit already imported: they are
        # ready seconds sooner than spawned ones (benchmarks/README.md, start-up).
        start_method = "fork"
    forking = start_method == "fork" or (start_method is None and in_ipython())
    uses_cuda = config.backend == "nccl"  # gloo ranks run hidden from the GPU (cpu_only_processes)
    if forking and (torch.cuda.is_initialized() or uses_cuda and cuda_driver_initialised()):
        # A forked child cannot use CUDA once this process has (on a GPU runtime, a
        # notebook that trained in its kernel has). Spawned children start fresh: take
        # them when nobody asked for fork and what they run can be imported.
        unimportable = first_unimportable((fn, args))
        if start_method is not None or unimportable is not None:
            raise DistkitError(
                "CUDA is already initialised in this process, and a forked child cannot use it"
                + (f" ({getattr(unimportable, '__qualname__', unimportable)!r} is defined in this "
                   "session, so it cannot be spawned instead)" if unimportable is not None else "")
                + ": restart the kernel and start the processes before any cell touches the GPU, "
                "or put the function in a module and import it from there")
        start_method, forking = "spawn", False
    if not forking:  # ignite forks under IPython; elsewhere spawned workers import fn
        check_spawned_can_import("the training function", (fn, args))
    return {} if start_method is None else {"start_method": start_method}


def _meet_other_nodes(config) -> tuple[dict, object]:
    """Before any process starts on a run of several nodes: the launchers meet at node 0's
    store with the same layout (every wait bounded and said, :mod:`distkit.launch.rendezvous`),
    and gloo is bound to the interface the other nodes reach. Returns the variables to
    restore afterwards and node 0's store (None elsewhere), which lives as long as the run."""
    master_store = None
    if config.node_rank:
        wait_for_master(config.master_addr, config.master_port, config.timeout_s,
                        config.node_rank, nnodes=config.nnodes, nproc_per_node=config.nproc_per_node)
    else:
        print(node0_waiting_line(config.nnodes, config.master_addr, config.master_port,
                                 config.timeout_s), flush=True)
        master_store = host_master_store(config.master_addr, config.master_port, config.nnodes,
                                         config.nproc_per_node, config.timeout_s)
    interface = bind_to_interface_of_master(config, config.master_addr) or {}  # inherited
    # the workers' rendezvous store is node 0's launcher's (torch's env:// reads it)
    interface.setdefault(AGENT_STORE, os.environ.get(AGENT_STORE))
    os.environ[AGENT_STORE] = "True"
    return interface, master_store


def _spawn_failure(e: Exception, config, watchdog, forwarding, reporter, run_dir) -> DistkitError | None:
    """The one line for a spawned run that ended in ``e``: a stopped rank, the ranks'
    failure records, or a stop signal that came before training could stop at an iteration."""
    first = (config.node_rank or 0) * config.nproc_per_node
    if watchdog.stopped:
        ranks = ", ".join(str(first + r) for r in watchdog.stopped)
        return DistkitError(
            f"rank {ranks} stopped answering (its process was stopped: SIGSTOP, Ctrl-Z or a "
            f"debugger); the other ranks gave up after --timeout {config.timeout_s:g} s and "
            "the job was ended. Resume with --resume-from latest (the newest checkpoint "
            "under --output-dir)")
    failure = describe_process_failure(e, config.node_rank or 0, config.nproc_per_node,
                                       config, read_records(reporter.records))
    if forwarding.signum and not isinstance(failure, signals.Preempted):
        # the signal came before the workers could stop at an iteration (start-up)
        newest = latest_checkpoint_in(run_dir) if run_dir else None
        failure = signals.Preempted(
            f"stopped by {signals.name(forwarding.signum)} before training reached an "
            f"iteration it could stop at ({failure or type(e).__name__}); "
            + (f"checkpoint: {newest}" if newest else "no checkpoint was written"),
            forwarding.signum, newest)
    return failure


class bounded_wait:
    """Ends this process (one line, exit 1) if the block has not finished within
    ``seconds``: the process group's own timeout does not bound everything. A group that
    torchrun restarted can hang in gloo's connect step well past --timeout, silently
    (docs/launch.md); torchrun then restarts it again or gives up."""

    def __init__(self, seconds: float, what: str):
        self.seconds, self.what = seconds, what
        self._done = threading.Event()

    def _watch(self):
        if self._done.wait(self.seconds):
            return
        layout = world_layout()
        restart = elastic().restart_count
        sys.stderr.write(
            f"distkit: error: rank {layout.rank} could not {self.what} within --timeout "
            f"{self.seconds - 15:g} s (+15){f' after torchrun restart {restart}' if restart else ''}: "
            "a rank of this launch did not start or cannot be reached; with torchrun "
            "--max-restarts on several nodes, launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "and --rdzv-backend=c10d (scripts/torchrun_nnodes.sh)\n")
        sys.stderr.flush()
        os._exit(signals.failure_exit_code())

    def __enter__(self):
        threading.Thread(target=self._watch, name="distkit-bounded-wait", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._done.set()


def _own_session(local_rank, reporter, fn, *args):
    """``fn(local_rank, *args)`` in a session of its own that ends with the launcher; an
    exception it raises becomes one line (``distkit.observe.failures.run_reporting``).

    Why a session: torchrun starts its workers so (``start_new_session``), and with the
    kernel's autogroup scheduling (on by default) the processes of one session share
    one scheduling group. Workers left in the launcher's session ran tiny steps at 0.91
    of torchrun's speed; in sessions of their own, 1.05 (6 rounds each, quiet 2-core VM;
    benchmarks/README.md, tiny steps). A terminal's Ctrl-C and Ctrl-Z then reach the
    launcher only, which stops the workers itself (:meth:`StopSignals.interrupt`).

    Why "ends with the launcher": outside the launcher's session a worker no longer gets
    the terminal's hang-up, so it ends itself, and what it started, when its parent dies
    (:func:`distkit.host.facts.end_with_parent`): a killed launcher leaves no orphan
    training on."""
    # a forked worker inherits the launcher's handlers and its noted stop: put back the
    # defaults first (training installs its own stop flag), then a stop that came before
    # this worker could take it is taken now, as a signal that ends it
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # as in a spawned worker
        signal.signal(signal.SIGINT, signal.default_int_handler)
    pending = signals.requested()
    if pending:
        os.kill(os.getpid(), pending)
    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:  # already a session leader
            pass
    end_with_parent()
    hang_records.arm_from_environment()
    try:
        return run_reporting(reporter, fn, local_rank, *args)
    except Exception as failed:  # the records, while every rank still runs
        cause = failed.__context__ if isinstance(failed, RankFailed) else failed
        if cause is not None:
            hang_records.on_rank_failure(idist.get_rank(), idist.get_world_size(), cause)
        raise


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
        workers = []
        while not self._done.wait(self.poll_s):
            if len(workers) < self.nproc:  # spawned in local-rank order
                workers = sorted(set(multiprocessing.active_children()) - self.before,
                                 key=lambda p: p._identity)
                continue
            states = [process_state(p.pid) for p in workers]
            if any(state in (None, "Z", "X") for state in states):  # one has exited
                for rank, (process, state) in enumerate(zip(workers, states)):
                    if state == "T":
                        self.stopped.append(rank)
                        os.kill(process.pid, 9)  # SIGKILL works on a stopped process
                return


def stop_workers(children, grace_s: float = 3.0) -> int:
    """Stop these worker processes (SIGTERM, then SIGKILL after ``grace_s``) and reap
    them (:func:`distkit.host.facts.stop_processes`). Returns how many were running. For
    a course's own processes: the launcher's own stop goes through
    :class:`distkit.launch.stop_signals.StopSignals`."""
    return stop_processes(children, signal.SIGTERM, grace_s)


def interrupted_message(run_dir: str | None, stopped: int) -> str:
    """What an interrupt left behind, and how to go on from it."""
    newest = latest_checkpoint_in(run_dir) if run_dir else None
    kept = (f"resume from the last complete checkpoint with --resume-from {newest}"
            if newest else "no checkpoint had been written yet, so nothing is left behind")
    return f"stopped {stopped} worker process(es); {kept}"


def write_result(folder: str, rank: int, value, kind: str = "rank") -> None:
    """What ``rank`` hands back to its launcher: ``folder/<kind><rank>.pkl``, written whole
    then renamed (a launcher never reads half a file: a rank can be stopped mid-write
    when another fails first). One file per rank: XLA cannot gather Python objects."""
    import pickle

    path = os.path.join(folder, f"{kind}{rank}.pkl")
    write_whole(path, lambda f: pickle.dump(value, f), binary=True)


_MISSING = object()


def read_result(folder: str, rank: int, kind: str = "rank", missing=_MISSING):
    """What :func:`write_result` left for ``rank``; ``missing`` where it left nothing
    (by default that raises ``FileNotFoundError``)."""
    import pickle

    path = os.path.join(folder, f"{kind}{rank}.pkl")
    if missing is not _MISSING and not os.path.exists(path):
        return missing
    with open(path, "rb") as f:
        return pickle.load(f)


def _discard_if_empty(run_dir) -> None:
    """A run that ended before writing anything of value leaves no folder behind."""
    if run_dir:
        remove_run_dir_if_empty(run_dir)


def _threads(config) -> int:
    return config.threads_per_process or threads_per_process(config.nproc_per_node)


def _fork_is_safe(config) -> bool:
    """Fork rather than spawn the workers: on Linux, with gloo, CUDA never initialised in
    this process, at any number of threads per worker (so the same code behaves the same
    on a 2-core VM and a 16-core laptop: a function defined in ``python -c`` or a cell
    works on both). What makes several threads safe is :func:`fork_threads`."""
    return (sys.platform == "linux" and config.backend == "gloo"
            and not torch.cuda.is_initialized())


def fork_threads(config):
    """The config to fork with: its threads per process, or 1 where this process's
    OpenMP thread pool is already running.

    Why: libgomp (the OpenMP of torch's Linux wheels) does not survive a fork: a forked
    child that runs a parallel region on several threads after its parent started the
    pool waits forever for pool threads that were not copied (measured here: a 2-thread
    matmul in the parent, then the same in a forked child: hung). A child on one thread
    runs OpenMP regions inline and is safe. The launcher itself never starts the pool
    (``distkit train`` pins its own process to 1 thread before any work); a script or a
    notebook may have, which :func:`openmp_pool_forks_cleanly` finds out."""
    if _threads(config) == 1 or openmp_pool_forks_cleanly():
        return config
    sys.stderr.write(
        f"distkit: this process already runs OpenMP threads, which a forked worker cannot use: "
        f"each worker runs 1 thread instead of {_threads(config)} (start the launch before "
        "any multi-threaded torch work, or call torch.set_num_threads(1) first)\n")
    return config.replace(threads_per_process=1)


def openmp_pool_forks_cleanly(timeout_s: float = 5.0) -> bool:
    """Fork a child that runs one parallel region on 2 threads: True if it ends within
    ``timeout_s`` (this process's OpenMP pool was never started, or survives a fork),
    False if it hangs (it is killed). About 10 ms when it ends."""
    pid = os.fork()
    if pid == 0:  # the child: one OpenMP region, then leave without any clean-up
        code = 1
        try:
            torch.set_num_threads(2)
            torch.ones(1 << 18).exp_()  # above ATen's grain size: a parallel region
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status == 0
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def check_spawned_can_import(what: str, objects) -> None:
    """Spawned processes import the functions they run by module and name; a function of
    ``python -c``, of standard input or of an interactive session has no module file to
    import. Refuse in one line before any process starts (forked processes need none)."""
    fn = first_unimportable(objects)
    if fn is not None:
        raise DistkitError(
            f"{what} ({getattr(fn, '__qualname__', fn)!r}) is defined in `python -c`, "
            "standard input or an interactive session, which spawned processes cannot "
            "import: put it in a file (a module, or a script with an "
            "`if __name__ == \"__main__\":` guard) and import it from there")


def first_unimportable(objects):
    """The first callable in ``objects`` (searched through tuples, lists and dataclass
    fields) that a spawned process could not import, or None."""
    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) and os.path.exists(main.__file__):
        return None

    def callables(obj):
        if is_dataclass(obj) and not isinstance(obj, type):
            for f in fields(obj):
                yield from callables(getattr(obj, f.name))
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                yield from callables(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                yield from callables(item)
        elif callable(obj):
            yield obj

    return next((fn for fn in callables(objects) if getattr(fn, "__module__", None) == "__main__"), None)


def bind_to_interface_of_master(config, master_addr) -> dict | None:
    """Set ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME``) in this process to the
    interface that routes to the master, unless the user set it
    (:func:`distkit.host.facts.socket_interface`); before any process group is made.
    Returns the previous values, to put back with :func:`restore_environment`."""
    pick = socket_interface(config.backend, master_addr)
    if pick is None or pick["set_by"] == "you":
        return None
    previous = {pick["variable"]: os.environ.get(pick["variable"])}
    os.environ[pick["variable"]] = pick["interface"]
    if config.verbose:
        sys.stderr.write(f"distkit: {pick['variable']}={pick['interface']} ({pick['address']}, "
                         f"the interface that routes to the master {master_addr})\n")
    return previous


def _join(launch: Launch, reporter: Reporter, fn, *args):
    """Join a torchrun / SLURM launch: this process is one rank; spawn nothing. A rank
    that raises prints one line (the first of its node) and records it for torchrun's
    summary (:func:`distkit.observe.failures.report_from_worker`)."""
    layout = world_layout()  # read before ignite sets torchrun's variables from SLURM's
    several_nodes = layout.nnodes > 1
    if several_nodes:
        try:
            bind_to_interface_of_master(launch, layout.master_addr)
        except DistkitError as e:  # the same on every rank of this node: one line per node
            raise report_from_worker(e) from None
    if launch.backend == "gloo":  # this process is the rank: hide the GPUs before ignite's set_device
        os.environ.update(CPU_ONLY_ENVIRONMENT)
    with bounded_wait(launch.timeout_s + 15, "connect to the other ranks"):
        store = attempt_store(launch.timeout_s)
        if store is None:
            idist.initialize(launch.backend, **_timeout(launch))
        else:  # ignite takes the process group from the context (idist's functions)
            import torch.distributed as dist

            dist.init_process_group(launch.backend, store=store, rank=layout.rank,
                                    world_size=layout.world_size, **_timeout(launch))
            if launch.backend == "nccl":
                torch.cuda.set_device(layout.local_rank)
    hang_records.arm_joined(layout.rank, signals.failure_exit_code())
    try:
        return run_reporting(reporter, fn, idist.get_local_rank(), *args)
    except signals.Preempted as e:  # every rank stopped at one iteration: one line per node
        if e.checkpoint:
            e.args = (f"{e}; resume: " + (
                "a requeued job resumes by itself (scripts/slurm.sbatch: --resume-from latest); "
                "by hand, the same srun command with " if layout.launcher == "slurm" else
                "the same torchrun command with ") + f"--resume-from {e.checkpoint}",)
        if first_on_this_node():
            sys.stderr.write(f"distkit: {e}\n")
            sys.stderr.flush()
        e.reported = True
        raise
    except RankFailed as e:
        # the first rank whose collective failed prints the hang doctor's lines, after its own
        doctor, answered = hang_records.joined_rank_failed(idist.get_rank(), idist.get_world_size(),
                                                           e.__context__) if e.__context__ else ([], True)
        if doctor and not answered:  # a rank died: say so, then stay a witness, as a lost rank does
            hang_records.joined_printed(doctor)
            raise report_from_worker(e) from None
        report_from_worker(e, witness_waits=not doctor)  # the doctor's lines name the cause
        if doctor:
            hang_records.joined_printed(doctor)
            # all is said: leave now. torch's teardown of a group whose collective timed out
            # takes seconds (4-6 s measured), and this node's agent ends its other ranks
            # only once it sees a worker exit
            os._exit(signals.failure_exit_code())
        raise e from None
    except BaseException:
        if idist.get_rank() == 0:  # the folder is rank 0's; a failure in training names it
            _discard_if_empty(run_dir_of_this_process())
        raise
    finally:
        idist.finalize()


def attempt_store(timeout_s: float, environ=os.environ):
    """Under torchrun's shared store, on one node: the store this attempt's process group
    meets in, a prefix of its own on torchrun's store (``distkit/attempt-<restart>/``);
    else None (torch's own ``env://`` rendezvous).

    Why: torchrun's c10d rendezvous keeps one TCP store for the workers of every attempt
    (``TORCHELASTIC_USE_AGENT_STORE=True``, unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``),
    and torch's ``env://`` rendezvous on it uses the same keys in every attempt
    (``default_pg/...``: each rank's gloo address). A restarted worker could read the
    address its dead peer of the previous attempt left there and wait to connect to it:
    the restarted group hung in gloo's connect step, or failed to connect, in some of the
    restarts. A prefix per attempt shows each attempt only its own keys, as
    torch's own elastic workers did with ``/worker/attempt_<n>``.

    One node only: ``TORCHELASTIC_RESTART_COUNT`` is the same for every worker of one
    agent, but agents on several nodes may count restarts differently (one restarts for
    its failed worker, another because a node waits), and ranks with different prefixes
    would never meet."""
    torchrun = elastic(environ)
    if not torchrun.agent_store or torchrun.store is None or not torchrun.one_node:
        return None
    import torch.distributed as dist

    addr, port, world = torchrun.store
    client = dist.TCPStore(addr, port, world, False, timedelta(seconds=timeout_s))
    restart = torchrun.restart_count
    return dist.PrefixStore(f"distkit/attempt-{restart}", client)  # keys: distkit/attempt-N/...


def describe_process_failure(error: Exception, node_rank: int, nproc: int,
                             launch=None, records: dict | None = None) -> DistkitError | None:
    """Turn torch.multiprocessing's report of a dead or failed child into one line that
    names the rank, from the ranks' failure records (``records``, by rank: see
    :func:`failure_from_records`). ``launch`` (its nnodes, master address and port,
    timeout): a rendezvous that timed out is said as such."""
    index = getattr(error, "error_index", None)
    if index is None:
        return None
    rank = node_rank * nproc + index
    found = failure_from_records(records or {}, rank, index)
    if found is not None:
        return found
    # No record: the process failed before the kit's code ran in it (ignite's or torch's
    # own start-up), or could not write one; what torch passed up is all there is.
    text = str(error)
    if launch is not None and launch.nnodes > 1 and "DistStoreError" in text and (
            ("wait timeout" in text and "/default_pg/" in text) or "waiting for clients" in text):
        return DistkitError(
            f"node {node_rank}: not every node joined the run at {launch.master_addr}:"
            f"{launch.master_port} within --timeout {launch.timeout_s:g} s (rank {rank} waited "
            f"for the others): start all {launch.nnodes} nodes within --timeout of each other, with "
            "the same --nnodes, --nproc-per-node, --master-addr and --master-port")
    if launch is not None and launch.nnodes > 1 and any(
            f"torch.distributed.Dist{kind}Error" in text for kind in ("Network", "Store")):
        # raised before training started: while the process group formed
        first = next((ln for ln in text.splitlines() if "torch.distributed.Dist" in ln), "").strip()
        return DistkitError(
            f"node {node_rank}: the rendezvous at {launch.master_addr}:{launch.master_port} failed "
            f"for rank {rank} ({first.replace('torch.distributed.', '')[:160]}): start all "
            f"{launch.nnodes} nodes with the same --nnodes, --nproc-per-node, --master-addr and "
            "--master-port, within --timeout of each other")
    signal_name = getattr(error, "signal_name", None)
    exit_code = getattr(error, "exit_code", None)
    if signal_name:
        return DistkitError(f"rank {rank} (local rank {index}) was killed by {signal_name}; the other "
                            "processes were stopped. Resume with --resume-from latest (the newest checkpoint under --output-dir)")
    if exit_code is not None:
        return DistkitError(f"rank {rank} (local rank {index}) exited with code {exit_code}; the "
                            "other processes were stopped. See its output above")
    # ProcessRaisedException: the child's traceback as text. Keep its exception's line:
    # the first unindented line after the last frame (a CUDA error goes on for three
    # lines of debugging hints after "CUDA error: invalid device ordinal").
    text = str(error).strip().splitlines()
    frames = [i for i, ln in enumerate(text) if ln.startswith("  File ")]
    after_frames = [ln for ln in text[frames[-1] + 1:] if ln.strip() and not ln.startswith(" ")] \
        if frames else []
    last = after_frames[0] if after_frames else (text[-1] if text else repr(error))
    refused = "distkit.errors.DistkitError: "
    if last.startswith(refused):  # a check that ran before the kit's reporting (no record)
        return DistkitError(f"rank {rank}: {last[len(refused):]}")
    return DistkitError(f"rank {rank} (local rank {index}) failed: {last}")


def failure_from_records(records: dict, rank: int, local_rank: int) -> DistkitError | None:
    """The failure of the run, from the ranks' own records (:class:`FailureRecord`, by
    rank): ``rank`` is the process torch saw end first. A rank that only lost its peer
    or timed out waiting is a witness: the first record of a rank that failed itself is
    named instead, when there is one. None when ``rank`` left no record."""
    record = records.get(rank)
    if record is None:
        return None
    if record.kind == "lost":
        causes = [r for r in records.values() if r.kind != "lost"]
        record = min(causes, key=lambda r: r.time) if causes else record
    if record.kind == "stopped":
        return signals.Preempted(record.message, record.signum or signal.SIGTERM, record.last_checkpoint)
    if record.kind == "refused":
        return DistkitError(f"rank {record.rank}: {record.message}")
    return DistkitError(record.message)

