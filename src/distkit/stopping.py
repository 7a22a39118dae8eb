"""Stopping is part of training: every rank stops at the same iteration, with a checkpoint.

A stop signal (:mod:`distkit.signals`) reaches the ranks at different moments: the
launcher forwards it one process after another, torchrun's agent likewise, and a user may
``kill`` one rank only. Each rank's flag is therefore OR-ed over the ranks (one
all-reduce of one integer per iteration, the signal's number, MAX) and all act on the
result, which is the same everywhere, at the same iteration.

That all-reduce is started without waiting (``async_op=True``) and its result read one
iteration later, so it travels while the next step computes instead of adding a round
trip to every step (benchmarks/stop_cost.py measures both). The stop therefore lands one
iteration after the flag is seen: milliseconds.

Where to stop: an iteration in the middle of an epoch stops right there (a checkpoint is
written if that iteration has none yet); the last iteration of an epoch waits for the
epoch's end, so the epoch's validation, early stopping, best model, scheduler step and
epoch checkpoint all happen first, exactly as in a run that goes on. ``--max-iters`` uses
the same rule, so a run cut at an epoch's end resumes with the same schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import ignite.distributed as idist
import torch
from ignite.engine import Events

from distkit import signals


class StopAgreement:
    """The stop flag of every rank, MAX-reduced, one iteration late (see module doc)."""

    def __init__(self):
        import torch.distributed as dist

        self.world_size = idist.get_world_size()
        self.overlapped = (self.world_size > 1 and dist.is_available() and dist.is_initialized()
                           and idist.backend() in ("gloo", "nccl"))
        self._in_flight = None  # (work, tensor) started at the previous iteration

    def poll(self) -> int:
        """The signal some rank had seen by the previous poll (0: none); every rank gets
        the same answer at the same call. Call on every rank, at every iteration."""
        local = signals.requested()
        if self.world_size == 1:
            return local
        if not self.overlapped:  # XLA: a plain all-reduce
            return int(idist.all_reduce(float(local), op="MAX"))
        import torch.distributed as dist

        agreed = self._finish()
        flag = torch.tensor([local], dtype=torch.int32, device=idist.device())
        self._in_flight = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return agreed

    def _finish(self) -> int:
        if self._in_flight is None:
            return 0
        work, flag = self._in_flight
        self._in_flight = None
        work.wait()
        return int(flag.item())

    def drain(self) -> None:
        """Wait for the last all-reduce (every rank, once training's loop is over)."""
        self._finish()


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


def attach(trainer, save, max_iters: int | None = None) -> tuple[StopState, StopAgreement]:
    """Stop ``trainer`` at a stop signal or after ``max_iters`` iterations, on every rank
    at the same iteration; ``save(engine) -> path`` writes (or finds) the checkpoint of
    the iteration stopped at. Attach after the trainer's checkpoint handler: at an
    epoch's end the stop comes after it."""
    state, agreement = StopState(), StopAgreement()

    def stop(engine, checkpoint):
        state.stopped, state.pending = True, False
        state.iteration, state.epoch = engine.state.iteration, engine.state.epoch
        state.checkpoint = checkpoint
        engine.terminate()

    @trainer.on(Events.ITERATION_COMPLETED)
    def check_for_stop(engine):
        signum = agreement.poll()
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

    return state, agreement
