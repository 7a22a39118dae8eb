"""Signals that stop a run: a signal only sets a flag; training acts on it at a safe point.

SIGTERM is what SLURM (``scancel``, preemption, the time limit) and Kubernetes send before
SIGKILL; ``sbatch --signal=B:USR1@60`` asks for SIGUSR1 a minute before the time limit.
Either one, in a training process, sets a flag (:func:`install`); at the next iteration
boundary every rank agrees to stop (:mod:`distkit.train.stopping`: one all-reduce, so all stop
at the same iteration), saves a checkpoint and raises :class:`Preempted`, whose line names
the signal, the checkpoint and the command that resumes; the process exits with
``128 + signal`` (143 for SIGTERM), as the shell's "killed by SIGTERM" would.

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

# SIGHUP: a closed terminal or ssh session stops the run as SIGTERM does, with a checkpoint
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
_received: list[int] = []


def _on_signal(signum, frame) -> None:
    if signum == signal.SIGINT and _received:
        raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the safe point
    if not _received:
        _received.append(signum)


def install(signals=STOP_SIGNALS):
    """Make ``signals`` set the stop flag in this process (main thread only; elsewhere
    nothing changes). Returns a function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {}
    for signum in signals:
        try:
            previous[signum] = signal.signal(signum, _on_signal)
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
