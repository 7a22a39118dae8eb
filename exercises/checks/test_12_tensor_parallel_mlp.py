"""Checks for exercise 12: an MLP split column-then-row over 2 processes against the
same MLP, unsplit, in one process; and what each rank sent through its collectives."""
import pytest
import torch
import torch.nn.functional as F

import harness

pytestmark = pytest.mark.ex12

BATCH, D_IN, HIDDEN, D_OUT = 8, 5, 20, 6


def weights():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(BATCH, D_IN, generator=g)
    w1, b1 = torch.randn(HIDDEN, D_IN, generator=g), torch.randn(HIDDEN, generator=g)
    w2, b2 = torch.randn(D_OUT, HIDDEN, generator=g), torch.randn(D_OUT, generator=g)
    return x, w1, b1, w2, b2


def mlp(x, w1, b1, w2, b2):
    """The reference: the whole MLP in one process."""
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def recorder(log):
    """A dispatch mode that notes every collective this process issues, with a copy of the
    tensor it was given (before the collective changes it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if "c10d" in name and "wait" not in name and "barrier" not in name:
                first = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
                op = name.split(".")[1].strip("_")  # "c10d.allreduce_.default" -> "allreduce"
                log.append((op, tuple(first.shape), first.detach().clone()))
            return func(*args, **(kwargs or {}))

    return Record()


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("12")
    rank, n = idist.get_rank(), idist.get_world_size()
    x, w1, b1, w2, b2 = weights()
    log = []
    with torch.no_grad(), recorder(log):
        out = ex.tensor_parallel_mlp(x.clone(), w1.clone(), b1.clone(), w2.clone(), b2.clone())
    size = HIDDEN // n
    mine = slice(rank * size, (rank + 1) * size)
    partial = F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine])
    return {"out": out.detach().clone() if isinstance(out, torch.Tensor) else repr(out),
            "log": log, "partial": partial, "reference": mlp(x, w1, b1, w2, b2), "b2": b2,
            "world_size": n}


def close(a, b):
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def rows_differ_by_a_constant(a, b):
    """a − b is the same vector in every row: they differ by a bias at most."""
    d = a - b
    return torch.allclose(d, d[:1].expand_as(d), rtol=1e-4, atol=1e-5)


def test_split_mlp_equals_the_whole_mlp_with_one_all_reduce():
    ranks = harness.run_ranks(on_rank)
    n = ranks[0]["world_size"]
    for rank, r in enumerate(ranks):
        if not isinstance(r["out"], torch.Tensor):
            raise harness.ExerciseFailure(f"rank {rank} returned {r['out'][:200]}, not a tensor: return "
                                          f"the MLP's output, of shape ({BATCH}, {D_OUT})")
        if tuple(r["out"].shape) != (BATCH, D_OUT):
            raise harness.ExerciseFailure(
                f"rank {rank} returned a tensor of shape {tuple(r['out'].shape)}: the MLP's whole output is "
                f"({BATCH}, {D_OUT}) on every rank (the all-reduce of the partial outputs gives it)")
    for rank, r in enumerate(ranks):
        reductions = [(op, shape) for op, shape, _ in r["log"]]
        hidden_shaped = [shape for op, shape in reductions if shape == (BATCH, HIDDEN // n)]
        if hidden_shaped:
            raise harness.ExerciseFailure(
                f"rank {rank} all-reduced a tensor of shape {hidden_shaped[0]}: the hidden activations "
                f"after the column layer. Each rank's slice of them is complete on its own (other hidden "
                f"units on each rank, ReLU acting unit by unit): summing them mixes different units. "
                f"The one sum needed is of the row layer's partial outputs, shape ({BATCH}, {D_OUT})")
        if not reductions:
            if close(r["out"], r["reference"]):
                raise harness.ExerciseFailure(
                    f"rank {rank} computed the right output without any collective: it used the whole "
                    f"weights, so nothing was split. Use only this rank's hidden units "
                    f"(rows {rank * (HIDDEN // n)}..{(rank + 1) * (HIDDEN // n) - 1} of w1 and b1, the same "
                    f"columns of w2) and sum the partial outputs with one all-reduce")
            raise harness.ExerciseFailure(
                f"rank {rank} returned its own partial output: no all-reduce. Each rank's product covers "
                f"only its hidden units, a partial sum of the output: add the ranks' partial outputs with "
                f"dist.all_reduce (a sum) before returning")
        if len(reductions) > 1 or reductions[0][0] != "allreduce":
            raise harness.ExerciseFailure(
                f"rank {rank} issued {len(reductions)} collective(s), {reductions}: the split needs exactly "
                f"one all-reduce (a sum) of the partial outputs, shape ({BATCH}, {D_OUT})")
    for rank, r in enumerate(ranks):
        sent = r["log"][0][2]
        if not rows_differ_by_a_constant(sent, r["partial"]):
            lo, hi = rank * (HIDDEN // n), (rank + 1) * (HIDDEN // n)
            raise harness.ExerciseFailure(
                f"rank {rank} all-reduced a partial output that is not the one of its hidden units "
                f"{lo}..{hi - 1}: relu(x @ w1[{lo}:{hi}].T + b1[{lo}:{hi}]) @ w2[:, {lo}:{hi}].T. Take the "
                f"SAME contiguous slice of hidden units from w1's rows, b1, and w2's columns (the row layer's "
                f"input features are the column layer's output features), r * (hidden // N) onwards")
    for rank, r in enumerate(ranks):
        out, ref, b2 = r["out"], r["reference"], r["b2"]
        if close(out, ref):
            continue
        if close(out, ref + (n - 1) * b2):
            raise harness.ExerciseFailure(
                f"rank {rank}'s output is the MLP's plus {n - 1} × b2: every rank added b2 before the all-reduce, "
                f"so the sum counts it {n} times. Add the row layer's bias once: after the all-reduce (or on "
                f"one rank only)")
        if close(out, (ref - b2) / n + b2) or close(out, ref / n):
            raise harness.ExerciseFailure(
                f"rank {rank}'s output is the MLP's divided by {n}: the all-reduce averaged the partial outputs. "
                f"They are parts of one sum (each rank's hidden units contribute their share): reduce with a "
                f"SUM (dist.all_reduce's default), not a mean")
        if close(out, ref - b2):
            raise harness.ExerciseFailure(f"rank {rank}'s output lacks b2: add the row layer's bias once, after "
                                          f"the all-reduce")
        raise harness.ExerciseFailure(
            f"rank {rank}'s output differs from the unsplit MLP's (largest difference "
            f"{(out - ref).abs().max().item():.3g}): after the all-reduce of the partial outputs, add b2 once")
