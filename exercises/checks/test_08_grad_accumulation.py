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


def reference_weights(world_size, mistake=None):
    """Plain SGD steps on the whole global batch, in one process: the weights after each.

    ``mistake`` replays a known wrong answer instead, so that a learner whose weights match
    it can be told what they did: ``"unscaled"`` (micro-batch losses not divided by their
    number: the gradient is MICRO times the mean's), ``"per_process"`` (divided by the
    number of processes too, which DDP already averages over), ``"not_zeroed"`` (the
    previous step's gradients added in)."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    factor = {"unscaled": MICRO, "per_process": 1 / world_size}.get(mistake, 1)
    after = []
    for step in range(STEPS):
        _, (x, y) = batches(0, world_size, step)
        if mistake != "not_zeroed":
            optimizer.zero_grad()
        (factor * nn.functional.cross_entropy(model(x), y)).backward()
        optimizer.step()
        after.append(harness.flat_weights(model))
    return after


MISTAKES = {
    "unscaled": (f"The update is {float(MICRO):.1f}x too large: you did not divide each "
                 f"micro-batch's loss by the number of micro-batches ({MICRO}), so their sum "
                 f"is {MICRO}x the mean loss instead of the mean."),
    "per_process": ("The update is too small by the number of processes: you divided the loss "
                    "by the world size too, but DDP already AVERAGES the gradients over the "
                    "processes; divide by the number of micro-batches only."),
    "not_zeroed": ("The first step was right, the second was not: the previous step's "
                   "gradients were added in: call optimizer.zero_grad() at the start of every "
                   "step (backward() adds to .grad, it never overwrites it)."),
}


def counting_allreduce(state, bucket):
    """A DDP communication hook: count the exchange, then do DDP's usual all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state["exchanges"] += 1
    return allreduce_hook(None, bucket)


def accumulate(ex, model, rank, world_size, collectives=None):
    """The weights after each accumulated step, and how often each call stepped;
    ``collectives`` (a dict) gets the collectives the learner's code ran itself."""
    from distkit.lessons.sharded import CommCounter

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    stepped = []
    optimizer.register_step_post_hook(lambda *_: stepped.append(1))  # counts optimizer.step()
    after, steps_per_call = [], []
    for step in range(STEPS):
        micro, _ = batches(rank, world_size, step)
        before = len(stepped)
        with CommCounter() as comm:  # the learner's own collectives (DDP's run in its hooks)
            ex.accumulation_step(model, optimizer, nn.CrossEntropyLoss(), micro)
        if collectives is not None:
            for kind, n in comm.calls.items():
                collectives[kind] = collectives.get(kind, 0) + n
        steps_per_call.append(len(stepped) - before)
        after.append(harness.flat_weights(model))
    return after, steps_per_call


def check_steps(steps_per_call, where):
    wrong = [n for n in steps_per_call if n != 1]
    if wrong:
        raise harness.ExerciseFailure(
            f"{where}, optimizer.step() ran {wrong[0]} times in one call of accumulation_step "
            f"for {MICRO} micro-batches: step ONCE, after the last micro-batch's backward "
            f"(stepping after every micro-batch is {MICRO} small steps, not one large one)")


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("08")
    model = idist.auto_model(make_model())  # DistributedDataParallel
    counter = {"exchanges": 0}
    model.register_comm_hook(counter, counting_allreduce)  # before the first backward
    collectives = {}
    weights, steps = accumulate(ex, model, idist.get_rank(), idist.get_world_size(), collectives)
    return {"weights": weights, "steps": steps, "exchanges": counter["exchanges"],
            "collectives": collectives}


def compare(weights, world_size, where):
    """``weights``: the learner's weights after each step."""
    reference = reference_weights(world_size)
    for step, (got, want) in enumerate(zip(weights, reference)):
        diff = (got - want).abs().max().item()
        if diff <= 1e-5:
            continue
        why = ""
        for mistake, explanation in MISTAKES.items():
            if mistake == "per_process" and world_size == 1:
                continue  # the same as the right answer in one process
            replay = reference_weights(world_size, mistake)
            if all((a - b).abs().max().item() <= 1e-5 for a, b in zip(weights, replay)):
                why = " " + explanation
                break
        else:
            before = harness.flat_weights(make_model()) if step == 0 else reference[step - 1]
            if (got - before).abs().max().item() == 0:
                why = (" The weights did not change: call optimizer.step() after the backward "
                       "passes.")
            else:
                why = (" Check that each micro-batch's loss is divided by their number "
                       f"({MICRO}), that the gradients are zeroed once at the start, and that "
                       "every micro-batch of the list is used.")
        raise harness.ExerciseFailure(
            f"{where}, the weights after accumulated step {step + 1} differ from those after "
            f"one step on the whole batch at once (largest difference {diff:.3g}).{why}")


def test_one_process_plain_model():
    ex = harness.load("08")
    where = "in one process, with a plain model"
    try:
        weights, steps = accumulate(ex, make_model(), 0, 1)
    except AttributeError as error:
        if "no_sync" not in str(error):
            raise
        raise harness.ExerciseFailure(
            f"{where}: it has no no_sync() (only DistributedDataParallel has): use "
            f"model.no_sync() only if hasattr(model, \"no_sync\"), else a "
            f"contextlib.nullcontext()") from None
    check_steps(steps, where)
    compare(weights, 1, where)


def test_two_processes_exchange_once_and_match_a_large_batch():
    ranks = harness.run_ranks(on_rank)
    check_steps(ranks[0]["steps"], "with 2 processes")
    diff = (ranks[0]["weights"][-1] - ranks[1]["weights"][-1]).abs().max().item()
    if diff > 1e-6:
        raise harness.ExerciseFailure(
            f"after the steps, rank 0 and rank 1 hold different weights (largest difference "
            f"{diff:.3g}): the gradients were never exchanged; run the LAST micro-batch's "
            f"backward outside model.no_sync(), so DDP all-reduces the accumulated gradients")
    exchanges = ranks[0]["exchanges"] / STEPS
    # DDP's exchange runs dist.all_reduce in its hook too: the rest are the learner's own.
    own = (ranks[0]["collectives"].get("all_reduce", 0) - ranks[0]["exchanges"]) / STEPS
    others = sorted(k for k in ranks[0]["collectives"] if k not in ("all_reduce", "broadcast"))
    if own > 0 or others:
        what = f"{own:g} all_reduce call(s)" if own > 0 else f"{others[0]} calls"
        raise harness.ExerciseFailure(
            f"rank 0 ran {what} of its own per step, beside DDP's {exchanges:g} exchange(s) of "
            f"all the gradients at once (a bucket): DDP already averages the gradients when the "
            f"LAST micro-batch's backward runs outside model.no_sync(); exchanging them again by "
            f"hand, one tensor at a time, sends them twice and much slower. Remove the manual "
            f"all-reduce")
    if exchanges > 1:
        raise harness.ExerciseFailure(
            f"DDP exchanged the gradients {exchanges:g} times per step for {MICRO} "
            f"micro-batches: run the backward of all but the last micro-batch inside "
            f"`with model.no_sync():` so they are exchanged once")
    compare(ranks[0]["weights"], len(ranks), "with 2 processes")
