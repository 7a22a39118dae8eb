"""Exercise 05: a Timer that measures only the training step. (Solution.)

See ``exercises/05_step_timer.py`` for the task.
"""
import ignite.distributed as idist
from ignite.engine import Engine, Events
from ignite.handlers import Timer


def attach_step_timer(trainer: Engine) -> Timer:
    """A Timer on ``trainer`` whose ``value()`` is the average time of one step."""
    # average=True: value() is the total time divided by the number of `step` events.
    timer = Timer(average=True)
    # resume/pause bracket the process function only: ITERATION_STARTED fires after the
    # batch was fetched, ITERATION_COMPLETED right after the step. Handlers of other
    # events (EPOCH_COMPLETED: validation, checkpoints) run while the timer is paused.
    # start=EPOCH_STARTED resets it every epoch, so value() is this epoch's average.
    timer.attach(trainer, start=Events.EPOCH_STARTED, resume=Events.ITERATION_STARTED,
                 pause=Events.ITERATION_COMPLETED, step=Events.ITERATION_COMPLETED)
    # A Timer RUNS from its start event on (reset() starts the clock), and resume() does
    # nothing to a running timer: without this pause it would also count the first batch
    # fetch of every epoch, often the slowest one (a DataLoader starts its workers then).
    trainer.add_event_handler(Events.EPOCH_STARTED, timer.pause)
    return timer


def slowest_rank(seconds: float) -> float:
    """The largest of the ranks' ``seconds``, returned on every rank."""
    # MAX instead of the default SUM; all_reduce, so every rank gets the answer.
    return idist.all_reduce(float(seconds), op="MAX")
