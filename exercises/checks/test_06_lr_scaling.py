"""Checks for exercise 06: the learning rate of every iteration, on 1 and on 2 processes."""
import math

import pytest
import torch
from ignite.engine import Engine, Events

import harness

pytestmark = pytest.mark.ex06

BASE_LR = 0.1
WARMUP = 4
TOTAL = 12


def expected_schedule(world_size):
    peak = BASE_LR * world_size
    values = []
    for step in range(TOTAL):
        if step <= WARMUP:
            values.append(peak * step / WARMUP)
        else:
            values.append(peak * (TOTAL - step) / (TOTAL - WARMUP))
    return values


def recorded_schedule():
    """The lr the optimizer holds during each of TOTAL iterations."""
    import ignite.distributed as idist

    ex = harness.load("06")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    scheduler = ex.create_lr_scheduler(optimizer, BASE_LR, WARMUP, TOTAL)
    if not callable(scheduler):
        raise harness.ExerciseFailure(
            f"create_lr_scheduler returned {scheduler!r}: return the ignite scheduler "
            f"(PiecewiseLinear(...)), which the trainer calls at every ITERATION_STARTED")
    seen = []
    trainer = Engine(lambda engine, batch: seen.append(optimizer.param_groups[0]["lr"]))
    trainer.add_event_handler(Events.ITERATION_STARTED, scheduler)
    trainer.run(range(TOTAL), max_epochs=1)
    return {"world_size": idist.get_world_size(), "nproc_per_node": idist.get_nproc_per_node(),
            "lrs": seen}


def explain(result):
    ws, lrs = result["world_size"], result["lrs"]
    want = expected_schedule(ws)
    peak = BASE_LR * ws
    where = f"with {ws} process{'es' if ws > 1 else ''}"
    if all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(lrs, want)):
        return None
    top = max(lrs)
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


def test_one_process_uses_the_base_lr():
    problem = explain(recorded_schedule())
    if problem:
        raise harness.ExerciseFailure(problem)


def test_two_processes_scale_the_lr_and_warm_up():
    for result in harness.run_ranks(recorded_schedule):
        problem = explain(result)
        if problem:
            raise harness.ExerciseFailure(problem)


def test_two_nodes_scale_by_the_world_size():
    # 2 nodes x 2 processes: the world size (4) is not the processes per node (2).
    for rank, result in enumerate(harness.run_nodes(recorded_schedule)):
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
