"""Checks for exercise 06: the learning rate of every iteration, in every layout (1 process
with no process group, 2 and 3 processes, 2 nodes x 2 processes), the learner's scheduler
beside the reference solution's in the same process: on the task's example (whose
mistakes have a name) and on seeded random settings."""
import math
import sys

import pytest
import torch
from ignite.engine import Engine, Events

import harness

pytestmark = pytest.mark.ex06

BASE_LR = 0.1
WARMUP = 4
TOTAL = 12
# The optimizer handed to create_lr_scheduler was made with another lr than base_lr, as a
# real script's may be: a schedule built from the optimizer's lr, or one that never sets
# "lr" (it stays here), shows.
OPTIMIZER_LR = 0.5


def expected_schedule(world_size):
    peak = BASE_LR * world_size
    values = []
    for step in range(TOTAL):
        if step <= WARMUP:
            values.append(peak * step / WARMUP)
        else:
            values.append(peak * (TOTAL - step) / (TOTAL - WARMUP))
    return values


def schedule_of(create, base_lr, warmup, total):
    """The lr the optimizer holds during each of ``total`` iterations, with the scheduler
    ``create`` returns; or the sentence saying why there is none."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=OPTIMIZER_LR)
    scheduler = create(optimizer, base_lr, warmup, total)
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise harness.ExerciseFailure(
            f"create_lr_scheduler returned a {type(scheduler).__name__} (torch.optim.lr_scheduler), not an "
            f"ignite scheduler: the trainer calls an ignite scheduler at every ITERATION_STARTED, and a torch "
            f"scheduler is not one (wrapped in ignite.handlers.LRScheduler it would be, but it multiplies the "
            f"optimizer's own lr, not base_lr): return PiecewiseLinear(optimizer, \"lr\", milestones_values=...)")
    if not callable(scheduler):
        shown = f"{harness.describe(scheduler)} ({scheduler!r})" if isinstance(scheduler, (list, tuple)) \
            else repr(scheduler)
        raise harness.ExerciseFailure(
            f"create_lr_scheduler returned {shown[:300]}: return the ignite scheduler "
            f"(PiecewiseLinear(...)), which the trainer calls at every ITERATION_STARTED")
    seen = []
    trainer = Engine(lambda engine, batch: seen.append(optimizer.param_groups[0]["lr"]))
    trainer.add_event_handler(Events.ITERATION_STARTED, scheduler)
    trainer.run(range(total), max_epochs=1)
    if seen and all(lr == OPTIMIZER_LR for lr in seen):
        raise harness.ExerciseFailure(
            f"the learning rate never changed: it stayed at the optimizer's own {OPTIMIZER_LR} for all "
            f"{total} iterations (create_lr_scheduler(optimizer, base_lr={base_lr}, warmup_iters={warmup}, "
            f"total_iters={total})): the scheduler must set the optimizer's learning rate, param_name \"lr\" "
            f"(the key of optimizer.param_groups)")
    return seen


def random_settings(seed):
    """Seeded settings: a base_lr no binary fraction holds, a warm-up of 1 to 6 steps and
    2 to 9 steps of decay, never the example's 4 and 12, nor its proportion (a warm-up of
    a third of the run, which an answer that writes the example's ratio in would match)."""
    import random

    rng = random.Random(seed)
    # never the task's example (WARMUP, TOTAL): a schedule that hard-codes it shows here
    warmup = rng.choice([w for w in range(1, 7) if w != WARMUP])
    total = rng.choice([t for t in range(warmup + 2, warmup + 10)
                        if t != TOTAL and t // 3 != warmup])
    return round(rng.uniform(0.01, 0.5), 7), warmup, total


def recorded_schedule(seed, whos):
    """Per answer in ``whos``: the schedule of the task's example (BASE_LR, WARMUP, TOTAL) and
    of random settings drawn from ``seed``; and where this rank runs."""
    import ignite.distributed as idist

    settings, found = random_settings(seed), {}
    for who in whos:
        create = harness.answer("06", who).create_lr_scheduler
        found[who] = {"world_size": idist.get_world_size(), "nproc_per_node": idist.get_nproc_per_node(),
                      "settings": settings, "lrs": schedule_of(create, BASE_LR, WARMUP, TOTAL),
                      "random": schedule_of(create, *settings)}
    return found


def merged(got, expected):
    """What :func:`explain` and :func:`against_reference` judge, for each rank: the learner's
    schedules, with where the rank ran and the random settings from the reference's run."""
    return [{"world_size": e["world_size"], "nproc_per_node": e["nproc_per_node"], "lrs": g["lrs"],
             "random": {"settings": e["settings"], "expected": e["random"], "got": g["random"]}}
            for g, e in zip(harness.same_ranks(got, expected), expected)]


def explain(result):
    ws, lrs = result["world_size"], result["lrs"]
    want = expected_schedule(ws)
    peak = BASE_LR * ws
    where = f"with {ws} process{'es' if ws > 1 else ''}"
    if len(lrs) == len(want) and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(lrs, want)):
        return None
    top = max(lrs)
    if math.isclose(top, OPTIMIZER_LR * ws, rel_tol=1e-6) and not math.isclose(top, peak, rel_tol=1e-6):
        return (f"{where} the highest learning rate is {top:g}, the optimizer's own lr ({OPTIMIZER_LR:g}) x "
                f"{ws}: scale base_lr, the argument ({BASE_LR:g}), not the lr the optimizer was created with "
                f"(a script may create it with any), to base_lr x world size = {peak:g}")
    if not math.isclose(top, peak, rel_tol=1e-6):
        factor = top / BASE_LR
        if ws == 1 and factor > 1.5 and math.isclose(factor, round(factor), rel_tol=1e-6):
            return (f"{where} the highest learning rate is {top:g}, base_lr x {round(factor)}: "
                    f"the factor must be the world size, idist.get_world_size() (1 here), not "
                    f"a fixed number, so the same code is right on any number of processes")
        if ws > 1 and math.isclose(top, BASE_LR, rel_tol=1e-6):
            return (f"{where} the highest learning rate is {top:g}, the unscaled base_lr: the "
                    f"global batch is {ws}x larger than on one process, so the linear scaling "
                    f"rule gives base_lr x idist.get_world_size() = {peak:g}")
        return (f"{where} the highest learning rate is {top:g}, but it should be base_lr x "
                f"world size = {BASE_LR:g} x {ws} = {peak:g}")
    if lrs[0] > 1e-9:
        return (f"{where} the first iteration already used lr {lrs[0]:g}: warm up linearly "
                f"from 0 at step 0 to {peak:g} at step {WARMUP}")
    peak_at = lrs.index(top)
    if peak_at != WARMUP:
        return (f"{where} the learning rate peaks at step {peak_at}, but the warm-up should "
                f"reach {peak:g} at step warmup_iters = {WARMUP}")
    for step, (a, b) in enumerate(zip(lrs, want)):
        if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9):
            part = "warm-up" if step < WARMUP else "decay to 0 at step total_iters"
            return (f"{where} the learning rate at step {step} is {a:g}, expected {b:g} "
                    f"(linear {part}); the whole schedule should be "
                    f"{', '.join(f'{v:g}' for v in want)}")
    return f"{where} the schedule has {len(lrs)} steps instead of {TOTAL}"


def against_reference(where, rank, result, seed):
    """The learner's schedule for random settings against the reference's."""
    base_lr, warmup, total = result["random"]["settings"]
    want, got = result["random"]["expected"], result["random"]["got"]
    for step, (a, b) in enumerate(zip(got, want)):
        if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12):
            raise harness.ExerciseFailure(
                f"{where}rank {rank}, create_lr_scheduler(optimizer, base_lr={base_lr}, "
                f"warmup_iters={warmup}, total_iters={total}) with {result['world_size']} "
                f"process(es): the learning rate of iteration {step + 1} (step {step}) is {a:.6g}, "
                f"expected {b:.6g} (the reference solution's: linear from 0 to base_lr x "
                f"world size at step warmup_iters, then to 0 at step total_iters); expected "
                f"schedule {', '.join(f'{v:.4g}' for v in want)}; got {', '.join(f'{v:.4g}' for v in got)} "
                f"{harness.replay(seed)}")
    if len(got) != len(want):
        raise harness.ExerciseFailure(f"{where}rank {rank}: the schedule ran {len(got)} iterations "
                                      f"instead of {len(want)}")


def _in_layout(ranks, where=""):
    for rank, result in enumerate(ranks):
        problem = explain(result)
        if problem:
            raise harness.ExerciseFailure(f"{where}rank {rank}: {problem}" if where else problem)
    for rank, result in enumerate(ranks):
        against_reference(where, rank, result, result["seed"])


def test_one_process_uses_the_base_lr():
    # no process group at all: a plain `python train.py`
    harness.judge_here(sys.modules[__name__], [PARTS[0]], harness.check_seed())


def test_two_processes_scale_the_lr_and_warm_up():
    harness.judge_here(sys.modules[__name__], [PARTS[1]], harness.check_seed())


def test_three_processes_scale_the_lr_and_warm_up():
    harness.judge_here(sys.modules[__name__], [PARTS[2]], harness.check_seed())


def test_two_nodes_scale_by_the_world_size():
    # 2 nodes x 2 processes: the world size (4) is not the processes per node (2).
    harness.judge_here(sys.modules[__name__], [PARTS[3]], harness.check_seed())


def on_two_nodes(ranks):
    for rank, result in enumerate(ranks):
        top = max(result["lrs"]) if result["lrs"] else None
        per_node = result["nproc_per_node"]
        if top is not None and math.isclose(top, BASE_LR * per_node, rel_tol=1e-6):
            raise harness.ExerciseFailure(
                f"on 2 nodes of {per_node} processes each (world size {result['world_size']}), "
                f"rank {rank}'s highest learning rate is {top:g}, base_lr x {per_node}: that "
                f"counts the processes of ONE node (idist.get_nproc_per_node()) or the nodes "
                f"(idist.get_nnodes()), but the global batch grows with EVERY process: scale by "
                f"idist.get_world_size() = {result['world_size']}")
        problem = explain(result)
        if problem:
            raise harness.ExerciseFailure(f"on 2 nodes, rank {rank}: {problem}")
        against_reference("on 2 nodes, ", rank, result, result["seed"])


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.LAYOUTS)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` in the layout ``part`` names."""
    harness.preload_for("06", whos)
    layout = harness.LAYOUTS[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(recorded_schedule, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    ranks = [{**r, "seed": seed} for r in merged(got, expected)]
    index = PARTS.index(part)
    if index == 3:
        on_two_nodes(ranks)
    else:
        _in_layout(ranks, "on 3 processes, " if index == 2 else "")
