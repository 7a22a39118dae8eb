"""Checks for exercise 12: the learner's tensor-parallel MLP and the reference solution's,
run side by side on the same random inputs in every layout (1 process with no process
group, 2 and 3 processes, 2 nodes x 2 processes), compared entry by entry; and what each
rank handed to its collectives (recorded by wrapping ``torch.distributed``).

In two halves (harness.py, "a check in two halves"): the ranks collect each answer's output
and its record as plain data; the judge rebuilds the inputs, each rank's partial output and
the replayed mistakes from the seed, and takes where each rank ran and the right output from
the reference's data."""
import sys

import pytest
import torch
import torch.nn.functional as F

import harness

pytestmark = pytest.mark.ex12

# HIDDEN divides by every world size of the layouts (1, 2, 3, 4): the task's split is
# hidden // N units per rank
BATCH, D_IN, HIDDEN, D_OUT = 8, 5, 24, 7  # hidden // N is never D_OUT
# The learner's output against the reference's: the same products in the same order give
# the same bits; a different order of the same sum differs by about 1e-7 relative. One
# term of the sum is about 1: a sum in bfloat16, a unit dropped or counted twice is far
# outside.
RTOL, ATOL = 1e-5, 1e-5


def weights(seed):
    """Random inputs (seeded: replayable); float32 values that bfloat16 cannot hold."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, D_IN, generator=g) * 3
    w1, b1 = torch.randn(HIDDEN, D_IN, generator=g), torch.randn(HIDDEN, generator=g)
    w2, b2 = torch.randn(D_OUT, HIDDEN, generator=g), torch.randn(D_OUT, generator=g)
    return x, w1, b1, w2, b2


def mlp(x, w1, b1, w2, b2):
    """The whole MLP in one process."""
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def on_rank(seed, whos):
    """What each answer in ``whos`` gives this rank on the seeded inputs: its output and
    what it handed ``torch.distributed``; and where the rank runs (the reference's data
    says that to the judge)."""
    import ignite.distributed as idist

    inputs, found = weights(seed), {}
    # the reference first: an answer that leaves a transfer unmatched cannot spoil its run
    for who in sorted(whos, key=lambda w: w != harness.REFERENCE):
        ex = harness.answer("12", who)
        with torch.no_grad(), harness.Recorder() as record:
            out = ex.tensor_parallel_mlp(*[t.clone() for t in inputs])
        found[who] = {"out": harness.plain(out), "log": record.data(), "device": str(idist.device())}
    return found


def rebuilt(got, expected, seed):
    """Per rank, what :func:`judge_layout` judges: the learner's output and calls, and what
    the check rebuilds from ``seed`` and the reference's data (where the rank ran, its
    output); nothing else of the learner's data."""
    n = len(expected)
    inputs = weights(seed)
    x, w1, b1, w2, b2 = inputs
    size, whole, ranks = HIDDEN // n, mlp(*inputs), []
    for rank, (g, e) in enumerate(zip(harness.same_ranks(got, expected), expected)):
        mine = slice(rank * size, (rank + 1) * size)
        partial = F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine])
        ranks.append({"out": g["out"], "log": g["log"], "expected": e["out"], "partial": partial,
                      "whole": whole, "b2": b2, "world_size": n, "device": e["device"],
                      "inputs": inputs})
    return ranks


def close(a, b):
    return harness.difference(b, a, RTOL, ATOL) is None


def rows_differ_by_a_constant(a, b):
    """a − b is the same vector in every row: they differ by a bias at most."""
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    d = a - b
    return torch.allclose(d, d[:1].expand_as(d), rtol=RTOL, atol=ATOL)


def judge_layout(layout, ranks, seed):
    """Raise the learner's message for the first thing wrong in this layout."""
    n = ranks[0]["world_size"]
    where = f"on {layout}"
    for rank, r in enumerate(ranks):
        out = r["out"]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (BATCH, D_OUT):
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} returned {harness.describe(out)}: return the MLP's whole output, a "
                f"tensor of shape ({BATCH}, {D_OUT}), on every rank (the all-reduce of the partial outputs "
                f"gives it)")
    for rank, r in enumerate(ranks):
        log = [c for c in r["log"] if c["op"] != "wait"]
        wrong_device = harness.on_device(log, r["device"])
        if wrong_device:
            raise harness.ExerciseFailure(f"{where}, rank {rank}: {wrong_device}")
        calls = [(c["op"], c["shapes"][0] if c["shapes"] else ()) for c in log]
        hidden_shaped = [(op, shape) for op, shape in calls if shape in ((BATCH, HIDDEN // n), (BATCH, HIDDEN))]
        if hidden_shaped and n > 1:
            op, shape = hidden_shaped[0]
            did = "all-reduced" if op == "all_reduce" else f"handed {op} (one of {len(calls)} call(s))"
            whole = shape == (BATCH, HIDDEN) and HIDDEN // n != HIDDEN
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} {did} a tensor of shape {shape}: the hidden activations after the column "
                f"layer{', all of them' if whole else ''}. Each rank's slice of them is complete on its own "
                f"(other hidden units on each rank, ReLU acting unit by unit): "
                + ("nothing needs to travel between the two layers, and assembling the whole hidden layer on every "
                   "rank undoes the split. " if whole or op != "all_reduce" else "summing them mixes different units. ")
                + f"The one collective needed is an all-reduce (a sum) of the row layer's partial outputs, shape "
                f"({BATCH}, {D_OUT})")
        if n == 1:
            continue  # one process: its partial output is the whole; a collective is optional
        if not calls:
            if close(r["out"], r["whole"]):
                raise harness.ExerciseFailure(
                    f"{where}, rank {rank} computed the right output without any collective: it used the "
                    f"whole weights, so nothing was split. Use only this rank's hidden units (rows "
                    f"{rank * (HIDDEN // n)}..{(rank + 1) * (HIDDEN // n) - 1} of w1 and b1, the same columns "
                    f"of w2) and sum the partial outputs with one all-reduce")
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} returned its own partial output: no all-reduce. Each rank's product "
                f"covers only its hidden units, a partial sum of the output: add the ranks' partial outputs "
                f"with dist.all_reduce (a sum) before returning")
        if len(calls) > 1 or calls[0][0] != "all_reduce":
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} made {len(calls)} call(s) of torch.distributed, {calls}: the split "
                f"needs exactly one all-reduce (a sum) of the partial outputs, shape ({BATCH}, {D_OUT})")
        sent = log[0]["copy"]
        if sent.dtype != torch.float32:
            lower = torch.finfo(sent.dtype).bits < 32 if sent.is_floating_point() else True
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} all-reduced a {sent.dtype} tensor: the inputs are float32, and "
                + ("a sum in lower precision loses digits the MLP's own output has. Reduce the partial output as "
                   "it is" if lower else
                   f"the output must be float32 too: a {sent.dtype} sum sends twice the bytes and returns "
                   f"another type than the MLP's. Compute in the inputs' precision"))
        if not rows_differ_by_a_constant(sent, r["partial"]):
            lo, hi = rank * (HIDDEN // n), (rank + 1) * (HIDDEN // n)
            x, w1, b1, w2, b2 = r["inputs"]
            slips = [(F.linear(F.linear(x, w1[lo:hi], b1[lo:hi]), w2[:, lo:hi]),
                      "without the ReLU: apply F.relu to this rank's hidden activations, before the row layer "
                      "(ReLU acts unit by unit, so each rank applies it to its own units)"),
                     (F.linear(F.relu(F.linear(x, w1[lo:hi])), w2[:, lo:hi]),
                      "without b1: the column layer's bias belongs to the hidden units, so each rank adds its "
                      f"slice b1[{lo}:{hi}] before the ReLU")]
            for candidate, what in slips:
                if rows_differ_by_a_constant(sent, candidate):
                    raise harness.ExerciseFailure(
                        f"{where}, rank {rank} all-reduced a partial output that is not the one of its hidden "
                        f"units {lo}..{hi - 1}: it is their product {what} {harness.replay(seed)}")
            centred, want = sent - sent[:1], r["partial"] - r["partial"][:1]  # b2 added or not
            # bfloat16 products: within 1.5% of the partial's scale (300 seeds, 2 to 4 ranks);
            # another slice's partial output: 49% or more
            if centred.shape == want.shape and (centred - want).abs().max() <= 0.05 * want.abs().max():
                raise harness.ExerciseFailure(
                    f"{where}, rank {rank} all-reduced a partial output that is not the one of its hidden units "
                    f"{lo}..{hi - 1}, but close to it: {harness.difference(r['partial'], sent, RTOL, ATOL, 'it')}: "
                    f"the rounding of a lower precision (bfloat16 or float16) somewhere in the products. The "
                    f"inputs are float32: compute in float32 {harness.replay(seed)}")
            found = ""
            for size in sorted({HIDDEN // m for m in (1, 2, 3, 4)}):
                for start in range(0, HIDDEN - size + 1, size):
                    if (start, size) != (lo, hi - lo) and rows_differ_by_a_constant(sent, F.linear(
                            F.relu(F.linear(x, w1[start:start + size], b1[start:start + size])),
                            w2[:, start:start + size])):
                        found = (f" (it is the partial output of hidden units {start}..{start + size - 1}: "
                                 f"{HIDDEN} // {HIDDEN // size} units from {start})")
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} all-reduced a partial output that is not the one of its hidden units "
                f"{lo}..{hi - 1}{found}: relu(x @ w1[{lo}:{hi}].T + b1[{lo}:{hi}]) @ w2[:, {lo}:{hi}].T. Take the "
                f"SAME contiguous slice of hidden units from w1's rows, b1, and w2's columns (the row "
                f"layer's input features are the column layer's output features), r * (hidden // N) "
                f"onwards, with r the GLOBAL rank (idist.get_rank()) and N the world size "
                f"{harness.replay(seed)}")
    for rank, r in enumerate(ranks):
        out, ref, b2 = r["out"], r["expected"], r["b2"]
        differs = harness.difference(ref, out, RTOL, ATOL, what="the output")
        if differs is None:
            continue
        extra = [k for k in range(1, n) if close(out, ref + k * b2)]
        if n > 1 and extra:
            k = extra[0]
            who = "every rank" if k == n - 1 else f"{k + 1} of the {n} ranks (one per node? idist.get_local_rank() is 0 once per node)"
            raise harness.ExerciseFailure(
                f"{where}, rank {rank}'s output is the MLP's plus {k} × b2: {who} added b2 before the "
                f"all-reduce, so the sum counts it {k + 1} times. Add the row layer's bias once: after the "
                f"all-reduce (or on one rank only: global rank 0)")
        if n > 1 and (close(out, (ref - b2) / n + b2) or close(out, ref / n)):
            raise harness.ExerciseFailure(
                f"{where}, rank {rank}'s output is the MLP's divided by {n}: the all-reduce averaged the partial "
                f"outputs. They are parts of one sum (each rank's hidden units contribute their share): "
                f"reduce with a SUM (dist.all_reduce's default), not a mean")
        if close(out, ref - b2):
            raise harness.ExerciseFailure(f"{where}, rank {rank}'s output lacks b2: add the row layer's bias "
                                          f"once, after the all-reduce")
        if close(out, F.relu(ref)):
            raise harness.ExerciseFailure(
                f"{where}, rank {rank}'s output is the MLP's with a ReLU applied to it: the MLP's second layer has "
                f"no activation (y = relu(x @ w1.T + b1) @ w2.T + b2); return the sum plus b2 as it is")
        raise harness.ExerciseFailure(
            f"{where}, rank {rank}: {differs}; expected is the reference solution's output (the unsplit MLP's) "
            f"{harness.replay(seed)}")


def test_split_mlp_equals_the_reference_in_every_layout():
    harness.judge_here(sys.modules[__name__], PARTS, harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.MULTI_FIRST)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` in the layout ``part`` names."""
    harness.preload_for("12", whos)
    layout = harness.MULTI_FIRST[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    judge_layout(part, rebuilt(got, expected, seed), seed)
