"""Checks for exercise 05: the Timer on a trainer whose times are known, and the
slowest rank over 2 processes."""
import math
import time

import pytest
from ignite.engine import Engine, Events

import harness

pytestmark = pytest.mark.ex05

STEP_S = 0.03  # the process function sleeps this long
DATA_S = 0.06  # fetching a batch sleeps this long
HANDLER_S = 0.20  # a handler at every EPOCH_COMPLETED ("validation") sleeps this long
LOG_S = 0.10  # a handler at every ITERATION_COMPLETED ("logging"): far from DATA_S, so the
#               check can tell which of the two a timer counted
ITERS = 8  # per epoch: a total over the epoch (0.24 s) is far from a step + a batch (0.09 s)


class SlowData:
    """A data source that takes DATA_S to produce each batch, and notes how long it took."""

    def __init__(self):
        self.took = []

    def __iter__(self):
        for i in range(ITERS):
            start = time.perf_counter()
            time.sleep(DATA_S)
            self.took.append(time.perf_counter() - start)
            yield i

    def __len__(self):
        return ITERS


def test_timer_measures_only_the_step():
    ex = harness.load("05")
    steps = []

    def step(engine, batch):
        start = time.perf_counter()
        time.sleep(STEP_S)
        steps.append(time.perf_counter() - start)

    logged = []

    def log(engine):
        start = time.perf_counter()
        time.sleep(LOG_S)
        logged.append(time.perf_counter() - start)

    trainer = Engine(step)
    timer = ex.attach_step_timer(trainer)
    # Attached after the learner's timer, like logging and validation in a real script.
    trainer.add_event_handler(Events.ITERATION_COMPLETED, log)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: time.sleep(HANDLER_S))
    data = SlowData()
    trainer.run(data, max_epochs=2)
    if timer is None or not hasattr(timer, "value"):
        raise harness.ExerciseFailure(
            f"attach_step_timer returned {timer!r}: return the ignite.handlers.Timer")
    got = timer.value()
    # Compare with what the step and the data took in this run (a busy machine sleeps
    # longer than asked), not with the nominal times.
    step_s, data_s = sum(steps) / len(steps), sum(data.took) / len(data.took)
    log_s = sum(logged) / len(logged)
    told = (f"your timer says {got:.3f} s, but one step took {step_s:.3f} s, fetching a batch "
            f"{data_s:.3f} s, a logging handler after each step {log_s:.3f} s, and a handler at "
            f"the end of each epoch {HANDLER_S:.2f} s")
    if got >= 0.8 * ITERS * step_s:
        raise harness.ExerciseFailure(
            f"{told}: that looks like a total, not an average; use Timer(average=True) and "
            f"step it at ITERATION_COMPLETED, so value() divides by the number of steps")
    outside = got - step_s
    if outside >= 0.5 * data_s and abs(outside - data_s) <= 0.3 * data_s:
        raise harness.ExerciseFailure(
            f"{told}: it also counts fetching the batch; resume the timer at "
            f"ITERATION_STARTED (after the batch arrived) and pause it at ITERATION_COMPLETED")
    if outside >= 0.5 * data_s:
        raise harness.ExerciseFailure(
            f"{told}: it also counts time outside the step, the other handlers' (logging, "
            f"validation); pause the timer at ITERATION_COMPLETED, where the step ends, not "
            f"at a later event")
    if got < 0.9 * step_s:
        raise harness.ExerciseFailure(
            f"{told}: it misses part of the step (or divides by too much); resume at "
            f"ITERATION_STARTED, pause at ITERATION_COMPLETED, step at ITERATION_COMPLETED")


STEP_TIMES = [0.25, 0.75]  # rank r's step time


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("05")
    return ex.slowest_rank(STEP_TIMES[idist.get_rank()])


def test_every_rank_learns_the_slowest_time():
    import torch

    for rank, got in enumerate(harness.run_ranks(on_rank)):
        if isinstance(got, torch.Tensor):
            raise harness.ExerciseFailure(
                f"rank {rank} returned a tensor ({got!r}), not a Python float: all_reduce "
                f"hands back what it was given, so pass it float(seconds), or return .item()")
        if not isinstance(got, (int, float)) or not math.isclose(got, max(STEP_TIMES)):
            hint = ""
            if isinstance(got, (int, float)) and math.isclose(got, STEP_TIMES[rank]):
                hint = " (its own time: nothing was combined across ranks)"
            elif isinstance(got, (int, float)) and math.isclose(got, sum(STEP_TIMES)):
                hint = " (the SUM: all_reduce adds by default; ask for op='MAX')"
            raise harness.ExerciseFailure(
                f"rank {rank} returned {got!r}{hint}, but the ranks' step times are "
                f"{STEP_TIMES} and every rank must get the largest, {max(STEP_TIMES)}")
