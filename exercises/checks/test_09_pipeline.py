"""Checks for exercise 09: the gradients of a model cut into 2 stages on 2 processes
against those of the whole model in one process."""
import math

import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex09

MICRO = 4
MICRO_SIZE = 3
HIDDEN = 8


def whole_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, 3))


CUT = 2  # stage 0 = layers [:CUT], stage 1 = layers [CUT:]


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(MICRO * MICRO_SIZE, 5, generator=g)
    y = torch.randint(0, 3, (len(x),), generator=g)
    return x, y


def swapped_pairing_grads():
    """Stage 0's gradients when micro-batch k's output is backpropagated with the gradient
    rank 1 sent for micro-batch n-1-k (gradients received in one order, used in another)."""
    x, y = data()
    model = whole_model()
    xs, ys = x.split(MICRO_SIZE), y.split(MICRO_SIZE)
    act_grads = []
    for xm, ym in zip(xs, ys):
        a = model[:CUT](xm).detach().requires_grad_()
        (nn.functional.cross_entropy(model[CUT:](a), ym) / MICRO).backward()
        act_grads.append(a.grad)
    stage = whole_model()[:CUT]
    for k, xm in enumerate(xs):
        stage(xm).backward(act_grads[MICRO - 1 - k])
    return [p.grad.clone() for p in stage.parameters()]


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("09")
    rank = idist.get_rank()
    x, y = data()
    # The reference: the whole model, the whole batch, one process.
    reference = whole_model()
    loss = nn.functional.cross_entropy(reference(x), y)
    loss.backward()
    stage = whole_model()[:CUT] if rank == 0 else whole_model()[CUT:]
    wanted = (reference[:CUT] if rank == 0 else reference[CUT:]).parameters()
    inputs = list(x.split(MICRO_SIZE)) if rank == 0 else None
    targets = list(y.split(MICRO_SIZE)) if rank == 1 else None
    with harness.Recorder(compute=True) as record:  # its sends, receives and products, in order
        returned = ex.pipeline_step(stage, inputs, targets, (MICRO_SIZE, HIDDEN))
    ops = [(c["op"], c["shapes"][0] if c.get("shapes") else ()) for c in record.log
           if c["op"] not in ("wait",)]
    grads = [None if p.grad is None else p.grad.clone() for p in stage.parameters()]
    if isinstance(returned, torch.Tensor):
        returned = {"tensor": repr(returned)}
    elif not isinstance(returned, (int, float, type(None))):
        returned = {"other": repr(returned)}
    return {"grads": grads, "wanted": [p.grad.clone() for p in wanted], "returned": returned,
            "loss": loss.item(), "ops": ops,
            "swapped": swapped_pairing_grads() if rank == 0 else None}


def flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def check_micro_batches(ops):
    """Rank 0's sends and receives: one activation per micro-batch, and the next forward
    sent before waiting for the previous micro-batch's gradient."""
    sends = [shape for op, shape in ops if op in ("send", "isend")]
    if len(sends) != MICRO or any(shape != (MICRO_SIZE, HIDDEN) for shape in sends):
        shapes = ", ".join(str(shape) for shape in sends[:3]) or "none"
        raise harness.ExerciseFailure(
            f"rank 0 sent {len(sends)} activation tensor{'s' if len(sends) != 1 else ''} of "
            f"shape {shapes} for {MICRO} micro-batches of {MICRO_SIZE} samples: send one per "
            f"micro-batch, of activation_shape ({MICRO_SIZE}, {HIDDEN}). Cut in micro-batches, "
            f"rank 1 starts on the first while rank 0 computes the next; the whole batch at "
            f"once leaves one stage idle while the other works")
    ops = [(op, shape) for op, shape in ops if op != "matmul"]
    order = [op for op, _ in ops]
    if "recv" in order and order.index("recv") < 2:
        raise harness.ExerciseFailure(
            f"rank 0 waited for the gradient of micro-batch 1 before it sent micro-batch 2: "
            f"then the stages never work at the same time (one micro-batch at a time is no "
            f"pipeline). Run the forward of every micro-batch first, sending each, then "
            f"receive the gradients (the GPipe schedule)")


def check_stage_1_starts_early(ops):
    """Rank 1 computes on micro-batch 1 before the last micro-batch has arrived."""
    receives = [i for i, (op, _) in enumerate(ops) if op in ("recv", "irecv")]
    products = [i for i, (op, _) in enumerate(ops) if op == "matmul"]
    if len(receives) == MICRO and products and products[0] > receives[-1]:
        raise harness.ExerciseFailure(
            f"rank 1 received all {MICRO} micro-batches before computing on the first: the gradients are "
            f"right, but the stages never work at the same time (rank 1 idles until rank 0 has sent "
            f"everything). Receive one micro-batch, run its forward and backward, send its gradient back "
            f"(dist.isend: a blocking send would wait for rank 0, still sending), then receive the next")


def test_stage_gradients_equal_the_whole_model():
    ranks = harness.run_ranks(on_rank)
    for rank, r in enumerate(ranks):
        if any(g is None for g in r["grads"]):
            raise harness.ExerciseFailure(
                f"after pipeline_step, stage {rank}'s parameters have no gradient: "
                + ("rank 0 must call out.backward(grad) with the gradient received from rank 1"
                   if rank == 0 else "rank 1 must call backward() on each micro-batch's loss"))
    check_micro_batches(ranks[0]["ops"])
    check_stage_1_starts_early(ranks[1]["ops"])
    for rank, r in enumerate(ranks):
        got, want = flat(r["grads"]), flat(r["wanted"])
        if torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            continue
        ratio = (got.norm() / want.norm()).item()
        if abs(ratio - MICRO) < 0.05 * MICRO:
            why = (f" They are {ratio:.2f}x too large: you did not divide each micro-batch's "
                   f"loss by the number of micro-batches ({MICRO}); their sum is then the "
                   f"batch's mean loss.")
        elif abs(ratio - 1 / MICRO) < 0.05 / MICRO:
            why = (f" They are 1/{MICRO} of them: the gradients were divided by the number of "
                   f"micro-batches twice. Dividing each micro-batch's loss by {MICRO} on rank 1 "
                   f"already scales every gradient behind it, the one rank 1 sends back "
                   f"included; do not scale it again.")
        elif rank == 0 and torch.allclose(got, flat(r["swapped"]), rtol=1e-4, atol=1e-6):
            why = (" They are what you get when micro-batch k's output is backpropagated with "
                   "another micro-batch's gradient: each gradient rank 1 sends back belongs to "
                   "one micro-batch: backpropagate them in the order they were sent (keep the "
                   "outputs in a list, and go through it from the first).")
        else:
            why = (f" Check that each micro-batch's loss is divided by their number ({MICRO}), "
                   f"that every output is backpropagated with the gradient of its own "
                   f"micro-batch, and that rank 1 sends back the gradient of the activations "
                   f"it received (a.grad), not of its parameters.")
        raise harness.ExerciseFailure(
            f"stage {rank} (rank {rank}) has other gradients than the whole model computed "
            f"in one process (largest difference {(got - want).abs().max().item():.3g}).{why}")
    if ranks[0]["returned"] is not None:
        raise harness.ExerciseFailure(
            f"rank 0 returned {ranks[0]['returned']!r}: return None there (the loss lives "
            f"on rank 1)")
    got, want = ranks[1]["returned"], ranks[1]["loss"]
    if isinstance(got, dict) and "tensor" in got:
        raise harness.ExerciseFailure(
            f"rank 1 returned a tensor ({got['tensor']}), not a Python float: return a Python "
            f"float (loss.item()), which also lets go of the autograd graph")
    if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-5):
        raise harness.ExerciseFailure(
            f"rank 1 returned {got!r}, but the mean loss over the whole batch is {want:.6f}: "
            f"return the sum of the micro-batches' (scaled) losses, as a float")
