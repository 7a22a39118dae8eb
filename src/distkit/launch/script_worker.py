"""One rank of ``distkit launch``: run the user's script as ``python script.py`` would, and
turn an exception it raises into one line.

``python -m distkit.launch.script_worker SCRIPT ARGS...`` (or ``-m MODULE ARGS...``) runs the
script with ``runpy`` as ``__main__`` (``sys.argv`` and ``sys.path[0]`` as Python sets
them for a script, so its imports, its ``if __name__ == "__main__":`` and the pickling of
its classes work as usual). The launcher (:mod:`distkit.launch.script`) sets the
torchrun variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...) and
``DISTKIT_SCRIPT_REPORTS``, a folder where a rank whose script raises writes:

- ``rank<R>.txt``: the full traceback;
- ``rank<R>.json``: its failure record (:class:`distkit.observe.failures.FailureRecord`:
  the exception's type, its first line, the ``file:line`` in the user's script where it
  was raised, the traceback's path, and the one line the launcher prints).

With ``DISTKIT_TRACEBACKS`` set (the launch's run folder's ``tracebacks/``, see
:func:`distkit.launch.script.tracebacks_folder`), the traceback and a copy of the record
go there instead, and the record still goes to ``DISTKIT_SCRIPT_REPORTS`` for the launcher.

Before the script runs, ``DISTKIT_TIMEOUT`` (the launcher's ``--timeout``, 120 s by
default, as ``distkit train``) becomes the default timeout of every process group the
script makes without a ``timeout=`` of its own (:func:`bound_waits`): its
``init_process_group`` rendezvous and every collective on its groups then end in an
exception, reported in one line, instead of waiting forever on a rank that never comes.
``DISTKIT_TRACE`` set (``--trace``): the rank is profiled
(:mod:`distkit.observe.script_tracing`), its trace written before the rank leaves.

The exit status is the script's: 0, its ``sys.exit`` code, 1 when it raised, 130 after
Ctrl-C (the launcher has said so in one line). The worker ends when its launcher dies
(:func:`distkit.host.facts.end_with_parent`: SIGTERM at once, SIGKILL of the rank and
everything it started after the launcher's ``--grace``), so no rank is left behind.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback

from distkit.host.facts import end_with_parent
from distkit.host.layout import world_layout
from distkit.errors import DistkitError
from distkit.observe.failures import cause, record_of, write_record, write_traceback
from distkit.observe.hang_records import arm, write_raised


def _report(error: BaseException) -> None:
    layout = world_layout()  # the launcher set it, checked
    rank, local_rank = layout.rank, layout.local_rank
    node = f", node {layout.node_rank} of {layout.nnodes}" if layout.nnodes > 1 else ""
    folder = os.environ.get("DISTKIT_SCRIPT_REPORTS")
    if folder:
        write_raised(folder, int(rank), error)  # before the traceback: the supervisor's cue
    if isinstance(error, DistkitError):  # the kit's own refusal: its line names the fix
        write_record(folder, record_of(error, rank, local_rank, str(error), node=layout.node_rank))
        return
    # the traceback goes where the run's output goes (DISTKIT_TRACEBACKS), else beside the records
    tracebacks = os.environ.get("DISTKIT_TRACEBACKS") or folder
    path = write_traceback(tracebacks, int(rank), error) if tracebacks else None
    where = f"; full traceback in {path}" if path else ""
    line = f"rank {rank} (local rank {local_rank}{node}) raised {cause(error)}{where}"
    record = record_of(error, rank, local_rank, line, traceback_path=path, node=layout.node_rank)
    write_record(folder, record)
    if path and tracebacks != folder:
        write_record(tracebacks, record)  # the record beside its traceback, as distkit train's
    if os.environ.get("DISTKIT_VERBOSE") == "1" or not folder:
        sys.stderr.write("".join(traceback.format_exception(type(error), error,
                                                            error.__traceback__)))
        sys.stderr.flush()


def refuse_own_processes(world_size: int) -> None:
    """A script that starts its own processes (``torch.multiprocessing.spawn``,
    ``idist.Parallel(nproc_per_node=N)``: both go through ``start_processes``) inside a
    launch of several ranks would start N processes per rank, all fighting over one
    master port: refuse it in one line where it starts them. In a launch of one rank it
    runs as written."""
    if world_size < 2:
        return
    import torch.multiprocessing as mp

    spawn = sys.modules["torch.multiprocessing.spawn"]  # (mp.spawn is the function, not it)

    def refuse(fn, args=(), nprocs=1, *rest, **kwargs):
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "the script"
        raise DistkitError(
            f"{script} starts {nprocs} processes of its own (torch.multiprocessing / "
            f"idist.Parallel(nproc_per_node=...)), and distkit launch already started "
            f"{world_size} ranks of it: run it once, `distkit launch --nproc-per-node 1 "
            f"{script}` (or `python {script}`), or remove its own process start and let "
            "distkit launch start the ranks")

    mp.start_processes = spawn.start_processes = refuse


def bound_waits(timeout_s: float) -> None:
    """Make ``timeout_s`` the default timeout of the process groups this process makes
    (torch's own default is 30 minutes for gloo, 10 for nccl): ``init_process_group``
    and ``new_group`` without a ``timeout=`` read it (``distributed_c10d.
    _get_default_timeout``); a script that passes its own keeps it."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=timeout_s)
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timedelta(seconds=timeout_s)


def main(argv: list[str]) -> int:
    if not argv or argv == ["-m"]:
        sys.stderr.write("usage: python -m distkit.launch.script_worker SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
        return 2
    launcher = os.environ.get("DISTKIT_LAUNCHER_PID")
    end_with_parent(float(os.environ.get("DISTKIT_GRACE", "10")), int(launcher) if launcher else None)
    if os.environ.get("DISTKIT_SCRIPT_REPORTS"):
        arm(os.environ["DISTKIT_SCRIPT_REPORTS"], world_layout().rank)
    if os.environ.get("DISTKIT_TIMEOUT"):
        bound_waits(float(os.environ["DISTKIT_TIMEOUT"]))
    refuse_own_processes(world_layout().world_size)
    tracer = None
    if os.environ.get("DISTKIT_TRACE"):
        from distkit.observe.script_tracing import start_from_environment

        tracer = start_from_environment()
    code = _run(argv)
    if tracer is not None:
        try:
            tracer.finish()  # before leave(): the trace is on disk when the rank ends
        except Exception as e:  # noqa: BLE001 - the script's own result stands
            sys.stderr.write(f"distkit: rank {world_layout().rank}: could not write "
                             f"its trace: {type(e).__name__}: {e}\n")
    return code


def _run(argv: list[str]) -> int:
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py`
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        sys.stderr.write(f"{code}\n")  # sys.exit("message"): Python prints it, exit 1
        return 1
    except KeyboardInterrupt:
        return 130  # the launcher forwarded Ctrl-C and says so in one line
    except BaseException as e:  # noqa: BLE001 - any failure of the script is reported
        _report(e)
        return 1
    return 0


def leave(code: int) -> None:
    """End the rank without Python's finalization, once the script's non-daemon threads
    have ended, its ``atexit`` handlers have run and its output is flushed (what Python's
    own exit does before finalizing). Why: a script that calls
    ``destroy_process_group()`` while its DDP model still holds the gloo group (the DDP
    tutorial's ``main`` does) aborted at exit in 2 of 20 runs under plain torchrun on the
    2-core VM, "terminate called without an active exception" (SIGABRT after training
    succeeded). The core dump: the group's worker thread drops its last all-reduce and
    needs the GIL for a Python reference in it while ``Py_FinalizeEx`` collects garbage;
    the thread is told to exit inside a C++ destructor, and that is std::terminate. There
    is nothing left for finalization to do that the script asked for."""
    import atexit
    import threading

    # what Python's own exit does first: wait for the script's non-daemon threads
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
