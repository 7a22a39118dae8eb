"""Checks for exercise 08: two accumulated steps on 2 processes against two plain steps
on the whole global batch in one process, bit for bit, and the number of gradient
exchanges DDP made.

The weights must EQUAL the single-process reference (``torch.equal`` in fp32, as university
autograders for distributed training compare), not merely come close: the check chooses its
model, loss, data and learning rate so that every number on the way is a dyadic rational
with few bits, which fp32 holds exactly, so the order in which the ranks, DDP and the
micro-batches add things up cannot change a single bit. See ``make_model``."""
import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex08

MICRO = 4  # micro-batches per process and step
MICRO_SIZE = 2
STEPS = 2
OUT = 4  # outputs per sample: the MSE's mean divides by MICRO_SIZE * OUT, a power of two
LR = 0.25  # a power of two: the update lr * gradient adds no bits


def make_model(dtype=torch.float32):
    """One linear layer with weights k/8 (k = -4..4). Why not a hidden layer with a Tanh
    and cross-entropy (as this check had): tanh and softmax round (their results have no
    short binary form), and a step's gradient is a sum over the samples that the ranks and
    the micro-batches add up in another order than one process does, so the weights
    differed in the last bits (1.5e-8 after step 1, 3e-8 after step 2, replayed on one
    machine). A product of two trained weights (a second layer) would need about twice the
    bits after one step, more than fp32's 24. Linear in its weights, with integer inputs
    and targets, an MSE over a power-of-two count and a power-of-two learning rate, the
    weights after two steps are multiples of 2**-19 below 2 (measured: 17 fractional bits
    for the right answer, 19 for a replayed mistake), so no product or sum on the way
    needs more than fp32's 24 bits and none rounds, in any order: the same steps in float64
    give the same weights (``reference_weights`` asserts it)."""
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(6, OUT).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-4, 5, p.shape, generator=g) / 8)
    return model


def batches(rank, world_size, step, dtype=torch.float32):
    """This rank's micro-batches for ``step``; the same seed on every rank, so every rank
    can also build the global batch. Integer inputs and targets in -2..2 (see
    ``make_model``)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(-2, 3, (world_size * MICRO * MICRO_SIZE, 6), generator=g).to(dtype)
    y = torch.randint(-2, 3, (len(x), OUT), generator=g).to(dtype)
    mine = range(rank * MICRO * MICRO_SIZE, (rank + 1) * MICRO * MICRO_SIZE, MICRO_SIZE)
    return [(x[i:i + MICRO_SIZE], y[i:i + MICRO_SIZE]) for i in mine], (x, y)


def _plain_steps(world_size, mistake, dtype):
    model = make_model(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    factor = {"unscaled": MICRO, "per_process": 1 / world_size}.get(mistake, 1)
    after = []
    for step in range(STEPS):
        _, (x, y) = batches(0, world_size, step, dtype)
        if mistake != "not_zeroed":
            optimizer.zero_grad()
        (factor * nn.functional.mse_loss(model(x), y)).backward()
        optimizer.step()
        after.append(harness.flat_weights(model))
    return after


def reference_weights(world_size, mistake=None):
    """Plain SGD steps on the whole global batch, in one process: the weights after each.

    ``mistake`` replays a known wrong answer instead, so that a learner whose weights match
    it can be told what they did: ``"unscaled"`` (micro-batch losses not divided by their
    number: the gradient is MICRO times the mean's), ``"per_process"`` (divided by the
    number of processes too, which DDP already averages over), ``"not_zeroed"`` (the
    previous step's gradients added in)."""
    after = _plain_steps(world_size, mistake, torch.float32)
    # The bitwise comparison is fair only if fp32 rounded nothing: the same steps in
    # float64 must give the same numbers (a change of model, data or lr that breaks it
    # fails here, in the check, not in the learner's answer).
    exact = _plain_steps(world_size, mistake, torch.float64)
    assert all(torch.equal(a.double(), b) for a, b in zip(after, exact)), \
        f"check bug: the reference steps ({mistake or 'right'}) are not exact in fp32"
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

    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    stepped = []
    optimizer.register_step_post_hook(lambda *_: stepped.append(1))  # counts optimizer.step()
    # How many micro-batches' activations are held at once: +1 when the layer's forward
    # ran, -1 when the backward reached its output (its graph, and the activations it
    # saved, can then go).
    held = {"now": 0, "most": 0}

    def forward_ran(module, inputs, output):
        held["now"] += 1
        held["most"] = max(held["most"], held["now"])
        if output.requires_grad:
            output.register_hook(lambda grad: held.__setitem__("now", held["now"] - 1))

    getattr(model, "module", model).register_forward_hook(forward_ran)
    after, steps_per_call = [], []
    for step in range(STEPS):
        micro, _ = batches(rank, world_size, step)
        before = len(stepped)
        with CommCounter() as comm:  # the learner's own collectives (DDP's run in its hooks)
            ex.accumulation_step(model, optimizer, nn.MSELoss(), micro)
        if collectives is not None:
            for kind, n in comm.calls.items():
                collectives[kind] = collectives.get(kind, 0) + n
        steps_per_call.append(len(stepped) - before)
        after.append(harness.flat_weights(model))
        if held["most"] > 1:
            raise harness.ExerciseFailure(
                f"accumulation_step held the activations of {held['most']} micro-batches at once (their "
                f"forwards ran before the backward of the first): the point of accumulating is that ONE "
                f"micro-batch's activations fit in memory; run each micro-batch's backward right after its "
                f"forward, so its graph is freed before the next forward")
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
    """``weights``: the learner's weights after each step; they must equal the reference's
    bit for bit (see the module's docstring)."""
    reference = reference_weights(world_size)
    for step, (got, want) in enumerate(zip(weights, reference)):
        if torch.equal(got, want):
            continue
        diff = (got - want).abs().max().item()
        why = ""
        for mistake, explanation in MISTAKES.items():
            if mistake == "per_process" and world_size == 1:
                continue  # the same as the right answer in one process
            replay = reference_weights(world_size, mistake)
            if all(torch.equal(a, b) for a, b in zip(weights, replay)):
                why = " " + explanation
                break
        else:
            before = harness.flat_weights(make_model()) if step == 0 else reference[step - 1]
            if torch.equal(got, before):
                why = (" The weights did not change: call optimizer.step() after the backward "
                       "passes.")
            else:
                why = (" Check that each micro-batch's loss is divided by their number "
                       f"({MICRO}), that the gradients are zeroed once at the start, and that "
                       "every micro-batch of the list is used.")
        raise harness.ExerciseFailure(
            f"{where}, the weights after accumulated step {step + 1} differ from those after "
            f"one step on the whole batch at once in one process (largest difference "
            f"{diff:.3g}; with this check's numbers fp32 is exact, so they must be EQUAL).{why}")


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
    if not torch.equal(ranks[0]["weights"][-1], ranks[1]["weights"][-1]):
        diff = (ranks[0]["weights"][-1] - ranks[1]["weights"][-1]).abs().max().item()
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
