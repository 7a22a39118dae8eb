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
    returned = ex.pipeline_step(stage, inputs, targets, (MICRO_SIZE, HIDDEN))
    grads = [None if p.grad is None else p.grad.clone() for p in stage.parameters()]
    return {"grads": grads, "wanted": [p.grad.clone() for p in wanted],
            "returned": returned if isinstance(returned, (int, float, type(None)))
            else repr(returned),
            "loss": loss.item()}


def test_stage_gradients_equal_the_whole_model():
    ranks = harness.run_ranks(on_rank)
    for rank, r in enumerate(ranks):
        if any(g is None for g in r["grads"]):
            raise harness.ExerciseFailure(
                f"after pipeline_step, stage {rank}'s parameters have no gradient: "
                + ("rank 0 must call out.backward(grad) with the gradient received from rank 1"
                   if rank == 0 else "rank 1 must call backward() on each micro-batch's loss"))
        got = torch.cat([g.reshape(-1) for g in r["grads"]])
        want = torch.cat([g.reshape(-1) for g in r["wanted"]])
        if torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            continue
        ratio = (got.norm() / want.norm()).item()
        why = ""
        if abs(ratio - MICRO) < 0.05 * MICRO:
            why = (f" They are {ratio:.2f}x too large: divide each micro-batch's loss by the "
                   f"number of micro-batches ({MICRO}); their sum is then the batch's mean loss.")
        raise harness.ExerciseFailure(
            f"stage {rank} (rank {rank}) has other gradients than the whole model computed "
            f"in one process (largest difference {(got - want).abs().max().item():.3g}).{why}")
    if ranks[0]["returned"] is not None:
        raise harness.ExerciseFailure(
            f"rank 0 returned {ranks[0]['returned']!r}: return None there (the loss lives "
            f"on rank 1)")
    got, want = ranks[1]["returned"], ranks[1]["loss"]
    if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-5):
        raise harness.ExerciseFailure(
            f"rank 1 returned {got!r}, but the mean loss over the whole batch is {want:.6f}: "
            f"return the sum of the micro-batches' (scaled) losses, as a float")
