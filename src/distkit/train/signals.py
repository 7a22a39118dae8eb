"""Signals that stop a run: a signal only sets a flag; training acts on it at a safe point.

SIGTERM is what SLURM (``scancel``, preemption, the time limit) and Kubernetes send before
SIGKILL; ``sbatch --signal=B:USR1@60`` asks for SIGUSR1 a minute before the time limit.
Either one, in a training process, sets a flag (:func:`install`); at the next iteration
boundary every rank agrees to stop (:mod:`distkit.train.stopping`: one all-reduce, so all stop
at the same iteration), saves a checkpoint and raises :class:`Preempted`, whose line names
the signal, the checkpoint and the command that resumes; the process exits with
``128 + signal`` (143 for SIGTERM), as the shell's "killed by SIGTERM" would.

A failure (an error, a refusal, a lost rank) exits 1, except in a task of an ``srun`` job
step, where it exits :data:`FAILED_IN_SLURM_STEP` (200). ``srun`` exits with the highest
code of its tasks, and a task killed by a signal outranks every code: when one task fails,
``srun --kill-on-bad-exit`` sends SIGTERM to the others, which then stop with 143. So under
srun a failure must outrank every stop, and no task may end by the signal itself:
:func:`install_for_slurm_step` holds the stop signals from the process's start, so a
signal before training begins ends the task with ``128 + signal`` and one line
(:class:`StoppedStarting`), one after training has ended (a peer failed) is noted,
not fatal, and once the exit status is decided they are ignored (:func:`leaving`).

In a rank of a torchrun / srun launch SIGINT is one of them too: torchrun passes the
Ctrl-C it got on to its workers, and every node then stops with a checkpoint and one
line instead of a traceback. A second SIGINT while stopping interrupts at once.

No torch here: the launcher, the ranks and the command line share it.
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
import threading

from distkit.errors import DistkitError
from distkit.host.layout import in_slurm_step

# SIGHUP: a closed terminal or ssh session stops the run as SIGTERM does, with a checkpoint
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
FAILED = 1
FAILED_IN_SLURM_STEP = 200
"""Above 128 + any stop signal, so srun's "highest code of the tasks" says failure; not
128 + a signal number (those end at 128 + 64), so it is never read as "killed by"."""
_received: list[int] = []
_begun: list[bool] = []  # training has installed its handlers once in this process


class StoppedStarting(BaseException):
    """A stop signal before training began (in a task of an srun step): nothing to save.
    A BaseException, so no ``except Exception`` on the way up swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.exit_code = int(signum), exit_code(signum)

    def line(self) -> str:
        return (f"stopped by {name(self.signum)} while starting, before the first iteration: "
                "nothing to save (no checkpoint)")


def failure_exit_code(environ=os.environ) -> int:
    """The exit status of a failed run: 1, or 200 in a task of an srun job step."""
    return FAILED_IN_SLURM_STEP if in_slurm_step(environ) else FAILED


def begin() -> None:
    """The run has begun (training, or a launcher's ranks): from now on its own handlers
    decide what a stop signal does, and after them the signal is only noted."""
    _begun.append(True)


def _on_signal_in_step(signum, frame) -> None:
    if not _begun:
        raise StoppedStarting(signum)
    request(signum)  # after training (a failure being reported, or the end): its code decides


def leaving(environ=os.environ) -> None:
    """In a task of an srun step whose exit status is decided: ignore the stop signals.
    The interpreter's exit puts the default action back on every signal with a Python
    handler (not on an ignored one), and a SIGTERM that srun sends to the other tasks
    while this one's exit is still freeing torch's objects would end it as "killed by
    SIGTERM", which srun reports over every task's exit code."""
    if in_slurm_step(environ) and threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def exit_now_in_slurm_step(code: int, environ=os.environ) -> None:
    """In a task of an srun step that failed or stopped: leave now with ``code``, without
    the interpreter's teardown. After a lost peer, freeing torch's process-group objects
    at exit took over 5 s here (2-core VM, load 20), and srun's SIGKILL after ``KillWait``
    then reports the task as "Killed" (137) over every task's code. The run's files are
    written whole before this point; only the output streams need flushing."""
    if code and in_slurm_step(environ):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def install_for_slurm_step(environ=os.environ) -> None:
    """In a task of an srun step, from the process's start: a stop signal never kills it
    (see the module's docstring). Elsewhere nothing changes."""
    if in_slurm_step(environ):
        install(STOP_SIGNALS, handler=_on_signal_in_step)


def _on_signal(signum, frame) -> None:
    if signum == signal.SIGINT and _received:
        raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the safe point
    if not _received:
        _received.append(signum)


def install(signals=STOP_SIGNALS, handler=None):
    """Make ``signals`` set the stop flag in this process (main thread only; elsewhere
    nothing changes). Returns a function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if handler is None:  # training's own: from now on a signal is a stop at an iteration
        begin()
    previous = {}
    for signum in signals:
        try:
            previous[signum] = signal.signal(signum, handler or _on_signal)
        except (OSError, ValueError):  # not settable here
            continue

    def restore() -> None:
        for signum, handler in previous.items():
            try:
                signal.signal(signum, handler)
            except (OSError, ValueError, TypeError):
                pass

    return restore


def requested() -> int:
    """The signal that asked this process to stop (0: none)."""
    return _received[0] if _received else 0


def request(signum: int) -> None:
    """Set the flag as a signal would (a launcher that got the signal itself)."""
    if not _received:
        _received.append(int(signum))


def clear() -> None:
    """Forget a stop request (a new run in the same process starts clean)."""
    _received.clear()


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """The exit status that says "terminated by ``signum``": 143 for SIGTERM, 130 for SIGINT."""
    return 128 + int(signum)


class Preempted(DistkitError):
    """Training stopped at a signal, every rank at the same iteration, with a checkpoint.
    The message is the one line that says so; ``exit_code`` is ``128 + signal``."""

    def __init__(self, message: str, signum: int = signal.SIGTERM, checkpoint: str | None = None):
        super().__init__(message)
        self.signum, self.checkpoint = int(signum), checkpoint
        self.exit_code = exit_code(signum)
        self.reported = False

    def __reduce__(self):  # crosses process boundaries whole
        return (type(self), (str(self), self.signum, self.checkpoint))


def stopped_line(signum: int, iteration: int, epoch: int, checkpoint: str | None) -> str:
    """``stopped by SIGTERM at iteration 37 (epoch 2); checkpoint: PATH``."""
    kept = f"checkpoint: {checkpoint}" if checkpoint else "no checkpoint could be written"
    return f"stopped by {name(signum)} at iteration {iteration} (epoch {epoch}); {kept}"


def resume_command(checkpoint: str, argv=None) -> str:
    """The command that resumes: this one (``python -m distkit ...`` or ``distkit ...``),
    any ``--resume-from`` dropped, ``--resume-from CHECKPOINT`` added."""
    argv = list(sys.argv if argv is None else argv)
    head, args = argv[:1], argv[1:]
    if head and os.path.basename(head[0]) == "__main__.py" and \
            os.path.basename(os.path.dirname(head[0])) == "distkit":
        head = ["python", "-m", "distkit"]
    elif head and os.path.basename(head[0]) == "distkit":
        head = ["distkit"]
    else:
        head = ["python", *head]
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--resume-from":
            skip = True
            continue
        if arg.startswith("--resume-from="):
            continue
        kept.append(arg)
    return shlex.join([*head, *kept, "--resume-from", checkpoint])
