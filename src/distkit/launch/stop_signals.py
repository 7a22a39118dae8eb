"""The stop signals a launcher gets while its ranks run: one way for both launchers.

:class:`StopSignals` installs the handlers (main thread only: Python allows no other),
remembers the first signal, and puts the previous handlers back when the launch ends, so
a notebook that launches in its kernel keeps its own. A handler only notes the signal
(and, where the policy says so, passes it on); the launcher acts on it at a safe point.
What differs between the launchers is a :class:`StopPolicy`:

- :data:`TRAINING` (``distkit train``'s spawned ranks, ``launch_function``,
  ``run_per_rank``): SIGTERM, SIGUSR1 and SIGHUP are passed on as they are to every rank,
  the ones that start after the signal included; each rank stops at the same iteration
  with a checkpoint (:mod:`distkit.train.stopping`) and the launcher waits for them. A
  Ctrl-C stops the ranks with SIGTERM (which training handles as a stop when it can),
  SIGKILL after 3 s.
- :func:`script_policy` (``distkit launch SCRIPT``): a script has no checkpoint to write,
  so on SIGTERM or SIGHUP the launcher stops the ranks itself: SIGTERM to each rank and
  everything it started, SIGKILL after ``--grace``. A Ctrl-C is passed on as SIGINT, with
  the same grace.

A Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` wherever the launcher waits (torch's join
included), as Python's own handler does, once; the launcher then calls
:meth:`StopSignals.interrupt`. A second Ctrl-C is only noted, so it cannot cut the stop
short and leave ranks behind. The first is raised again each second until the launcher
has taken it: Python drops an exception raised where it cannot propagate (a fork's hooks
in the parent, ``__del__``), and a Ctrl-C landing there would be lost while the ranks
train on. (Where SIGINT is ignored, a job started in the background of a script, it
stays ignored.) In a task of an srun step the stop signals the policy leaves alone keep
the handler that :func:`distkit.train.signals.install_for_slurm_step` gave them (a noted
stop).
"""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

from distkit.host.facts import stop_processes
from distkit.train import signals


@dataclass(frozen=True)
class StopPolicy:
    """What a launcher does with a stop signal while its ranks run."""

    handled: tuple  # the signals the launcher takes while its ranks run (SIGINT aside)
    forward: bool  # pass a signal on as it is and wait (True), or stop the ranks (False)
    stop_with: int  # what the ranks get when the launcher stops them (forward False)
    interrupt_with: int  # what the ranks get on a Ctrl-C
    grace_s: float  # then SIGKILL
    tree: bool  # the ranks' process groups and everything they started get it too


TRAINING = StopPolicy(handled=signals.STOP_SIGNALS, forward=True, stop_with=signal.SIGTERM,
                      interrupt_with=signal.SIGTERM, grace_s=3.0, tree=False)


def script_policy(grace_s: float) -> StopPolicy:
    """``distkit launch``'s: SIGTERM and SIGHUP stop the ranks (SIGTERM, ``grace_s``, SIGKILL)."""
    return StopPolicy(handled=(signal.SIGTERM, signal.SIGHUP), forward=False,
                      stop_with=signal.SIGTERM, interrupt_with=signal.SIGINT, grace_s=grace_s,
                      tree=True)


class StopSignals:
    """``with StopSignals(ranks, policy) as stop:`` around a launch. ``ranks()`` lists the
    rank processes started so far (``multiprocessing.Process`` or ``subprocess.Popen``).
    ``signum``: the first stop signal (0: none yet); ``stopped``: how many ranks
    :meth:`stop` or :meth:`interrupt` found running; ``interrupted``: a Ctrl-C came."""

    def __init__(self, ranks, policy: StopPolicy):
        self.ranks, self.policy = ranks, policy
        self.signum, self.stopped, self.interrupted = 0, 0, False
        self._previous: dict = {}
        self._sent: set = set()
        self._done = threading.Event()
        self._taken = False  # the launcher has taken the Ctrl-C (interrupt() called)
        self._asking = False  # the Ctrl-C is asked again (see _insist)
        self._insisting: threading.Thread | None = None

    def __enter__(self):
        signals.clear()  # a stop asked of an earlier launch in this process is not this one's
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for signum in self.policy.handled:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
            signals.begin()  # from here the launcher decides; after it a signal is only noted
        except BaseException:  # a Ctrl-C already: the caller's handlers go back all the same
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._insisting is not None:
            self._insisting.join()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if not self.signum:
            self.signum = signum
            signals.request(signum)
            if self.policy.forward:  # ranks that start after the signal get it too
                threading.Thread(target=self._forward_late, name="distkit-forward",
                                 daemon=True).start()
        if self.policy.forward:
            self._forward(signum, again=True)

    def _on_interrupt(self, signum, frame) -> None:
        first, self.interrupted = not self.interrupted, True
        asked, self._asking = self._asking, False
        if self._taken or self._done.is_set() or not (first or asked):
            return  # a second Ctrl-C while the first one unwinds: only noted
        if first:
            self._insisting = threading.Thread(target=self._insist, name="distkit-interrupt",
                                               daemon=True)
            self._insisting.start()
        raise KeyboardInterrupt

    def _insist(self) -> None:
        """Ask the main thread again each second until the launcher takes the Ctrl-C."""
        main = threading.main_thread().ident
        while not self._done.wait(1.0) and not self._taken:
            self._asking = True
            signal.pthread_kill(main, signal.SIGINT)

    def _forward(self, signum: int, again: bool = False) -> None:
        try:
            ranks = list(self.ranks())
        except RuntimeError:  # the list changed under a rank's reaping: the next look sees it
            return
        for p in ranks:
            if (again or p.pid not in self._sent) and p.pid is not None:
                self._sent.add(p.pid)
                try:
                    os.kill(p.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def _forward_late(self) -> None:
        while not self._done.wait(0.1):
            self._forward(self.signum)

    def stop(self, sig: int | None = None) -> int:
        """Stop every rank still running: ``sig`` (the policy's ``stop_with``), SIGKILL
        after the grace; returns how many were running."""
        self.stopped = stop_processes(list(self.ranks()), sig or self.policy.stop_with,
                                      self.policy.grace_s, group=self.policy.tree,
                                      tree=self.policy.tree)
        return self.stopped

    def interrupt(self) -> int:
        """After a Ctrl-C: stop every rank still running (the policy's ``interrupt_with``)."""
        self._taken = True
        return self.stop(self.policy.interrupt_with)
