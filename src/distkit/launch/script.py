"""``distkit launch``: any script that makes its own process group, with the kit's
supervision — a torchrun-compatible launcher.

The script stays as written (pytorch/examples' ``multigpu_torchrun.py``, a course's own
loop): it reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` from the environment and calls
``init_process_group`` / ``destroy_process_group`` itself, as under ``torchrun``. The
launcher sets, for every rank, what torchrun sets: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node), ``GROUP_WORLD_SIZE``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_ERROR_FILE`` (for ``@record``), and ``OMP_NUM_THREADS`` (this machine's
cores divided by its ranks, unless you set it); for gloo runs it hides the GPUs
(``CUDA_VISIBLE_DEVICES=""``, as every gloo launch of the kit: :data:`distkit.host.facts.
CPU_ONLY_ENVIRONMENT`). Then it starts one process per rank and supervises them:

- a rank that raises: one line naming the rank, the exception's type and first line and
  the ``file:line`` in the script; its full traceback in a file whose path the line
  gives (:mod:`distkit.launch.script_worker`; where: :func:`tracebacks_folder`); the
  other ranks are stopped; exit 1 (200 in an srun step: :mod:`distkit.train.signals`);
- a rank killed by a signal or exiting non-zero: one line naming it and how;
- ``timeout_s`` (``--timeout``, 120 s by default, as ``distkit train --timeout``): the
  default timeout of every process group the script makes without its own ``timeout=``
  (:func:`distkit.launch.script_worker.bound_waits`): the rendezvous in ``init_process_group``
  and every collective then end in an exception, which is reported in one line, instead
  of waiting forever (torch's own default: 30 minutes);
- ``end_timeout_s`` (``--end-timeout``): once a rank has ended, the others must end
  within it, or they are stopped and named (none by default: a rank 0 that evaluates
  alone after the others have left is not a hang);
- Ctrl-C (``KeyboardInterrupt``, a notebook's "interrupt kernel"), SIGTERM and SIGHUP:
  SIGINT (for Ctrl-C) or SIGTERM to every rank and what it started, which get ``grace_s``
  seconds before SIGKILL; one line says so (:func:`distkit.launch.stop_signals.script_policy`:
  the same handlers as ``distkit train``'s, put back when the launch ends);
- no rank outlives the launcher (each ends with it: :func:`distkit.host.facts.end_with_parent`).

Inside an ``srun`` job step it gives the script torchrun's variables for the layout
:func:`distkit.host.layout.world_layout` read from SLURM's (the task's rank, the step's
task count, local rank, node; ``MASTER_ADDR`` the first host of the step's node list,
``MASTER_PORT`` 15000 + the job id's last 4 digits, as ignite derives them) and runs the
script once, as this task's rank. Inside torchrun
(``WORLD_SIZE`` set) it runs the script once with torchrun's variables.

When a rank fails, the hang doctor (:mod:`distkit.observe.hangs`) prints one line per
rank (``distkit: hang: rank 1: in all_reduce #6 (float32[1000]) at train.py:21``) and a
verdict. ``debug_collectives=True`` (``--debug-collectives``) sets
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in the ranks: torch compares every collective's op,
shapes and dtypes across ranks before running it, so no rank goes on with the data of a
mismatched one (it costs a collective per collective; torch 2.15's DDP crashes under it).

``trace=True`` (``--trace``, one node): every rank is profiled for a few optimizer steps
(:mod:`distkit.observe.script_tracing`); the launcher merges the ranks' traces into one and
draws it, as ``distkit train --trace`` does, into ``<output_dir>/<time>-<backend>-
<N>procs/trace/``, names the files in that folder's ``results.json`` (``"trace"``) and
in one line at the end.

From Python (a notebook cell: the ranks' output is relayed to the cell)::

    from distkit import launch_script
    launch_script("multigpu_torchrun.py", ["10", "5"], nproc_per_node=2)
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from distkit.errors import DistkitError
from distkit.observe.hang_records import doctor_lines
from distkit.host.facts import (CPU_ONLY_ENVIRONMENT, check_address_resolves, check_port_free,
                             free_port, in_ipython, socket_interface, stop_processes,
                             threads_per_process)
from distkit.host.layout import WorldLayout, slurm_cpus_per_task, world_layout
from distkit.launch.stop_signals import StopSignals, script_policy
from distkit.observe.failures import read_records
from distkit.train import signals

CPU_DEFAULT_NPROC = 2
DEFAULT_PORT = 29500  # torchrun's, for several nodes
DEFAULT_TIMEOUT_S = 120.0  # distkit train's --timeout (Config.timeout_s)
MAX_TIMEOUT_S = 86400.0


class ScriptStopped(DistkitError):
    """The launcher was told to stop (SIGTERM, SIGHUP; under srun any stop signal) and
    every rank has ended; ``exit_code`` 128 + the signal (143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM):
        super().__init__(message)
        # SIGHUP stops the launch as SIGTERM does (it forwards SIGTERM): 143 for both
        self.exit_code = signals.exit_code(signal.SIGTERM if signum == signal.SIGHUP else signum)


@dataclass
class Ranks:
    """The ranks this launcher starts and the variables every one of them gets."""

    mode: str  # "spawn", "slurm" or "torchrun"
    first_rank: int
    local_ranks: list
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str
    extra_env: dict = field(default_factory=dict)

    def env(self, local_rank: int) -> dict:
        rank = self.first_rank + local_rank if self.mode == "spawn" else self.first_rank
        values = {"RANK": rank, "WORLD_SIZE": self.world_size, "LOCAL_RANK": local_rank,
                  "LOCAL_WORLD_SIZE": self.local_world_size, "GROUP_RANK": self.node_rank,
                  "GROUP_WORLD_SIZE": self.nnodes, "ROLE_RANK": rank,
                  "ROLE_WORLD_SIZE": self.world_size, "ROLE_NAME": "default",
                  "MASTER_ADDR": self.master_addr, "MASTER_PORT": self.master_port}
        return {k: str(v) for k, v in values.items()} | self.extra_env


def layout_ranks(layout: WorldLayout, backend: str) -> Ranks:
    """The one rank torchrun or ``srun`` started here, with torchrun's variables for it
    (under SLURM: the master on the step's first host, as ignite puts it)."""
    return Ranks(layout.launcher, layout.rank, [layout.local_rank], layout.world_size,
                 layout.local_world_size, layout.node_rank, layout.nnodes,
                 layout.master_addr or "127.0.0.1", layout.master_port or DEFAULT_PORT, backend)


def _backend(backend: str) -> tuple[str, int]:
    """(gloo or nccl, the GPUs visible). ``auto``: nccl where CUDA is, else gloo."""
    if backend not in ("auto", "gloo", "nccl"):
        raise DistkitError(f"unknown --backend {backend!r} for distkit launch: choose auto, gloo "
                           "(CPU processes: the GPUs are hidden from them) or nccl")
    import torch

    gpus = torch.cuda.device_count()
    if backend == "auto":
        backend = "nccl" if gpus else "gloo"
    if backend == "nccl" and not gpus:
        raise DistkitError("--backend nccl needs CUDA GPUs and none is visible here: use "
                           "--backend gloo (CPU processes), or run on a GPU machine")
    return backend, gpus


def plan_ranks(nproc_per_node=None, nnodes=1, node_rank=None, master_addr=None, master_port=None,
               backend="auto", environ=os.environ) -> Ranks:
    """The ranks to start here, checked: one line for a wrong count, node, address or port."""
    from distkit.config import Config

    layout = world_layout(environ)  # a garbage launcher variable: one line, before torch loads
    if layout.launcher != "none":
        if nproc_per_node not in (None, 1) or nnodes != 1:
            who = "torchrun" if layout.launcher == "torchrun" else "srun"
            raise DistkitError(
                f"--nproc-per-node/--nnodes inside a {who} launch, which starts the processes "
                f"itself: drop them ({who} sets the counts), and distkit launch runs the script "
                "once per task")
        return layout_ranks(layout, _backend(backend)[0])
    backend, gpus = _backend(backend)
    if nproc_per_node is None:
        nproc_per_node = gpus if backend == "nccl" else CPU_DEFAULT_NPROC
    Config(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
           master_addr=master_addr, master_port=master_port).validate_processes()
    if backend == "nccl" and nproc_per_node > gpus:
        raise DistkitError(f"--nproc-per-node {nproc_per_node} with nccl needs {nproc_per_node} "
                           f"GPUs but this node has {gpus}: use --nproc-per-node {gpus} or fewer")
    if master_addr is not None:
        check_address_resolves(master_addr)
    if nnodes == 1:
        master_addr = master_addr or "127.0.0.1"
        if master_port is None:
            master_port = free_port()
        else:
            check_port_free(master_port)
    else:
        master_port = master_port or DEFAULT_PORT
        if node_rank == 0:
            check_port_free(master_port)
    node_rank = node_rank or 0
    return Ranks("spawn", node_rank * nproc_per_node, list(range(nproc_per_node)),
                 nproc_per_node * nnodes, nproc_per_node, node_rank, nnodes, master_addr,
                 master_port, backend)


def _child_env(ranks: Ranks, local_rank: int, folder: str, verbose: bool) -> dict:
    env = dict(os.environ)
    env.update(ranks.env(local_rank))
    if "OMP_NUM_THREADS" not in os.environ:  # yours wins, as under torchrun
        cpus = slurm_cpus_per_task() if ranks.mode == "slurm" else None
        env["OMP_NUM_THREADS"] = cpus or str(threads_per_process(ranks.local_world_size))
    if ranks.backend == "gloo":
        env.update(CPU_ONLY_ENVIRONMENT)
    if ranks.nnodes > 1:  # gloo / nccl bind to the interface that routes to the master
        pick = socket_interface(ranks.backend, ranks.master_addr, env)
        if pick is not None:
            env[pick["variable"]] = pick["interface"]
    env["TORCHELASTIC_ERROR_FILE"] = os.path.join(folder, f"error{env['RANK']}.json")
    env["DISTKIT_SCRIPT_REPORTS"] = folder
    env["DISTKIT_LAUNCHER_PID"] = str(os.getpid())
    env["DISTKIT_VERBOSE"] = "1" if verbose else "0"
    return env


def _relay(stream, out) -> None:
    for line in iter(stream.readline, ""):
        out.write(line)
        out.flush()


def _has_real_stdout() -> bool:
    try:
        sys.stdout.fileno()
        sys.stderr.fileno()
        return not in_ipython()
    except (AttributeError, OSError, ValueError):
        return False


def launch_script(script: str, args=(), *, nproc_per_node: int | None = None, nnodes: int = 1,
                  node_rank: int | None = None, master_addr: str | None = None,
                  master_port: int | None = None, backend: str = "auto",
                  timeout_s: float = DEFAULT_TIMEOUT_S, end_timeout_s: float | None = None,
                  grace_s: float = 10.0, module: bool = False, verbose: bool = False,
                  cwd: str | None = None, trace: bool = False, output_dir: str = "runs",
                  debug_collectives: bool = False) -> int:
    """Run ``script`` (a path; ``module=True``: a module name, as ``python -m``) with
    ``args`` on ``nproc_per_node`` ranks of this node, as torchrun would, with the kit's
    supervision (see the module's docstring). Returns 0 when every rank ended with 0;
    otherwise raises :class:`~distkit.errors.DistkitError` with the first failure's line
    (every failure's line is also printed to stderr), ``KeyboardInterrupt`` after Ctrl-C,
    :class:`ScriptStopped` after SIGTERM or SIGHUP (the handlers are put back on return)."""
    _check_arguments(script, module, cwd, timeout_s, end_timeout_s)
    ranks = plan_ranks(nproc_per_node, nnodes, node_rank, master_addr, master_port, backend)
    run_dir = _trace_run_dir(ranks, output_dir) if trace else None
    folder = tempfile.mkdtemp(prefix="distkit-launch-")
    tracebacks = tracebacks_folder(ranks, run_dir, output_dir)
    target = ["-m", script] if module else [script]
    command = [sys.executable, "-m", "distkit.launch.script_worker", *target, *map(str, args)]
    relay = not _has_real_stdout()
    procs, threads = {}, []
    # SIGTERM / SIGHUP are noted and acted on by _supervise's next look; Ctrl-C raises here
    with StopSignals(lambda: [p for _, p in procs.values()], script_policy(grace_s)) as stop:
        store = None
        try:
            store = _serve_store(ranks, timeout_s)
            for local_rank in ranks.local_ranks:
                if stop.signum:  # told to stop before every rank started: start no more
                    break
                env = _rank_env(ranks, local_rank, folder, verbose, timeout_s, grace_s,
                                tracebacks, debug_collectives, run_dir)
                procs[int(env["RANK"])] = (local_rank, _start_rank(command, env, cwd, relay, threads))
            code = _supervise(procs, ranks, folder, end_timeout_s, stop, script, timeout_s)
            shutil.rmtree(folder, ignore_errors=True)  # no failure: no traceback to keep
            if run_dir is not None:
                _finish_trace(run_dir, ranks, script, args)
                run_dir = None
            return code
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"forwarded Ctrl-C (SIGINT) to {stop.interrupt()} rank(s) of "
                                    f"{script}; every rank has ended") from None
        finally:
            _stop(procs, signal.SIGKILL, 0)  # nothing left behind, whatever happened
            del store  # the rendezvous store closes after the last rank has ended
            for t in threads:
                t.join(2)
            if run_dir is not None:  # the launch failed: no merged trace, no empty folder left
                from distkit.checkpoint.saver import remove_run_dir_if_empty

                remove_run_dir_if_empty(run_dir)


def _rank_env(ranks: Ranks, local_rank: int, folder: str, verbose: bool, timeout_s: float,
              grace_s: float, tracebacks, debug_collectives: bool, run_dir) -> dict:
    """The environment of one rank: torchrun's variables and the kit's own."""
    env = _child_env(ranks, local_rank, folder, verbose)
    env["DISTKIT_TIMEOUT"] = repr(float(timeout_s))
    env["DISTKIT_GRACE"] = repr(float(grace_s))  # a rank outliving the launcher: SIGKILL after
    if tracebacks:
        env["DISTKIT_TRACEBACKS"] = tracebacks
    if debug_collectives:  # torch compares each collective across ranks first
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if run_dir is not None:
        env["DISTKIT_TRACE"] = os.path.join(run_dir, "trace")
    return env


def _check_arguments(script: str, module: bool, cwd: str | None, timeout_s, end_timeout_s) -> None:
    """The launch's own arguments, each refused in one line naming the flag and a value."""
    if not module and not os.path.isfile(os.path.join(cwd or "", script)):
        raise DistkitError(f"no such script {script!r} (from {os.path.abspath(cwd or '.')!r}): "
                           "pass the path of the .py file to launch, or -m MODULE")
    if timeout_s is None or not (0 < timeout_s <= MAX_TIMEOUT_S):
        raise DistkitError(f"--timeout {timeout_s!r} must be a number of seconds > 0 and at most "
                           f"{MAX_TIMEOUT_S:g}: e.g. --timeout 600 for collectives that wait long "
                           f"(default {DEFAULT_TIMEOUT_S:g})")
    if end_timeout_s is not None and not (0 < end_timeout_s < float("inf")):
        raise DistkitError(f"--end-timeout {end_timeout_s!r} must be a finite number of seconds "
                           "> 0: e.g. --end-timeout 120, or leave it out (no bound)")


def _start_rank(command: list, env: dict, cwd: str | None, relay: bool, threads: list) -> subprocess.Popen:
    """One rank in a session of its own; its output relayed by a thread (added to
    ``threads``) where this process's stdout is not a real file (a notebook)."""
    p = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True,
                         stdout=subprocess.PIPE if relay else None,
                         stderr=subprocess.STDOUT if relay else None,
                         text=relay or None)
    if relay:
        t = threading.Thread(target=_relay, args=(p.stdout, sys.stdout), daemon=True)
        t.start()
        threads.append(t)
    return p


def _serve_store(ranks: Ranks, timeout_s: float):
    """On one node, where this launcher starts every rank: serve the ranks' rendezvous
    store here, as torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE=True``: torch's
    ``env://`` rendezvous then makes every rank a client of the store at ``MASTER_ADDR:
    MASTER_PORT``). Returns the store, to keep until every rank has ended; None elsewhere.

    Why: served by rank 0, the store ended with rank 0. A rank 0 that finished its script
    while another rank was still in ``init_process_group`` (reading its peers' addresses
    from the store) left that rank a reset connection, reported as its own failure
    (``DistNetworkError: Connection reset by peer``, with torch's C++ warning and frames on
    stderr) instead of what it was about to raise or print."""
    if ranks.mode != "spawn" or ranks.nnodes > 1:
        return None
    from distkit.launch.rendezvous import host_master_store

    store = host_master_store(ranks.master_addr, ranks.master_port, 1, len(ranks.local_ranks), timeout_s)
    ranks.extra_env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    return store


def tracebacks_folder(ranks: Ranks, run_dir: str | None, output_dir: str) -> str | None:
    """Where a failing rank's traceback goes: the run folder's ``tracebacks/`` (``--trace``
    makes one); in an srun step or under torchrun, ``<output_dir>/launch-<job>/tracebacks/``
    (made only when a rank fails), which every node of a cluster's shared folder reaches
    and every task names alike; None (beside the launcher's records, in this node's
    temporary folder) for a launch of one node without a run folder."""
    from distkit.observe.failures import launch_tag, traceback_folder

    if run_dir is not None:
        return os.path.abspath(traceback_folder(run_dir))
    tag = launch_tag() if ranks.mode != "spawn" else None
    if tag is None:
        return None
    return os.path.abspath(traceback_folder(os.path.join(output_dir, f"launch-{tag}")))


def _trace_run_dir(ranks: Ranks, output_dir: str) -> str:
    """The launch's run folder for ``--trace``, checked and made before any rank starts."""
    from distkit.checkpoint.saver import check_output_dir, make_run_dir

    if ranks.mode != "spawn" or ranks.nnodes > 1:
        where = {"torchrun": "inside torchrun", "slurm": "inside an srun step"}.get(
            ranks.mode, f"with --nnodes {ranks.nnodes}")
        raise DistkitError(
            f"--trace {where}: distkit launch merges the traces of the ranks it starts itself, "
            "on one node: run `distkit launch --trace --nproc-per-node N SCRIPT` there, or drop "
            "--trace")
    check_output_dir(output_dir)
    run_dir = make_run_dir(output_dir, ranks.backend, ranks.world_size)
    os.makedirs(os.path.join(run_dir, "trace"))
    return run_dir


def _finish_trace(run_dir: str, ranks: Ranks, script: str, args) -> None:
    from distkit.observe.script_tracing import collect, record

    paths, line = collect(run_dir, ranks.world_size, script)
    if paths is None:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing recorded: no empty files
    else:
        record(run_dir, script, args, ranks.world_size, paths)
    print(line, flush=True)


def _stop(procs: dict, sig, grace_s: float) -> int:
    """Send ``sig`` to every rank still running and what it started, wait up to
    ``grace_s``, then SIGKILL; returns how many were running."""
    return stop_processes([p for _, p in procs.values()], sig, grace_s, group=True, tree=True)


def _describe(rank: int, local_rank: int, code: int, records: dict, ranks: Ranks) -> str:
    if rank in records:
        return records[rank].message
    node = f", node {ranks.node_rank} of {ranks.nnodes}" if ranks.nnodes > 1 else ""
    who = f"rank {rank} (local rank {local_rank}{node})"
    if code < 0:
        return f"{who} was killed by {signal.Signals(-code).name}"
    return f"{who} exited with code {code} (see its output above)"


def timeout_note(records: dict, failed: list, running: list, timeout_s: float) -> str | None:
    """When the ranks that failed timed out waiting on the others: where the bound came
    from, and the ranks still running then. Those never came to the collective (busy, or
    spinning in their own code): the cause, not the ranks that waited for them."""
    waited = [r for r in failed if r in records and records[r].kind == "lost"
              and "timed out" in records[r].first_line.lower()]
    if not waited:
        return None
    note = (f"rank {', '.join(map(str, waited))} waited the bound of distkit launch's --timeout "
            f"{timeout_s:g} s (raise --timeout for waits that are longer)")
    if running and len(waited) == len(failed):
        note += (f"; rank {', '.join(map(str, running))} was not waiting: still running its own "
                 "code then (busy, or spinning in a loop): look there first")
    return note


def _stopped(signum: int, stop: StopSignals, codes: dict, script) -> ScriptStopped:
    """The launch told to stop by ``signum``: every rank still running stopped (SIGTERM,
    SIGKILL after the grace); the ranks the same signal already ended (srun's ``scancel
    --signal`` reaches every process of the step) are part of the stop, not a failure."""
    ended = [r for r, c in codes.items() if c == -signum]
    stopped = stop.stop()
    if ended:
        return ScriptStopped(f"got {signals.name(signum)}, as did {len(ended)} rank(s) of "
                             f"{script}, ended by it; {stopped} more stopped; every rank has "
                             "ended", signum)
    what = "it" if signum == signal.SIGTERM else "SIGTERM"
    return ScriptStopped(f"got {signals.name(signum)}: forwarded {what} to {stopped} rank(s) of "
                         f"{script}; every rank has ended", signum)


def _supervise(procs: dict, ranks: Ranks, folder: str, end_timeout_s, stop: StopSignals, script,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    first_end = None
    seen = {}  # rank -> the poll at which it was first seen ended
    polls = 0
    while True:
        polls += 1
        codes = {rank: p.poll() for rank, (_, p) in procs.items()}
        for rank, code in codes.items():
            if code is not None:
                seen.setdefault(rank, polls)
        if stop.signum:  # SIGTERM / SIGHUP to the launcher: a script has no checkpoint to wait for
            raise _stopped(stop.signum, stop, codes, script)
        failed = [r for r, c in codes.items() if c not in (None, 0)]
        noted = signals.requested()  # in an srun step, a stop signal the policy leaves alone
        if failed and noted and all(codes[r] == -noted for r in failed):
            raise _stopped(noted, stop, codes, script)
        if failed:
            # the hang doctor reads every rank's record while the others still run
            doctor, in_collective = doctor_lines(folder, {r: p.poll() for r, (_, p) in procs.items()})
            # the first failure: stop the others now (they would wait on it in a collective)
            _stop(procs, signal.SIGTERM, min(stop.policy.grace_s, 3.0))
            records = read_records(folder)
            # first the rank that failed first; of ranks ended in one poll, a rank that lost
            # its peer after the one that raised
            failed.sort(key=lambda r: (seen[r], r in records and records[r].kind == "lost"))
            lines = [_describe(r, procs[r][0], codes[r], records, ranks) for r in failed]
            if all(records.get(r) and records[r].kind == "refused" for r in failed):
                lines = lines[:1]  # every rank refused alike: one line says it
            lines[0] += "; the other ranks were stopped"
            for line in lines:
                sys.stderr.write(f"distkit: error: {line}\n")
            # a rank the doctor found in a collective was waiting too (its bound not yet
            # passed), not busy in its own code
            busy = [r for r, c in codes.items() if c is None and r not in in_collective]
            note = timeout_note(records, failed, busy, timeout_s)
            if note:
                sys.stderr.write(f"distkit: {note}\n")
            for line in doctor:
                sys.stderr.write(f"distkit: hang: {line}\n")
            sys.stderr.flush()
            if ranks.mode == "torchrun":  # torchrun's summary names it as the root cause
                from distkit.observe.failures import write_error_file

                write_error_file(f"distkit: error: {lines[0]}")
            error = DistkitError(lines[0])
            error.reported = True  # the command line prints nothing more
            raise error
        if all(c == 0 for c in codes.values()):
            return 0
        if first_end is None and any(c == 0 for c in codes.values()):
            first_end = time.monotonic()
        if end_timeout_s is not None and first_end is not None \
                and time.monotonic() - first_end > end_timeout_s:
            hung = [r for r, c in codes.items() if c is None]
            stop.stop()
            raise DistkitError(
                f"rank {', '.join(map(str, hung))} of {script} still running --end-timeout "
                f"{end_timeout_s:g} s after another rank ended: stopped (a rank waiting on a "
                "collective the others never joined?); raise --end-timeout if it was still "
                "working")
        time.sleep(0.05)


# --- launch_function with a function that makes or ends the process group itself ----------

def call_with_kits_group(fn, local_rank: int, *args):
    """``fn(local_rank, *args)`` in a rank whose process group the kit has made
    (``launch_function``, ``run_per_rank``). A function written for torchrun calls
    ``init_process_group`` (torch: "trying to initialize the default process group
    twice!") or ``destroy_process_group`` (then ignite's clean-up: "Default process group
    has not been initialized"): either becomes one line that says what the kit did and
    what to do instead."""
    import torch.distributed as dist

    had_group = dist.is_available() and dist.is_initialized()
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        value = fn(local_rank, *args)
    except ValueError as e:
        if had_group and "default process group twice" in str(e):
            raise DistkitError(
                f"{name} calls torch.distributed.init_process_group itself, but the kit's launcher "
                f"has already made the process group ({dist.get_backend()}, rank "
                f"{dist.get_rank()} of {dist.get_world_size()}): remove its init_process_group "
                "and destroy_process_group calls, or run the script as written with `distkit "
                "launch script.py` (distkit.launch_script)") from None
        raise
    if had_group and not dist.is_initialized():
        raise DistkitError(
            f"{name} called torch.distributed.destroy_process_group(), but the process group is "
            "the kit's launcher's, which ends it after the function returns: remove that call, "
            "or run the script as written with `distkit launch script.py` "
            "(distkit.launch_script)")
    return value
