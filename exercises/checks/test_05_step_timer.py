"""Checks for exercise 05: the Timer on a trainer whose times are known, and the
slowest rank over 2 processes."""
import math
import sys
import time

import pytest
from ignite.engine import Engine, Events
from ignite.handlers import Timer

import harness

pytestmark = pytest.mark.ex05

# The process function sleeps STEPS_S[i] at the i-th step of an epoch: unequal, and the last
# one far below the mean, so a timer that keeps only the last step cannot pass.
STEPS_S = [0.05, 0.03, 0.04, 0.02, 0.05, 0.03, 0.02, 0.006]
ITERS = len(STEPS_S)  # per epoch: a total over the epoch is far from one step
DATA_S = 0.04  # fetching a batch sleeps this long ...
FIRST_DATA_S = 0.20  # ... and the first batch of each epoch this long (a DataLoader starts
#                      its workers then): a Timer that runs from EPOCH_STARTED counts it
HANDLER_S = 0.20  # a handler at every EPOCH_COMPLETED ("validation") sleeps this long
LOG_S = 0.08  # a handler at every ITERATION_COMPLETED ("logging")
# Handlers on the other events a step's time could straddle: EPOCH_STARTED (a sampler's
# set_epoch), GET_BATCH_COMPLETED (the batch moved to the device), both attached after the
# learner's timer, and ITERATION_STARTED attached BEFORE it (a learning-rate scheduler the
# trainer already had): handlers of one event run in the order they were attached.
EDGE_S = 0.03
# where each handler runs, and what a timer that counted it did instead of the right thing
HANDLERS = {
    "logging": ("ITERATION_COMPLETED", "pause the timer at ITERATION_COMPLETED, where the step ends, not at a "
                                       "later event"),
    "validation": ("EPOCH_COMPLETED", "pause the timer at ITERATION_COMPLETED, where the step ends, not at a "
                                      "later event"),
    "set_epoch": ("EPOCH_STARTED", "a Timer RUNS from its start event on: pause it in a handler of that event "
                                   "attached right after the timer, so the event's other handlers (and the "
                                   "batch fetches) stay out, not only at a later event"),
    "batch to device": ("GET_BATCH_COMPLETED", "resume the timer at ITERATION_STARTED, right before the step, "
                                               "not as soon as the batch is fetched"),
    "scheduler": ("ITERATION_STARTED", "resume the timer at ITERATION_STARTED itself: it then starts after the "
                                       "handlers the trainer already had for that event, not at an earlier event"),
}
EPOCHS = 2


class SlowData:
    """A data source that takes FIRST_DATA_S for the first batch of an epoch and DATA_S
    for the others, and notes how long each took."""

    def __init__(self):
        self.took = []

    def __iter__(self):
        for i in range(ITERS):
            start = time.perf_counter()
            time.sleep(FIRST_DATA_S if i == 0 else DATA_S)
            self.took.append(time.perf_counter() - start)
            yield i

    def __len__(self):
        return ITERS


class Probe:
    """Notes what the learner's timer counted during each batch fetch and each other
    handler. Its handlers run after the learner's of the same event (but the one attached
    before the timer), so they see the timer as the learner left it. Time counted during a
    fetch or handler that a later reset threw away (a timer restarted at ITERATION_STARTED)
    does not count: a reset is seen as the count going DOWN between two looks, and the
    probe looks after the learner's handlers of every event."""

    def __init__(self, timer):
        self.timer = timer
        self.pending = []  # what the timer counted, as long as no reset threw it away
        self.counted = []  # what the timer counted and kept: "fetch 1.1" (epoch 1, batch 1), ...
        self.fetch_start = self.last = 0.0

    def count(self):
        t = self.timer
        if t is None:  # the learner's timer is not made yet
            return 0.0
        total = float(getattr(t, "total", 0.0))
        if getattr(t, "running", False) and hasattr(t, "_elapsed"):
            total += t._elapsed()
        return total

    def look(self, *_):
        """The timer's count now; a count below the last look's is a reset."""
        now = self.count()
        if now < self.last - 1e-9:
            self.pending = []
        self.last = now
        return now

    def attach_before(self, trainer):
        """The handlers the trainer has before the learner's timer is attached."""
        trainer.add_event_handler(Events.ITERATION_STARTED, self.around, "scheduler", edge, EDGE_S)

    def attach(self, trainer, log, validate):
        for event in (Events.STARTED, Events.EPOCH_STARTED, Events.ITERATION_STARTED, Events.ITERATION_COMPLETED,
                      Events.EPOCH_COMPLETED):
            trainer.add_event_handler(event, self.look)
        trainer.add_event_handler(Events.EPOCH_STARTED, self.around, "set_epoch", edge, EDGE_S)
        trainer.add_event_handler(Events.GET_BATCH_STARTED, self.fetch_started)
        trainer.add_event_handler(Events.GET_BATCH_COMPLETED, self.fetch_completed)
        trainer.add_event_handler(Events.GET_BATCH_COMPLETED, self.around, "batch to device", edge, EDGE_S)
        trainer.add_event_handler(Events.ITERATION_COMPLETED, self.around, "logging", log, LOG_S, True)
        trainer.add_event_handler(Events.EPOCH_COMPLETED, self.around, "validation", validate, HANDLER_S, True)
        trainer.add_event_handler(Events.COMPLETED, lambda _: self.resolve())

    def resolve(self):
        self.look()
        self.counted += self.pending
        self.pending = []

    def fetch_started(self, engine):
        self.fetch_start = self.look()

    def fetch_completed(self, engine):
        during = self.look() - self.fetch_start
        position = engine.state.iteration % ITERS  # iterations done before this batch
        nominal = FIRST_DATA_S if position == 0 else DATA_S
        if during >= 0.5 * nominal:
            self.pending.append(f"fetch {engine.state.epoch}.{position}")

    def around(self, engine, what, work, nominal, commit=False):
        if commit:  # after a step: what no reset threw away up to here stays counted
            self.resolve()
        before = self.look()
        work()
        if self.look() - before >= 0.5 * nominal:
            self.pending.append(what)


def edge():
    time.sleep(EDGE_S)


def run_timer(ex):
    """The learner's timer on a trainer whose times are known: what it says and what the
    run measured, as plain data."""
    steps = []

    def step(engine, batch):
        start = time.perf_counter()
        time.sleep(STEPS_S[batch])
        steps.append(time.perf_counter() - start)

    logged = []

    def log():
        start = time.perf_counter()
        time.sleep(LOG_S)
        logged.append(time.perf_counter() - start)

    trainer = Engine(step)
    probe = Probe(None)
    probe.attach_before(trainer)
    try:
        timer = ex.attach_step_timer(trainer)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the learner's error becomes the message
        report = harness._describe(error)
        raise harness.ExerciseFailure(
            f"attach_step_timer raised {report['type']}: {report['message']}\n{report['traceback']}") from None
    if not isinstance(timer, Timer):
        shown = "None" if timer is None else f"an {type(timer).__name__}" if \
            type(timer).__name__[0] in "AEIOU" else f"a {type(timer).__name__}"
        raise harness.ExerciseFailure(
            f"attach_step_timer returned {shown}{', not a Timer' if timer is not None else ''}: return the "
            f"ignite.handlers.Timer you attached to the trainer")
    probe.timer = timer
    # Attached after the learner's timer, like logging and validation in a real script.
    probe.attach(trainer, log, lambda: time.sleep(HANDLER_S))
    data = SlowData()
    trainer.run(data, max_epochs=EPOCHS)
    attached = any(trainer.has_event_handler(getattr(timer, name)) for name in ("reset", "resume", "pause", "step"))
    return {"value": float(timer.value()), "steps": steps, "fetches": data.took, "logged": logged,
            "attached": attached, "counted": list(probe.counted)}


def measured(run):
    """The run's measured times, each at least what was slept (a busy machine sleeps longer
    than asked, never shorter), and the shortest within a sleep's overshoot of it: else the
    data is not a run's."""
    asked = {"steps": [STEPS_S[i % ITERS] for i in range(EPOCHS * ITERS)],
             "fetches": [FIRST_DATA_S if i % ITERS == 0 else DATA_S for i in range(EPOCHS * ITERS)],
             "logged": [LOG_S] * (EPOCHS * ITERS)}
    for key, nominal in asked.items():
        took = run[key]
        over = [float(t) - n for t, n in zip(took, nominal)]
        if len(took) != len(nominal) or not all(math.isfinite(o) and o >= -1e-3 for o in over) \
                or min(over) > MAX_OVERSHOOT_S:
            raise harness.ExerciseFailure(f"the timer's run: {key} are not what a run measures: no marks")
    return run


MAX_OVERSHOOT_S = 0.5  # of the 16 sleeps of a kind, the shortest overshot its time by less


def judge_timer(run):
    run = measured(run)
    got, steps, logged = run["value"], run["steps"], run["logged"]
    if isinstance(got, bool) or not isinstance(got, float) or not math.isfinite(got):
        raise harness.ExerciseFailure(f"the timer's run: its value is {harness.describe(got)}: no marks")
    # Compare with what the steps and the data took in this run (a busy machine sleeps
    # longer than asked), not with the nominal times.
    step_s = sum(steps) / len(steps)
    last_s = steps[-1]
    first_fetch = [t for i, t in enumerate(run["fetches"]) if i % ITERS == 0]
    data_s = sum(run["fetches"]) / len(run["fetches"])
    log_s = sum(logged) / len(logged)
    told = (f"your timer says {got:.3f} s, but the {ITERS} steps of an epoch took {step_s:.3f} s "
            f"on average (the last one {last_s:.3f} s), fetching a batch {data_s:.3f} s on "
            f"average (the first of each epoch {max(first_fetch):.3f} s), a logging handler "
            f"after each step {log_s:.3f} s, and a handler at the end of each epoch "
            f"{HANDLER_S:.2f} s")
    if run["attached"] is not True:
        raise harness.ExerciseFailure(
            f"your timer says {got:.3f} s, but it is not attached to the trainer: none of its reset, resume, "
            f"pause or step runs on the trainer's events, so it counted the time since it was created. "
            f"Attach it: timer.attach(trainer, start=..., resume=..., pause=..., step=...)")
    counted = [str(w) for w in run["counted"]]
    fetches = [w for w in counted if w.startswith("fetch")]
    if len(fetches) > EPOCHS:
        raise harness.ExerciseFailure(
            f"{told}: it also counts fetching the batch (it ran during {len(fetches)} of the "
            f"{EPOCHS * ITERS} fetches); resume the timer at ITERATION_STARTED (after the batch "
            f"arrived) and pause it at ITERATION_COMPLETED")
    if fetches:
        which = "of each epoch" if len(fetches) == EPOCHS else "of the first epoch"
        raise harness.ExerciseFailure(
            f"{told}: it also counts the first batch fetch {which} (it was running while that "
            f"batch was fetched). A Timer RUNS from its start event on: reset() starts the "
            f"clock, and resume() does nothing to a running timer. Pause it right after it "
            f"starts: a handler of its start event that calls timer.pause")
    handlers = [name for name in HANDLERS if name in counted]
    if handlers:
        ran = " and the ".join(f"{name} handler (at {HANDLERS[name][0]})" for name in handlers)
        advice = "; ".join(dict.fromkeys(HANDLERS[name][1] for name in handlers))
        raise harness.ExerciseFailure(
            f"{told}, and handlers of {EDGE_S:.2f} s at EPOCH_STARTED, GET_BATCH_COMPLETED and ITERATION_STARTED: "
            f"it also counts time outside the step, the other handlers' (it was still running in the {ran}): "
            f"{advice}")
    if any(w not in HANDLERS for w in counted):
        raise harness.ExerciseFailure(f"the timer's run: the probe noted {harness.short_list(counted, 3)}, "
                                      f"which it never notes: no marks")
    # judged after what the probe saw counted: a timer that ran through the handlers and
    # fetches is as large as a total without being one
    if got >= 0.8 * ITERS * step_s:
        raise harness.ExerciseFailure(
            f"{told}: that looks like a total, not an average; use Timer(average=True) and "
            f"step it at ITERATION_COMPLETED, so value() divides by the number of steps")
    outside = got - step_s
    if outside >= 0.5 * DATA_S:
        raise harness.ExerciseFailure(
            f"{told}: it also counts {outside:.3f} s per step outside the step; resume the "
            f"timer at ITERATION_STARTED and pause it at ITERATION_COMPLETED")
    if got < 0.85 * step_s and abs(got - last_s) < 0.25 * step_s:
        raise harness.ExerciseFailure(
            f"{told}: that is the LAST step's time, not the average over the steps: use "
            f"Timer(average=True), reset it at EPOCH_STARTED (not at every iteration) and "
            f"step it at ITERATION_COMPLETED")
    # a Timer reset every epoch (start=EPOCH_STARTED) averages the last epoch's steps only: the
    # step is missed only if the value is below every epoch's own average
    epoch_s = min(sum(steps[e * ITERS:(e + 1) * ITERS]) / ITERS for e in range(EPOCHS))
    if got < 0.9 * min(step_s, epoch_s):
        raise harness.ExerciseFailure(
            f"{told}: it misses part of the step (or divides by too much); resume at "
            f"ITERATION_STARTED, pause at ITERATION_COMPLETED, step at ITERATION_COMPLETED")


def test_timer_measures_only_the_step():
    harness.judge_here(sys.modules[__name__], [TIMER], harness.check_seed())


# Rank r's step time, in two rounds: first rank 0 is the slowest, so a reduce to rank 0
# (right there, wrong elsewhere) cannot pass; then rank 1, so copying rank 0's time
# (a broadcast) cannot pass either.
ROUNDS = ([0.75, 0.25], [0.25, 0.6])


def on_rank(whos):
    """``slowest_rank`` of each answer in ``whos`` over the ROUNDS, with what it ran."""
    import ignite.distributed as idist

    found = {}
    for who in sorted(whos, key=lambda w: w != harness.REFERENCE):  # as in on_rank_random
        ex = harness.answer("05", who)
        found[who] = [observed(ex.slowest_rank, times[idist.get_rank()]) for times in ROUNDS]
    return found


def observed(slowest_rank, seconds):
    """``slowest_rank(seconds)``, what it returned and which collectives it ran, as plain
    data: the value as a number, or how it is shown when it is not one."""
    import ignite.distributed as idist
    import torch
    from distkit.lessons.sharded import CommCounter

    with CommCounter() as comm, harness.Recorder() as record:  # which collectives the answer ran
        got = slowest_rank(seconds)
    number = isinstance(got, (int, float)) and not isinstance(got, bool)
    kind = harness.describe(got) if isinstance(got, (list, tuple)) else type(got).__name__
    calls = [{"op": c["op"], "devices": list(c["devices"]),
              "dtype": None if c.get("copy") is None else str(c["copy"].dtype).replace("torch.", "")}
             for c in record.log if c["op"] != "wait"]
    return {"value": float(got) if number else None, "shown": repr(got)[:200], "kind": kind,
            "tensor": isinstance(got, torch.Tensor), "collectives": dict(comm.calls), "calls": calls,
            "device": str(idist.device())}


LOW_PRECISION = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def tensors_given(report, device):
    """What the answer handed to its collectives: a floating dtype narrower than float32
    (bfloat16, float16), and a device other than idist.device() (the reference's)."""
    calls = report["calls"]
    low = [c["dtype"] for c in calls if c["dtype"] in LOW_PRECISION]
    return {"low": low[0] if low else None, "device": harness.on_device(calls, device)}


def _close(value, target):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isclose(value, target, rel_tol=1e-6)


def explain_slowest(rank, report, values, times, device):
    """What rank ``rank`` got wrong, or None; ``values``: what every rank returned;
    ``device``: idist.device() on that rank."""
    got, shown, calls = report["value"], report["shown"], report["collectives"]
    given = tensors_given(report, device)
    if given["device"]:
        return f"rank {rank}: {given['device']}"
    if report["tensor"] is True:
        return (f"rank {rank} returned a tensor ({shown}), not a Python float: all_reduce "
                f"hands back what it was given, so pass it float(seconds), or return .item()")
    if not isinstance(got, float):
        return f"rank {rank} returned {shown} ({report['kind']}); return a Python float"
    if _close(got, max(times)):
        return None
    common = (f"the ranks' step times are {times} and every rank must get the largest, "
              f"{max(times)}")
    if given["low"]:
        return (f"rank {rank} returned {shown}: the all_reduce was given a {given['low']} tensor, which "
                f"cannot hold these times (about 3 significant digits): reduce the time as a Python float "
                f"or a float32/float64 tensor ({common})")
    if not calls:
        return (f"rank {rank} returned {shown} (its own time: nothing was combined across "
                f"ranks, no collective ran), but {common}")
    if "reduce" in calls and "all_reduce" not in calls:
        return (f"rank {rank} returned {shown}: reduce leaves the result on one rank only; "
                f"use all_reduce, which hands it to EVERY rank ({common})")
    if "broadcast" in calls and "all_reduce" not in calls:
        return (f"rank {rank} returned {shown}, the time of the rank that broadcast it: a "
                f"broadcast copies ONE rank's value, whichever is slowest; all_reduce with "
                f"op='MAX' combines them all ({common})")
    if all(_close(v, min(times)) for v in values):
        return (f"rank {rank} returned {shown}, the SMALLEST time (every rank got it): the "
                f"step waits for the slowest rank; ask for op='MAX', not 'MIN' ({common})")
    if all(_close(v, sum(times)) for v in values):
        return (f"rank {rank} returned {shown} (the SUM: all_reduce adds by default; ask for "
                f"op='MAX'), but {common}")
    if all(_close(v, sum(times) / len(times)) for v in values):
        return (f"rank {rank} returned {shown} (the MEAN of the ranks' times; the step waits "
                f"for the slowest rank: all_reduce with op='MAX'), but {common}")
    right = [k for k, v in enumerate(values) if _close(v, max(times))]
    if right:
        return (f"rank {right[0]} got the largest time {max(times)}, but rank {rank} "
                f"returned {shown}: the result must reach EVERY rank, and every rank must "
                f"return what the collective gave it ({common})")
    if all(_close(v, t) for v, t in zip(values, times)):  # every rank, not one by chance
        return (f"rank {rank} returned {shown} (its own time: what all_reduce returned was "
                f"not used), but {common}")
    return f"rank {rank} returned {shown}, but {common}"


def test_every_rank_learns_the_slowest_time():
    harness.judge_here(sys.modules[__name__], [SLOWEST], harness.check_seed())


def judge_slowest(got, expected):
    ranks = harness.same_ranks(got, expected)
    for index, times in enumerate(ROUNDS):
        values = [reports[index]["value"] for reports in ranks]
        for rank, reports in enumerate(ranks):
            problem = explain_slowest(rank, reports[index], values, times, expected[rank][index]["device"])
            if problem:
                raise harness.ExerciseFailure(problem)


def random_rounds(seed, world_size):
    """The times of seed ``seed``, one per rank of a world of ``world_size``, in two rounds:
    in one the slowest is the LAST rank, in the other rank 0."""
    import random

    rng = random.Random(seed)
    times = [round(rng.uniform(0.05, 2.0), 6) for _ in range(world_size)]
    rounds = []
    for where in (-1, 0):
        i = times.index(max(times))
        times[i], times[where] = times[where], times[i]
        rounds.append(list(times))
    return rounds


def on_rank_random(seed, whos):
    """slowest_rank on seeded random times, one per rank of whatever layout this is. The
    reference's results first, then the learner's: a learner's collective that only some
    ranks call cannot pair with one of the reference's (the error would then be raised in
    the reference's code, not the learner's)."""
    import ignite.distributed as idist

    rounds = random_rounds(seed, idist.get_world_size())
    found = {}
    for who in sorted(whos, key=lambda w: w != harness.REFERENCE):
        slowest = harness.answer("05", who).slowest_rank
        found[who] = [{**observed(slowest, times[idist.get_rank()]), "per_node": idist.get_nproc_per_node()}
                      for times in rounds]
    return found


def test_slowest_time_in_every_layout():
    """With no process group (one process: its own time is the slowest), 3 processes and
    2 nodes x 2 processes, on random times; against the reference."""
    harness.judge_here(sys.modules[__name__], RANDOM, harness.check_seed())


def judge_random(layout, got, expected, seed):
    ranks = harness.same_ranks(got, expected, f"on {layout}: ")
    rounds = random_rounds(seed, len(expected))
    for index, times in enumerate(rounds):
        values = [r[index]["value"] for r in ranks]
        for rank, reports in enumerate(ranks):
            r, want = reports[index], expected[rank][index]
            device = want["device"]
            if _close(r["value"], want["value"]) and not tensors_given(r, device)["device"]:
                continue
            per_node = want["per_node"]
            node = times[rank // per_node * per_node:(rank // per_node + 1) * per_node]
            if per_node < len(times) and _close(r["value"], max(node)) and not tensors_given(r, device)["device"]:
                raise harness.ExerciseFailure(
                    f"on {layout}: rank {rank} returned {r['shown']}, the largest time of ITS node's "
                    f"{per_node} processes ({node}), but the ranks' step times are {times}: every step "
                    f"waits for the slowest rank of the whole run, {max(times)}; all_reduce with "
                    f"op='MAX' over every rank {harness.replay(seed)}")
            problem = explain_slowest(rank, r, values, times, device) or \
                harness.difference(want["value"], r["value"], rtol=1e-6)
            raise harness.ExerciseFailure(f"on {layout}: {problem} {harness.replay(seed)}")


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# The timer's run is judged on what it measured (the steps, fetches and handlers of that
# run, and what the probe saw the timer count): the reference's timer is not run for it.

TIMER, SLOWEST = "the timer on a trainer", "the slowest time on 2 processes"
RANDOM_LAYOUTS = [harness.LAYOUTS[2], harness.LAYOUTS[3], harness.LAYOUTS[0]]
RANDOM = [f"the slowest of random times on {layout[0]}" for layout in RANDOM_LAYOUTS]
PARTS = (TIMER, SLOWEST, *RANDOM)


def collect(part, whos, seed):
    """``{who: data}`` for one part of the check: the timer's run (the learner's only), or
    what each rank's answer gave."""
    harness.preload_for("05", whos)
    if part == TIMER:
        return {who: run_timer(harness.load("05")) if who == harness.LEARNER else None for who in whos}
    if part == SLOWEST:
        return harness.by_who(harness.run_ranks(on_rank, whos), whos)
    layout = RANDOM_LAYOUTS[RANDOM.index(part)]
    return harness.by_who(harness.run_layouts(on_rank_random, seed, whos, layouts=[layout])[layout[0]], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    if part == TIMER:
        judge_timer(got)
    elif part == SLOWEST:
        judge_slowest(got, expected)
    else:
        judge_random(part[len("the slowest of random times on "):], got, expected, seed)
