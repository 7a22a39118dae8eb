"""Exercise 05: a Timer that measures only the training step.

Topic: timing and profiling. "How long does a step take?" has a precise answer only if
the clock runs during the step and stops while the next batch is loaded and while other
handlers (validation, checkpoints, logging) run. ignite's ``Timer`` can be started,
resumed, paused and stepped on engine events.

Task: write two functions.

1. ``attach_step_timer(trainer)``: return a ``ignite.handlers.Timer`` attached to
   ``trainer`` so that ``timer.value()`` is the AVERAGE duration of one training step
   (the engine's process function), without the time spent fetching the batch (the first
   batch of each epoch included) and without the time of other handlers.
2. ``slowest_rank(seconds)``: every rank passes its own step time; return, on every rank,
   the largest one, as a Python float. In synchronous data-parallel training every step waits for the
   slowest rank, so that is the number that sets the pace.

Engine events, in the order they fire: ``STARTED``, then per epoch ``EPOCH_STARTED``, then
for every batch ``GET_BATCH_STARTED``, ``GET_BATCH_COMPLETED``, ``ITERATION_STARTED``, (the
step), ``ITERATION_COMPLETED``; then ``EPOCH_COMPLETED``.

Check it:  pytest exercises -m ex05     (or: distkit check 05)
Stuck?     distkit check 05 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
from ignite.engine import Engine, Events
from ignite.handlers import Timer


def attach_step_timer(trainer: Engine) -> Timer:
    """A Timer on ``trainer`` whose ``value()`` is the average time of one step."""
    # TODO: create a Timer and attach it with the right start/resume/pause/step events.
    raise NotImplementedError("exercise 05: write attach_step_timer")


def slowest_rank(seconds: float) -> float:
    """The largest of the ranks' ``seconds``, returned on every rank."""
    # TODO: one collective, with the right reduction.
    raise NotImplementedError("exercise 05: write slowest_rank")
