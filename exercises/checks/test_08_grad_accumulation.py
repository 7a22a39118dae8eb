"""Checks for exercise 08: two accumulated steps on 2 processes against two plain steps
on the whole global batch, and the number of gradient exchanges DDP made."""
import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex08

MICRO = 4  # micro-batches per process and step
MICRO_SIZE = 2
STEPS = 2


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(rank, world_size, step):
    """This rank's micro-batches for ``step``; the same seed on every rank, so every rank
    can also build the global batch."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(world_size * MICRO * MICRO_SIZE, 6, generator=g)
    y = torch.randint(0, 3, (len(x),), generator=g)
    mine = range(rank * MICRO * MICRO_SIZE, (rank + 1) * MICRO * MICRO_SIZE, MICRO_SIZE)
    return [(x[i:i + MICRO_SIZE], y[i:i + MICRO_SIZE]) for i in mine], (x, y)


def reference_weights(world_size):
    """Plain SGD steps on the whole global batch, in one process: the weights after each."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    after = []
    for step in range(STEPS):
        _, (x, y) = batches(0, world_size, step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        after.append(harness.flat_weights(model))
    return after


def counting_allreduce(state, bucket):
    """A DDP communication hook: count the exchange, then do DDP's usual all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state["exchanges"] += 1
    return allreduce_hook(None, bucket)


def accumulate(ex, model, rank, world_size):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    after = []
    for step in range(STEPS):
        micro, _ = batches(rank, world_size, step)
        ex.accumulation_step(model, optimizer, nn.CrossEntropyLoss(), micro)
        after.append(harness.flat_weights(model))
    return after


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("08")
    model = idist.auto_model(make_model())  # DistributedDataParallel
    counter = {"exchanges": 0}
    model.register_comm_hook(counter, counting_allreduce)  # before the first backward
    weights = accumulate(ex, model, idist.get_rank(), idist.get_world_size())
    return {"weights": weights, "reference": reference_weights(idist.get_world_size()),
            "exchanges": counter["exchanges"]}


def compare(weights, reference, where):
    """``weights`` and ``reference``: the weights after each step."""
    for step, (got, want) in enumerate(zip(weights, reference)):
        diff = (got - want).abs().max().item()
        if diff <= 1e-5:
            continue
        before = harness.flat_weights(make_model()) if step == 0 else reference[step - 1]
        expected = (want - before).norm().item()
        ratio = (got - before).norm().item() / expected if expected > 0 else float("nan")
        why = ""
        if step == 0 and abs(ratio - MICRO) < 0.05 * MICRO:
            why = (f" The update is {ratio:.1f}x too large: divide each micro-batch's loss by "
                   f"the number of micro-batches ({MICRO}), so that their sum is the mean loss.")
        elif step == 0 and ratio < 1e-6:
            why = " The weights did not change: call optimizer.step() after the backward passes."
        elif step > 0:
            why = (" The first step was right: zero the gradients at the start of every step, "
                   "or the previous step's gradients are added in.")
        raise harness.ExerciseFailure(
            f"{where}, the weights after accumulated step {step + 1} differ from those after "
            f"one step on the whole batch at once (largest difference {diff:.3g}).{why}")


def test_one_process_plain_model():
    ex = harness.load("08")
    compare(accumulate(ex, make_model(), 0, 1), reference_weights(1), "in one process")


def test_two_processes_exchange_once_and_match_a_large_batch():
    ranks = harness.run_ranks(on_rank)
    diff = (ranks[0]["weights"][-1] - ranks[1]["weights"][-1]).abs().max().item()
    if diff > 1e-6:
        raise harness.ExerciseFailure(
            f"after the steps, rank 0 and rank 1 hold different weights (largest difference "
            f"{diff:.3g}): the gradients were never exchanged; run the LAST micro-batch's "
            f"backward outside model.no_sync(), so DDP all-reduces the accumulated gradients")
    exchanges = ranks[0]["exchanges"] / STEPS
    if exchanges > 1:
        raise harness.ExerciseFailure(
            f"DDP exchanged the gradients {exchanges:g} times per step for {MICRO} "
            f"micro-batches: run the backward of all but the last micro-batch inside "
            f"`with model.no_sync():` so they are exchanged once")
    compare(ranks[0]["weights"], ranks[0]["reference"], "with 2 processes")
