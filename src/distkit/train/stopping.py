"""Stopping is part of training: every rank stops at the same iteration, with a checkpoint.

A stop signal (:mod:`distkit.train.signals`) reaches the ranks at different moments: the
launcher forwards it one process after another, torchrun's agent likewise, and a user may
``kill`` one rank only. Each rank's flag is therefore reduced over the ranks (one
all-reduce of one number, the signal's, MAX) and all act on the result, which is the same
everywhere, at the same iteration.

That all-reduce runs every ``CHECK_EVERY`` (10) iterations, at the same iteration numbers
on every rank, not at every step: on 2 gloo ranks of the 2-core VM one at every step
added ~0.4 ms to a 0.2 ms step, overlapped (started at one step, read at the next) or
not; every 10th step, 0.05 ms (benchmarks/stop_cost.py). A stop lands within 10
iterations of the signal: milliseconds to seconds, far inside SLURM's 30 s grace.

Where to stop: an iteration in the middle of an epoch stops right there (a checkpoint is
written if that iteration has none yet); the last iteration of an epoch waits for the
epoch's end, so the epoch's validation, early stopping, best model, scheduler step and
epoch checkpoint all happen first, exactly as in a run that goes on. ``--max-iters`` uses
the same rule, so a run cut at an epoch's end resumes with the same schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import ignite.distributed as idist
from ignite.engine import Events

from distkit.train import finite, signals


CHECK_EVERY = 10
"""Iterations between two agreements: an all-reduce at every step added ~0.4 ms to each
0.2 ms step on 2 gloo ranks of the 2-core VM, overlapped with the next step or not;
every 10th step, 0.05-0.06 ms (benchmarks/stop_cost.py, docs/resume.md). A stop then
lands within 10 iterations of the signal."""


class StopAgreement:
    """The stop flag of every rank, and what each rank's :class:`~distkit.train.finite.FiniteGuard`
    saw, gathered every ``every`` iterations (see module doc)."""

    def __init__(self, every: int = CHECK_EVERY):
        self.world_size, self.every = idist.get_world_size(), max(1, int(every))

    def poll(self, iteration: int, guard=None) -> tuple[int, list | None]:
        """The signal some rank has seen (0: none), and every rank's ``[iteration, what]``
        of a non-finite value (None: not an iteration where the ranks meet). Every rank
        gets the same answer at the same iteration. Call on every rank, at every iteration."""
        if iteration % self.every:
            return (signals.requested() if self.world_size == 1 else 0), None
        mine = [signals.requested(), *(guard.mine(iteration) if guard is not None else (0, 0))]
        rows = finite.gather(mine)
        return max(row[0] for row in rows), [row[1:] for row in rows]


@dataclass
class StopState:
    """What stopped the trainer early, if anything: ``signum`` (0: ``--max-iters``), the
    iteration and epoch it stopped at, and the checkpoint written there."""

    signum: int = 0
    stopped: bool = False
    pending: bool = False
    iteration: int = 0
    epoch: int = 0
    checkpoint: str | None = None


def attach(trainer, save, max_iters: int | None = None, guard=None) -> StopState:
    """Stop ``trainer`` at a stop signal or after ``max_iters`` iterations, on every rank
    at the same iteration; ``save(engine) -> path`` writes (or finds) the checkpoint of
    the iteration stopped at. ``guard`` (a :class:`~distkit.train.finite.FiniteGuard`)
    watches every loss and raises at the next agreement after a non-finite one. Attach
    after the trainer's checkpoint handler: at an epoch's end the stop comes after it."""
    state, agreement = StopState(), StopAgreement()

    def stop(engine, checkpoint):
        state.stopped, state.pending = True, False
        state.iteration, state.epoch = engine.state.iteration, engine.state.epoch
        state.checkpoint = checkpoint
        engine.terminate()

    @trainer.on(Events.ITERATION_COMPLETED)
    def check_for_stop(engine):
        if guard is not None:
            guard.see_loss(engine)
        signum, seen = agreement.poll(engine.state.iteration, guard)
        if guard is not None and seen is not None:
            guard.check(engine, seen)
        reached = max_iters is not None and engine.state.iteration >= max_iters
        if state.stopped or state.pending or not (signum or reached):
            return
        state.signum = signum
        if engine.state.iteration % engine.state.epoch_length == 0:
            state.pending = True  # validation, schedule step and checkpoint of this epoch first
            return
        stop(engine, save(engine))

    @trainer.on(Events.EPOCH_COMPLETED)
    def stop_at_epoch_end(engine):
        if state.pending:
            stop(engine, save(engine))

    return state
