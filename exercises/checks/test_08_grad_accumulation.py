"""Checks for exercise 08: the learner's ``accumulation_step`` and the reference solution's,
run side by side in every layout (2 processes, 3 processes, 2 nodes x 2 processes, then 1
process with no process group and a plain model), for several micro-batch counts (4, 1
and 3), on seeded random inputs that bfloat16 cannot hold.

In each rank, for each micro-batch count, both functions take ``STEPS`` steps from the same
random weights on the same micro-batches; the judge takes the same steps with plain SGD on
the WHOLE global batch, in one model with no DDP (what accumulation must equal), rebuilt
from the seed. What is observed while the learner's function runs (sent to the judge as
plain data):

- how often ``optimizer.step()`` ran (a step post-hook);
- how many micro-batches' activations were held at once (a forward hook counts forwards, a
  hook on the output's gradient counts their backward);
- DDP's gradient exchanges (a communication hook that counts them and all-reduces through
  the process group object, so :class:`harness.Recorder` does not see it) and every
  ``torch.distributed`` call of the learner's own (:class:`harness.Recorder`), with the
  devices of its tensors;
- whether ``no_sync()`` was entered and which forwards ran inside it (DDP decides at
  forward time whether a micro-batch's backward exchanges).

The weights after every step must equal the whole-batch steps within a tolerance far below
one sample's share of the update (see ``TOLERANCE``), and bit for bit wherever the
reference solution's are. Known mistakes are named only when the learner's weights match a
replay of them."""
import contextlib
import sys

import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex08

MICRO_COUNTS = (4, 1, 3)  # 4: the docstring's example; 1: no no_sync at all; 3: odd, 1/3 rounds
MICRO_SIZE = 2  # samples per micro-batch: never a micro-batch count
STEPS = 2  # a second step shows gradients left over from the first
D_IN, OUT = 6, 4
LR = 0.1
# The learner's weights against the whole-batch steps: an entry may differ by this fraction
# of the largest entry of the whole-batch update. fp32 adds the same terms in another order
# (micro-batch by micro-batch, rank by rank): the reference solution differed by at most
# 5.4e-7 of it (5 seeds x 4 layouts x 3 counts x 2 steps; docs/exercises.md). One sample's
# own share of the update was never below 1.5e-3 of it (300 seeds, every world size and
# count), rounding to bfloat16 moves it by about 4e-3, a float16 scale of 1/3 by 2.4e-4.
# ``allowed`` asserts that the tolerance stays below every sample's share (one term).
TOLERANCE = 2e-5


def make_model(seed):
    """One linear layer with random float32 weights (not exact in bfloat16)."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Linear(D_IN, OUT)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def global_batch(seed, world_size, count, step):
    """The whole global batch of ``step``: ``world_size * count`` micro-batches."""
    g = torch.Generator().manual_seed(seed * 100 + count * 10 + step)
    n = world_size * count * MICRO_SIZE
    return torch.randn(n, D_IN, generator=g) * 2, torch.randn(n, OUT, generator=g)


def micro_batches(x, y, rank, count, device):
    """This rank's micro-batches: its contiguous part of the global batch."""
    start = rank * count * MICRO_SIZE
    return [(x[i:i + MICRO_SIZE].to(device), y[i:i + MICRO_SIZE].to(device))
            for i in range(start, start + count * MICRO_SIZE, MICRO_SIZE)]


def whole_batch_steps(seed, world_size, count, factor=1.0, zero=True, subset=None):
    """Plain SGD on the whole global batch, in one model with no DDP: the weights after each
    step. ``factor``, ``zero`` and ``subset`` replay known mistakes (the loss multiplied by
    ``factor``; gradients never zeroed; only the samples ``subset(x)`` selects)."""
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    after = []
    for step in range(STEPS):
        x, y = global_batch(seed, world_size, count, step)
        if subset is not None:
            x, y = x[subset(len(x))], y[subset(len(x))]
        if zero:
            optimizer.zero_grad()
        (factor * nn.functional.mse_loss(model(x), y)).backward()
        optimizer.step()
        after.append(harness.flat_weights(model))
    return after


def counting_allreduce(state, bucket):
    """A DDP communication hook: count the exchange, then average as DDP does, through the
    process group itself (not ``dist.all_reduce``, which the Recorder notes as the learner's)."""
    import torch.distributed as dist

    state["exchanges"] += 1
    group = dist.group.WORLD
    tensor = bucket.buffer().div_(group.size())
    return group.allreduce([tensor]).get_future().then(lambda fut: fut.value()[0])


class NoPlainNoSync(Exception):
    pass


class OrderedMSELoss(nn.MSELoss):
    """The loss the check hands the answer. MSE is symmetric, so ``loss_fn(y, model(x))``
    gives the right numbers here and wrong ones with any other loss: this one says so."""

    def forward(self, input, target):
        if target.requires_grad and not input.requires_grad:
            raise harness.ExerciseFailure(
                "loss_fn was called with the targets first and the model's output second: torch's "
                "losses take (output, target); MSE happens to be symmetric, cross_entropy and most "
                "others are not. Call loss_fn with the output first")
        return super().forward(input, target)


def run_steps(fn, seed, count, observe):
    """``STEPS`` calls of ``fn`` (an ``accumulation_step``) from ``make_model(seed)``, DDP-wrapped
    when there is a process group; the weights after each, and (``observe``) what was seen."""
    import ignite.distributed as idist
    import torch.distributed as dist

    rank, world_size, device = idist.get_rank(), idist.get_world_size(), idist.device()
    module = make_model(seed).to(device)
    state = {"exchanges": 0, "entered": 0, "inside": False, "forwards_inside": 0,
             "now": 0, "most": 0, "steps": 0, "rows": 0}
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(module)
        model.register_comm_hook(state, counting_allreduce)
        if observe:
            original = model.no_sync

            @contextlib.contextmanager
            def no_sync():
                state["entered"] += 1
                with original():
                    state["inside"] = True
                    try:
                        yield
                    finally:
                        state["inside"] = False

            model.no_sync = no_sync  # still DDP's, and noted
    else:
        model = module
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def stepped(*_):
        state["steps"] += 1

    def forward_ran(_, inputs, output):
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        state["forwards_inside"] += state["inside"]
        # memory is held per forward: one forward of two micro-batches concatenated holds both
        state["rows"] = max(state["rows"], max((len(t) for t in inputs if isinstance(t, torch.Tensor)), default=0))
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: state.__setitem__("now", state["now"] - 1))

    if observe:
        optimizer.register_step_post_hook(stepped)
        module.register_forward_hook(forward_ran)
    after, calls = [], []
    for step in range(STEPS):
        x, y = global_batch(seed, world_size, count, step)
        mine = micro_batches(x, y, rank, count, device)
        before = dict(state)
        with harness.Recorder() if observe else contextlib.nullcontext() as record:
            try:
                fn(model, optimizer, OrderedMSELoss(), mine)
            except AttributeError as error:
                if observe and world_size == 1 and "no_sync" in str(error):
                    raise NoPlainNoSync() from None
                if "_GeneratorContextManager" in str(error):
                    # the library's words for a context manager entered a second time
                    raise harness.ExerciseFailure(
                        f"rank {rank}, {count} micro-batches: a no_sync() context was entered twice: "
                        f"no_sync() is a context manager, and each one can be entered only once. Use a "
                        f"new one per micro-batch (`with model.no_sync():` inside the loop)") from None
                raise
        after.append(harness.flat_weights(model))
        if observe:
            calls.append({key: state[key] - before[key]
                          for key in ("exchanges", "entered", "forwards_inside", "steps")})
            calls[-1]["held"], calls[-1]["rows"] = state["most"], state["rows"]
            calls[-1]["own"] = [{"op": c["op"], "shapes": [tuple(x) for x in c["shapes"]],
                                 "devices": list(c["devices"])} for c in record.log if c["op"] != "wait"]
            calls[-1]["params on"] = sorted({str(p.device) for p in module.parameters()})
            state["most"] = state["now"] = state["rows"] = 0
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank done with this count before the next DDP is built
    return after, calls


def on_rank(seed, whos):
    """For each micro-batch count, the weights after each step of each answer in ``whos``
    (the reference's first), and what was seen while the learner's ran, as plain data."""
    import ignite.distributed as idist

    rank, world_size = idist.get_rank(), idist.get_world_size()
    found = {who: {"results": [], "world_size": world_size, "device": str(idist.device())} for who in whos}
    for count in MICRO_COUNTS:
        if harness.REFERENCE in whos:
            expected, _ = run_steps(harness.load_reference("08").accumulation_step, seed, count, observe=False)
            found[harness.REFERENCE]["results"].append({"count": count, "got": expected})
        if harness.LEARNER not in whos:
            continue
        try:
            got, calls = run_steps(harness.load("08").accumulation_step, seed, count, observe=True)
        except NoPlainNoSync:
            raise harness.ExerciseFailure(
                f"rank {rank}, with a plain model ({count} micro-batches): it has no no_sync() (only "
                f"DistributedDataParallel has): use model.no_sync() only if hasattr(model, \"no_sync\"), "
                f"else a contextlib.nullcontext()") from None
        found[harness.LEARNER]["results"].append({"count": count, "got": got, "calls": calls})
    return found


# --- judging ----------------------------------------------------------------------------

def allowed(seed, world_size, count, whole):
    """The tolerance of step 1's comparison, asserted below every sample's own share of the
    update (a sample dropped or counted twice must show)."""
    start = harness.flat_weights(make_model(seed))
    update = (whole[0] - start).abs().max().item()
    atol = TOLERANCE * update
    x, y = global_batch(seed, world_size, count, 0)
    model = make_model(seed)
    shares = []
    for i in range(len(x)):  # one sample's contribution to the whole batch's update
        model.zero_grad()
        (nn.functional.mse_loss(model(x[i:i + 1]), y[i:i + 1]) / len(x)).backward()
        shares.append(LR * max(p.grad.abs().max().item() for p in model.parameters()))
    assert atol < min(shares), "check bug: the tolerance is as wide as one sample's share"
    return atol


def replays(seed, world_size, count):
    """Known mistakes, each as (weights after every step, what to tell the learner)."""
    named = [
        (whole_batch_steps(seed, world_size, count, factor=count),
         f"The update is {count}x too large: you did not divide each micro-batch's loss by the number "
         f"of micro-batches ({count}), so their sum is {count}x the mean loss instead of the mean."),
        (whole_batch_steps(seed, world_size, count, zero=False),
         "The first step was right, the second was not: the previous step's gradients were added in: "
         "call optimizer.zero_grad() at the start of every step (backward() adds to .grad, it never "
         "overwrites it)."),
        (whole_batch_steps(seed, world_size, count, factor=1 / count,
                           subset=lambda n: _lasts(n, world_size, count)),
         "Only the LAST micro-batch of each process counted (divided by their number): the gradients "
         "of the others were erased before the step; call optimizer.zero_grad() once, before the loop, "
         "not for every micro-batch."),
    ]
    if world_size > 1:
        named += [
            (whole_batch_steps(seed, world_size, count, factor=1 / world_size),
             f"The update is too small by the number of processes ({world_size}): you divided the loss "
             f"by the world size too, but DDP already AVERAGES the gradients over the processes; divide "
             f"by the number of micro-batches only."),
            (whole_batch_steps(seed, world_size, count, factor=world_size),
             f"The update is {world_size}x too large, the number of processes: DDP AVERAGES the gradients "
             f"over the processes, it does not sum them; divide each micro-batch's loss by the number of "
             f"micro-batches only."),
        ]
    return [(weights, why) for weights, why in named if count > 1 or "micro-batches (" not in why]


def _lasts(n, world_size, count):
    per_rank = count * MICRO_SIZE
    return [i for r in range(world_size) for i in range((r + 1) * per_rank - MICRO_SIZE, (r + 1) * per_rank)]


GRADIENT_SHAPES = {(OUT, D_IN), (OUT,), (OUT * D_IN + OUT,), (OUT * D_IN,)}


def own_calls(call, count, world_size):
    """What the learner's own torch.distributed calls in one call of accumulation_step were,
    and why DDP's one exchange is all it needs."""
    own = call["own"]
    ops = harness.short_list(sorted({c["op"] for c in own}))
    shapes = {s for c in own for s in c["shapes"]}
    made = f"made {len(own)} torch.distributed call(s) of its own in one call of accumulation_step ({ops})"
    exchanged = (f"beside DDP's {call['exchanges']} exchange(s) of all the gradients at once (a bucket)"
                 if world_size > 1 else "with no process group at all")
    if shapes & GRADIENT_SHAPES:
        return (f"{made} on gradient-shaped tensors {harness.short_list(sorted(shapes & GRADIENT_SHAPES))}, "
                f"{exchanged}: DDP already averages the gradients when the LAST micro-batch's backward runs "
                f"outside model.no_sync(); exchanging them again by hand sends them twice and much slower. "
                f"Remove the manual all-reduce")
    return (f"{made}, on tensors of shape(s) {harness.short_list(sorted(shapes)) or 'none'}, {exchanged}: "
            f"the step needs no collective but DDP's exchange of the gradients; each extra one makes every "
            f"rank wait for the others {count} micro-batch(es) at a time (a loss to log can be averaged "
            f"once per epoch, outside the step)")


def ratio_to(got, whole, start):
    """``k`` when the learner's update is ``k`` times the whole batch's (else ``None``)."""
    should, moved = whole - start, got - start
    k = float((moved @ should) / (should @ should))
    return k if torch.allclose(moved, k * should, rtol=1e-3, atol=1e-3 * should.abs().max().item()) else None


def close(a, b, atol):
    return bool(((a - b).abs() <= atol).all())


def merged(got, expected, seed):
    """Per rank, what :func:`judge_layout` judges: the learner's weights and what was seen,
    the reference's weights, and the whole-batch steps rebuilt here from ``seed``; where the
    rank ran is the reference's run's to say."""
    world_size = expected[0]["world_size"]
    whole = {count: whole_batch_steps(seed, world_size, count) for count in MICRO_COUNTS}
    ranks = []
    for g, e in zip(harness.same_ranks(got, expected), expected):
        results = [{"count": count, "got": g["results"][i]["got"], "calls": g["results"][i]["calls"],
                    "expected": e["results"][i]["got"], "whole": whole[count]}
                   for i, count in enumerate(MICRO_COUNTS)]
        ranks.append({"results": results, "world_size": world_size, "device": e["device"]})
    return ranks


def judge_layout(layout, ranks, seed):
    """Raise the learner's message for the first thing wrong in this layout."""
    world_size = ranks[0]["world_size"]
    plural = {1: "micro-batch"}
    for index, count in enumerate(MICRO_COUNTS):
        micro = f"{count} {plural.get(count, 'micro-batches')} per process"
        for rank, r in enumerate(ranks):
            where = f"on {layout}, rank {rank}, {micro}"
            calls = r["results"][index]["calls"]
            for call in calls:
                if call["steps"] != 1:
                    raise harness.ExerciseFailure(
                        f"{where}: optimizer.step() ran {call['steps']} times in one call of "
                        f"accumulation_step: step ONCE, after the last micro-batch's backward (stepping "
                        f"after every micro-batch is {count} small steps, not one large one)")
            for call in calls:
                if call["held"] > 1:
                    raise harness.ExerciseFailure(
                        f"{where}: accumulation_step held the activations of {call['held']} micro-batches "
                        f"at once (their forwards ran before the backward of the first): the point of "
                        f"accumulating is that ONE micro-batch's activations fit in memory; run each "
                        f"micro-batch's backward right after its forward, so its graph is freed before "
                        f"the next forward")
            for call in calls:
                if call["rows"] > MICRO_SIZE:
                    raise harness.ExerciseFailure(
                        f"{where}: a forward ran on {call['rows']} samples at once, but each micro-batch has "
                        f"{MICRO_SIZE}: the activations a forward holds grow with its batch, and the point of "
                        f"accumulating is that ONE micro-batch's fit in memory. Run the model on each "
                        f"micro-batch on its own")
            for call in calls:
                wrong_device = harness.on_device(call["own"], r["device"])
                if wrong_device or call["params on"] != [r["device"]]:
                    raise harness.ExerciseFailure(
                        f"{where}: {wrong_device or 'the model was moved to ' + call['params on'][0]}: "
                        f"the check hands accumulation_step a model and micro-batches on idist.device() "
                        f"({r['device']}); leave them there")
            for call in calls:
                if call["own"]:
                    raise harness.ExerciseFailure(f"{where}: " + own_calls(call, count, world_size))
            if world_size == 1:
                continue
            for call in calls:
                if call["exchanges"] > 1:
                    if call["entered"] == 0:
                        how = (f"run the forward and backward of all but the last micro-batch inside "
                               f"`with model.no_sync():` so they are exchanged once")
                    elif call["forwards_inside"] == 0:
                        how = (f"no_sync() was entered {call['entered']} time(s), but no forward ran inside "
                               f"it: DDP decides at FORWARD time whether a micro-batch's backward exchanges, "
                               f"so put each of those micro-batches' forward AND backward inside "
                               f"`with model.no_sync():`")
                    else:
                        how = (f"only {call['forwards_inside']} of the {count - 1} micro-batches before the "
                               f"last ran their forward inside model.no_sync(); every one but the last must")
                    raise harness.ExerciseFailure(
                        f"{where}: DDP exchanged the gradients {call['exchanges']} times per call for "
                        f"{count} micro-batches: {how}")
        exchanges = [c["exchanges"] for r in ranks for c in r["results"][index]["calls"]]
        after = [r["results"][index]["got"][-1] for r in ranks]
        for rank, weights in enumerate(after):
            if world_size > 1 and not torch.equal(weights, after[0]):
                diff = (weights - after[0]).abs().max().item()
                if max(exchanges) == 0:
                    why = ("the gradients were never exchanged; run the LAST micro-batch's forward and "
                           "backward outside model.no_sync(), so DDP all-reduces the accumulated gradients")
                else:
                    why = ("DDP exchanged them once per call, but not the sum of all the micro-batches: "
                           "it sends what has accumulated by the backward of the micro-batch whose "
                           "forward ran OUTSIDE no_sync(), and what comes after stays local. Make that "
                           "micro-batch the LAST one")
                raise harness.ExerciseFailure(
                    f"on {layout}, {micro}: after the steps, rank {rank} and rank 0 hold different weights "
                    f"(largest difference {diff:.3g}): {why}")
        for rank, r in enumerate(ranks):
            compare(layout, rank, r["results"][index], seed, world_size, micro)


def compare(layout, rank, result, seed, world_size, micro):
    """The learner's weights after each step against the whole-batch steps: bit for bit where
    the reference solution's are equal to them, else within the tolerance."""
    count, got, expected, whole = result["count"], result["got"], result["expected"], result["whole"]
    atol = allowed(seed, world_size, count, whole)
    where = f"on {layout}, rank {rank}, {micro}"
    for step in range(STEPS):
        exact = torch.equal(expected[step], whole[step])
        if torch.equal(got[step], whole[step]) or (not exact and close(got[step], whole[step], atol)):
            continue
        diff = (got[step] - whole[step]).abs().max().item()
        start = harness.flat_weights(make_model(seed)) if step == 0 else whole[step - 1]
        update = (whole[step] - start).abs().max().item()
        why = ""
        for replay, explanation in replays(seed, world_size, count):
            if all(close(a, b, atol) for a, b in zip(got, replay)):
                why = " " + explanation
                break
        else:
            if torch.equal(got[step], harness.flat_weights(make_model(seed)) if step == 0 else got[step - 1]):
                why = " The weights did not change: call optimizer.step() after the backward passes."
            elif diff < 0.05 * update:
                why = (f" The difference is {diff / update:.2g} of the update: about what rounding to "
                       f"bfloat16 (about 4e-3) or float16 (about 5e-4) gives, far more than float32's order "
                       f"of the sums; keep every value in float32 (no autocast, no .half() or .bfloat16(), "
                       f"no scale kept in low precision).")
            elif ratio_to(got[step], whole[step], start) is not None:
                k = ratio_to(got[step], whole[step], start)
                why = (f" The update is {k:.3g}x the whole batch's: the micro-batches' losses must add up to "
                       f"the MEAN loss of this process's batch (divide each by their number, "
                       f"len(micro_batches) = {count} here, not a number written in; nothing else: DDP "
                       f"averages over the {world_size} process(es) itself, and any factor that depends "
                       f"on the layout is wrong in some).")
            else:
                why = (f" Check that each micro-batch's loss is divided by their number ({count}, not a "
                       f"number written in), that the gradients are zeroed once at the start, and that "
                       f"every micro-batch of the list is used once.")
        kind = "bit for bit (the reference solution's are)" if exact else f"within {atol:.2g}"
        raise harness.ExerciseFailure(
            f"{where}: the weights after accumulated step {step + 1} differ from those after one plain "
            f"SGD step on the whole global batch in one process (largest difference {diff:.3g}, the "
            f"update's largest entry {update:.3g}; they must be equal {kind}).{why} "
            f"{harness.replay(seed)}")


def test_accumulation_equals_one_large_step_in_every_layout():
    harness.judge_here(sys.modules[__name__], PARTS, harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.MULTI_FIRST)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` in the layout ``part`` names."""
    harness.preload_for("08", whos)
    layout = harness.MULTI_FIRST[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    judge_layout(part, merged(got, expected, seed), seed)
