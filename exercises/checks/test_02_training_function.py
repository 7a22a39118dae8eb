"""Checks for exercise 02: ``training(local_rank, config)`` on 2 processes.

Each rank trains on a dataset that records which samples it hands out, in which order,
then reports them with its final weights; the judge compares the ranks and the epochs.
The check also notes whether ``idist.auto_optim`` was called (ignite's own function
still runs): on CPUs it returns the optimizer unchanged, so nothing else would show it.

Then each rank calls ``training`` once more for ONE step (one epoch of a dataset that is
exactly one global batch), and rank 0's weights must EQUAL (``torch.equal``, fp32) those
after one step of plain SGD on the whole batch in one process, as university autograders
for distributed training compare. The learner's model (a ReLU MLP) and loss
(``nn.CrossEntropyLoss``) are fixed, and softmax rounds, so only this one step can be
exact: the check gives ``make_model()``'s layers weights k/8 and the LAST layer zeros, so
every logit is 0 and softmax is exactly 1/4; the inputs are integers, the batch 16 and the
lr 1/4, so every product and sum is a short dyadic number and the order in which DDP and
the ranks add up cannot change a bit (the judge asserts the float64 twin gives the same
weights). The zero last layer sends no gradient to the first layer in that step, so the
first layer is compared trivially; the training run before it, over several steps,
compares the ranks with each other, where softmax rounds."""
import copy
import functools
import sys

import pytest
import torch
from distkit.builtin.data import synthetic_dataset
from torch.utils.data.distributed import DistributedSampler

import harness

pytestmark = pytest.mark.ex02

N_SAMPLES = 64
GLOBAL_BATCH = 16
EPOCHS = 3  # enough to see whether the order changes from epoch to epoch


class RecordingDataset(torch.utils.data.Dataset):
    """A learnable 4-class set of 1x4x4 images that notes every index it is asked for."""

    def __init__(self, n=N_SAMPLES, seed=0):
        self.data = synthetic_dataset(n, num_classes=4, shape=(1, 4, 4), noise=0.5, seed=seed)
        self.fetched = []

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return self.data[i]


def full_loss(model, dataset):
    module = getattr(model, "module", model)
    x = dataset.data.images
    y = dataset.data.labels
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(module(x), y).item()


def on_rank(n_samples=None, global_batch=None, exact=None):
    import ignite.distributed as idist

    ex = harness.load("02")
    auto_optim_calls = []
    steps = {"given": 0, "returned": 0}
    real_auto_optim = idist.auto_optim

    def recording_auto_optim(optimizer, **kwargs):
        auto_optim_calls.append(type(optimizer).__name__)
        returned = real_auto_optim(optimizer, **kwargs)
        if returned is optimizer:
            # On TPUs and with Horovod auto_optim returns ANOTHER optimizer, whose step is
            # the distributed one; on CPUs the same object. Hand back a twin (same params,
            # same state) so that the check sees which one the training steps.
            returned = copy.copy(optimizer)
        step = type(optimizer).step
        optimizer.step = functools.partial(_counted_step, step, optimizer, steps, "given")
        returned.step = functools.partial(_counted_step, step, returned, steps, "returned")
        return returned

    set_epoch_calls = []
    real_set_epoch = DistributedSampler.set_epoch

    def recording_set_epoch(sampler, epoch):
        set_epoch_calls.append((plain_number(epoch), sampler.shuffle))
        return real_set_epoch(sampler, epoch)

    # what the loader and the trainer were asked for: a missing shuffle=True only shows
    # in one process, a missing device only on a GPU
    asked = {"shuffle": [], "device": []}
    real_auto_dataloader = idist.auto_dataloader
    import ignite.engine

    real_trainer = ignite.engine.create_supervised_trainer

    def recording_auto_dataloader(dataset, **kwargs):
        asked["shuffle"].append(bool(kwargs.get("shuffle", False)))
        return real_auto_dataloader(dataset, **kwargs)

    def recording_trainer(*args, **kwargs):
        device = kwargs.get("device", args[3] if len(args) > 3 else None)
        asked["device"].append("idist.device()" if device is not None and torch.device(device) ==
                               torch.device(*harness.DeviceStandIn.STAND_IN) else
                               "None" if device is None else repr(str(device)))
        return real_trainer(*args, **kwargs)

    idist.auto_optim = recording_auto_optim
    idist.auto_dataloader = recording_auto_dataloader
    patched_trainer = [m for m in (ignite.engine, ex) if getattr(m, "create_supervised_trainer", None) is real_trainer]
    for module in patched_trainer:
        module.create_supervised_trainer = recording_trainer
    DistributedSampler.set_epoch = recording_set_epoch
    dataset = RecordingDataset(n_samples or N_SAMPLES)
    torch.manual_seed(0)
    initial_loss = full_loss(ex.make_model(), dataset)
    config = {"dataset": dataset, "batch_size": global_batch or GLOBAL_BATCH, "lr": 0.2, "epochs": EPOCHS}
    try:
        with harness.DeviceStandIn():  # idist.device() told apart from a device named by hand
            returned = ex.training(idist.get_local_rank(), config)
    finally:
        idist.auto_optim = real_auto_optim
        idist.auto_dataloader = real_auto_dataloader
        for module in patched_trainer:
            module.create_supervised_trainer = real_trainer
        DistributedSampler.set_epoch = real_set_epoch
    check_returned(returned)
    model, loader = returned
    return {
        "exact_step": exact_step(ex, idist.get_local_rank(), exact or EXACT_BATCH),
        "fetched": list(dataset.fetched),
        "batch_size": getattr(loader, "batch_size", None),
        "weights": harness.flat_weights(model),
        "wrapped": type(model).__name__,
        "initial_loss": initial_loss,
        "final_loss": full_loss(model, dataset),
        "auto_optim": auto_optim_calls,
        "steps": steps,
        "set_epoch": set_epoch_calls,
        "asked": asked,
    }


def plain_number(value):
    """``value`` as data any process can read back: a number or tensor as it is (numpy's as
    the number it is), anything else as its text."""
    import numbers

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().as_subclass(torch.Tensor)
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return value if isinstance(value, (bool, str, type(None))) else repr(value)
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def check_returned(returned):
    """The learner's message unless ``returned`` is ``(model, train_loader)``."""
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        model, loader = returned
        if isinstance(model, torch.nn.Module) and isinstance(loader, torch.utils.data.DataLoader):
            return
        if isinstance(loader, torch.nn.Module) and isinstance(model, torch.utils.data.DataLoader):
            raise harness.ExerciseFailure(
                f"training returned (train_loader, model): return them in the order the task asks, "
                f"(model, train_loader)")
        what = f"({type(model).__name__}, {type(loader).__name__})"
    elif isinstance(returned, torch.nn.Module):
        what = f"the model alone (a {type(returned).__name__})"
    else:
        what = harness.describe(returned)
    raise harness.ExerciseFailure(
        f"training returned {what}: return the pair (model, train_loader), the model idist.auto_model "
        f"returned and the loader idist.auto_dataloader returned, after trainer.run")


def _counted_step(step, optimizer, steps, which, *args, **kwargs):
    steps[which] += 1
    return step(optimizer, *args, **kwargs)


EXACT_LR = 0.25  # a power of two: lr * gradient adds no bits
EXACT_BATCH = 16  # one global batch, 8 per rank: the means divide by powers of two


def dyadic(model):
    """``model`` with every weight k/8 (k = -4..4) and its last linear layer zero, so that
    one step of SGD with cross-entropy is exact in fp32 (see the module's docstring)."""
    g = torch.Generator().manual_seed(0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-4, 5, p.shape, generator=g) / 8)
        for p in linears[-1].parameters():
            p.zero_()
    return model


def exact_data(batch=EXACT_BATCH):
    """Integer images in -2..2 and 4 balanced classes: one global batch."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-2, 3, (batch, 1, 4, 4), generator=g).float()
    return torch.utils.data.TensorDataset(x, torch.arange(batch) % 4)


def exact_step(ex, local_rank, batch=EXACT_BATCH):
    """Rank's weights after ``training`` ran one step on ``exact_data`` from ``dyadic``
    weights (``make_model`` is swapped for the run; ``training`` looks it up at call
    time), and the weights it started from."""
    given = ex.make_model
    start = []

    def make_model():
        model = dyadic(given())
        start.append(harness.flat_weights(model))
        return model

    ex.make_model = make_model
    try:
        config = {"dataset": exact_data(batch), "batch_size": batch, "lr": EXACT_LR,
                  "epochs": 1}
        returned = ex.training(local_rank, config)
    finally:
        ex.make_model = given
    check_returned(returned)
    model = returned[0]
    return {"after": harness.flat_weights(model), "start": start[0] if start else None}


def one_process_step(make_model, dtype, batch=EXACT_BATCH):
    """The reference: one step of plain SGD on the whole batch, in one process."""
    model = dyadic(make_model()).to(dtype)
    x, y = exact_data(batch).tensors
    optimizer = torch.optim.SGD(model.parameters(), lr=EXACT_LR)
    torch.nn.functional.cross_entropy(model(x.to(dtype)), y).backward()
    optimizer.step()
    return harness.flat_weights(model)


def compare_with_one_process(r, world_size, reference, batch=EXACT_BATCH, rtol=0.0):
    """Rank 0's weights after the exact step against the one-process reference
    (``reference``: :func:`one_process_step` of the reference's ``make_model`` in float32
    and in float64)."""
    where = (f"after ONE step of training on {world_size} processes (epochs=1, a dataset of "
             f"exactly one global batch of {batch}, lr={EXACT_LR})")
    if r["start"] is None:
        raise harness.ExerciseFailure(
            f"{where}, training never called make_model(): build the model with it and wrap it "
            f"with idist.auto_model")
    want = reference["float32"]
    # The bitwise comparison is fair only if fp32 rounded nothing: the float64 twin must
    # give the same numbers (a change of model or data that breaks it fails here). With 3
    # processes the mean divides by 3, which rounds: there a tolerance of a few float32
    # roundings (rtol) replaces equality.
    assert rtol or torch.equal(want.double(), reference["float64"]), \
        "check bug: the one-process reference step is not exact in fp32"
    got, start = r["after"], r["start"]
    if got.shape != want.shape or start.shape != want.shape:
        raise harness.ExerciseFailure(
            f"{where}, rank 0's model has {got.numel()} weights, the given make_model()'s {want.numel()}: "
            f"make_model() is given, do not change it")
    if torch.equal(got, want) or (rtol and torch.allclose(got, want, rtol=rtol, atol=rtol)):
        return
    moved, should = got - start, want - start  # exact: short dyadic numbers
    if torch.equal(got, start):
        raise harness.ExerciseFailure(
            f"{where}, rank 0's weights did not change: the optimizer must be built on "
            f"model.parameters() of the model idist.auto_model returned, and the trainer must "
            f"step it")
    i = int(should.abs().argmax())
    ratio = (moved[i] / should[i]).item()
    named = {
        float(world_size): (
            f"you scaled the learning rate by the world size ({world_size}), or summed the "
            f"ranks' gradients instead of averaging them. config['lr'] is the learning rate "
            f"for the GLOBAL batch, and DDP's averaged gradient already equals the whole "
            f"batch's: use lr=config['lr'] as it is"),
        1 / world_size: (
            f"you divided the learning rate (or the loss) by the world size ({world_size}), "
            f"but DDP already AVERAGES the gradients over the processes: use lr=config['lr'] "
            f"and nn.CrossEntropyLoss() as they are"),
        float(batch // world_size): (
            f"the loss is SUMMED over the {batch // world_size} samples of each rank's "
            f"batch, not averaged: use nn.CrossEntropyLoss() (reduction='mean')"),
    }
    diff = (got - want).abs().max().item()
    if torch.allclose(moved, ratio * should, rtol=1e-5, atol=1e-9):
        why = named.get(ratio, "use lr=config['lr'] and nn.CrossEntropyLoss() as they are")
        raise harness.ExerciseFailure(
            f"{where}, rank 0's step is {ratio:g}x the one plain SGD takes on the whole batch "
            f"in one process: {why}")
    raise harness.ExerciseFailure(
        f"{where}, rank 0's weights differ from those after one step of plain SGD on the "
        f"whole batch in one process (largest difference {diff:.3g}; with these numbers "
        f"fp32 is exact, so they must be EQUAL): every sample of the global batch must count "
        f"once, through idist.auto_dataloader, idist.auto_model, "
        f"SGD(model.parameters(), lr=config['lr']) and nn.CrossEntropyLoss()")


def check_batch_per_rank(ranks, global_batch, where=""):
    """Every rank's loader takes the global batch divided by the world size."""
    world = len(ranks)
    for rank, r in enumerate(ranks):
        if r["batch_size"] != global_batch // world:
            raise harness.ExerciseFailure(
                f"{where}rank {rank}'s loader takes {r['batch_size']} samples per step, but a GLOBAL "
                f"batch of {global_batch} over {world} process{'es' if world > 1 else ''} is "
                f"{global_batch // world} each: pass the global batch size to "
                f"idist.auto_dataloader, which divides it by the world size itself")


def check_what_was_asked(ranks):
    """What the right samples and weights on a CPU do not show: the sampler's epochs, the
    shuffle of one plain process, the trainer's device."""
    for rank, r in enumerate(ranks):
        epochs = [e for e, _ in r["set_epoch"]]
        if epochs and epochs[:EPOCHS] != list(range(EPOCHS)):
            raise harness.ExerciseFailure(
                f"rank {rank} called set_epoch with {harness.short_list(epochs)} at the starts of epochs "
                f"1 to {EPOCHS}: the sampler counts epochs from 0, ignite's engine.state.epoch from 1, so "
                f"the first epoch must draw the sampler's epoch 0 (a resumed run, or another script "
                f"with the same seed, would otherwise read other orders than a plain sampler)")
        if r["asked"]["shuffle"] and not any(r["asked"]["shuffle"]):
            raise harness.ExerciseFailure(
                f"rank {rank} called idist.auto_dataloader without shuffle=True: with several processes "
                f"its DistributedSampler shuffles anyway, but in one plain process (no sampler) the loader "
                f"then reads the samples in the same order every epoch. Pass shuffle=True")
        wrong = [d for d in r["asked"]["device"] if d != "idist.device()"]
        if wrong:
            given = "no device" if wrong[0] == "None" else f"device={wrong[0]}, named by hand"
            raise harness.ExerciseFailure(
                f"rank {rank} gave create_supervised_trainer {given}, not idist.device(): it is where "
                f"the trainer moves each batch. Here that is the CPU either way, but on a GPU (nccl) the "
                f"batches would stay on the CPU while the model is on the GPU, and the first step fails "
                f"there. Pass device=idist.device()")


def check_replicas_equal(ranks, layout):
    for rank, r in enumerate(ranks):
        diff = (r["weights"] - ranks[0]["weights"]).abs().max().item()
        if diff > 1e-5:
            raise harness.ExerciseFailure(
                f"on {layout}, after training rank {rank} and rank 0 hold different weights (largest "
                f"difference {diff:.3g}): wrap the model with idist.auto_model")


def test_training_shards_data_and_keeps_replicas_equal():
    harness.judge_here(sys.modules[__name__], [TWO], harness.check_seed())


def judge_two_processes(ranks, reference):
    """2 processes (started by ``idist.Parallel``): the shards, the reshuffle, what was asked of
    ignite, the replicas, the optimizer, the exact step, and that the model learned."""
    per_rank = N_SAMPLES // len(ranks)
    check_batch_per_rank(ranks, GLOBAL_BATCH)
    for epoch in range(EPOCHS):
        seen = [set(r["fetched"][epoch * per_rank:(epoch + 1) * per_rank]) for r in ranks]
        both = sorted(seen[0] & seen[1])
        if both:
            raise harness.ExerciseFailure(
                f"rank 0 and rank 1 both trained on sample {both[0]} in epoch {epoch + 1} "
                f"({len(both)} samples in common): build the loader with idist.auto_dataloader "
                f"so that each process reads its own shard")
    for rank, r in enumerate(ranks):
        if len(r["fetched"]) != EPOCHS * per_rank:
            raise harness.ExerciseFailure(
                f"rank {rank} read {len(r['fetched'])} samples in {EPOCHS} epochs of a "
                f"{N_SAMPLES}-sample dataset, but with {len(ranks)} processes each should read "
                f"{per_rank} per epoch ({EPOCHS * per_rank} in all): give each process its own "
                f"shard with idist.auto_dataloader, and train for config['epochs'] epochs")
    for rank, r in enumerate(ranks):
        orders = [r["fetched"][e * per_rank:(e + 1) * per_rank] for e in range(EPOCHS)]
        repeats = [e + 1 for e in range(1, EPOCHS) if orders[e] == orders[e - 1]]
        if repeats and r["set_epoch"] and not any(shuffle for _, shuffle in r["set_epoch"]):
            raise harness.ExerciseFailure(
                f"rank {rank} read the same samples in the same order in epochs "
                f"{repeats[0] - 1} and {repeats[0]} ({harness.short_list(orders[0], 5)}), although "
                f"set_epoch was called: the sampler never shuffles. Pass shuffle=True to "
                f"idist.auto_dataloader (its DistributedSampler then draws a new permutation "
                f"every epoch)")
        if repeats:
            raise harness.ExerciseFailure(
                f"rank {rank} read the same samples in the same order in epochs "
                f"{repeats[0] - 1} and {repeats[0]} ({harness.short_list(orders[0], 5)}): the "
                f"DistributedSampler of auto_dataloader shuffles with seed + epoch, and ignite's "
                f"Engine never tells it the epoch; add a handler on Events.EPOCH_STARTED that "
                f"calls the sampler's set_epoch with the epoch, counted from 0")
    check_what_was_asked(ranks)
    diff = (ranks[0]["weights"] - ranks[1]["weights"]).abs().max().item()
    if diff > 1e-5:
        raise harness.ExerciseFailure(
            f"after training, rank 0 and rank 1 hold different weights (largest difference "
            f"{diff:.3g}; the model is a {ranks[0]['wrapped']}): wrap it with idist.auto_model "
            f"so that DistributedDataParallel averages the gradients and the replicas stay equal")
    for rank, r in enumerate(ranks):
        if not r["auto_optim"]:
            raise harness.ExerciseFailure(
                f"rank {rank} never called idist.auto_optim: wrap the optimizer with it. On "
                f"CPUs and GPUs it returns the optimizer unchanged, but on TPUs and with Horovod "
                f"it makes the step distributed, and the same training function must run there")
        if r["auto_optim"][0] != "SGD":
            raise harness.ExerciseFailure(
                f"rank {rank} built a {r['auto_optim'][0]} optimizer: the task asks for "
                f"torch.optim.SGD(model.parameters(), lr=config['lr'])")
    for rank, r in enumerate(ranks):
        if r["steps"]["returned"] == 0 and r["steps"]["given"] == 0:
            raise harness.ExerciseFailure(
                f"on rank {rank} the optimizer idist.auto_optim returned never stepped: the "
                f"trainer stepped another optimizer. Give the trainer the one auto_optim "
                f"returned: optimizer = idist.auto_optim(torch.optim.SGD(...))")
        if r["steps"]["returned"] == 0 and r["steps"]["given"] > 0:
            raise harness.ExerciseFailure(
                f"on rank {rank} the optimizer that stepped is the one you passed to "
                f"idist.auto_optim, not the one it returned: on TPUs and with Horovod auto_optim "
                f"returns a new optimizer whose step is the distributed one. Use what it returns: "
                f"optimizer = idist.auto_optim(torch.optim.SGD(...)), and give THAT to the trainer")
    compare_with_one_process(ranks[0]["exact_step"], len(ranks), reference)
    r = ranks[0]
    if not r["final_loss"] < 0.8 * r["initial_loss"]:
        raise harness.ExerciseFailure(
            f"the model did not learn: loss {r['initial_loss']:.3f} before training, "
            f"{r['final_loss']:.3f} after; build the optimizer on model.parameters() of the "
            f"model idist.auto_model returned, and run the trainer")


def test_one_process_and_two_nodes_train_like_one_process():
    """The same training function with no process group at all (a plain `python train.py`)
    and on 2 nodes x 2 processes (world size 4, 2 per node, local ranks 0 1 0 1): the
    batch per process, replicas equal, and the exact step equal to one process's."""
    harness.judge_here(sys.modules[__name__], [NODES, ONE], harness.check_seed())


def judge_like_one_process(layout, ranks, reference):
    check_batch_per_rank(ranks, GLOBAL_BATCH, f"on {layout}, ")
    check_replicas_equal(ranks, layout)
    try:
        compare_with_one_process(ranks[0]["exact_step"], len(ranks), reference)
    except harness.ExerciseFailure as failure:
        raise harness.ExerciseFailure(f"on {layout}: {failure}") from None


# 3 processes: 64 samples (not a multiple of 3: DistributedSampler pads them to 66, 22 per
# process, so that no sample is left out), in global batches of 24 (8 per process: 8, 8 and
# a last batch of 6); the exact step on a dataset of one global batch of 24.
THREE = {"n_samples": 64, "global_batch": 24, "exact": 24}


def test_three_processes_train_like_one_process():
    """3 processes on a dataset that does not divide by them: every rank reads its padded
    share every epoch, together every sample; the step is compared with one process's within
    float32 rounding (the mean over 3 ranks rounds)."""
    harness.judge_here(sys.modules[__name__], [THREE_PROCESSES], harness.check_seed())


def judge_three_processes(ranks, reference):
    layout = harness.LAYOUTS[2]
    world, batch, n = len(ranks), THREE["global_batch"], THREE["n_samples"]
    per_rank = -(-n // world)  # DistributedSampler's share, padded
    padding = per_rank * world - n
    where = f"on {layout[0]}, {n} samples (not a multiple of {world}), global batches of {batch}"
    check_batch_per_rank(ranks, batch, f"on {layout[0]}, ")
    for rank, r in enumerate(ranks):
        if len(r["fetched"]) != EPOCHS * per_rank:
            raise harness.ExerciseFailure(
                f"{where}: rank {rank} read {len(r['fetched'])} samples in {EPOCHS} epochs, but each rank "
                f"should read {per_rank} per epoch ({EPOCHS * per_rank} in all): idist.auto_dataloader's "
                f"DistributedSampler pads {n} to {per_rank * world} with {padding} repeats so that no sample "
                f"is left out, and the last batch of each rank is smaller ({per_rank % (batch // world)}). "
                f"Drop nothing: no drop_last=True, no epoch_length, no dataset trimmed to a multiple of "
                f"the world size")
    for epoch in range(EPOCHS):
        seen = [r["fetched"][epoch * per_rank:(epoch + 1) * per_rank] for r in ranks]
        missed = sorted(set(range(n)) - {i for s in seen for i in s})
        if missed:
            raise harness.ExerciseFailure(
                f"{where}: no rank trained on sample(s) {harness.short_list(missed)} in epoch {epoch + 1}: "
                f"the shards together must cover the dataset; let idist.auto_dataloader shard it")
        for a in range(world):
            for b in range(a + 1, world):
                both = sorted(set(seen[a]) & set(seen[b]))
                if len(both) > padding:
                    raise harness.ExerciseFailure(
                        f"on {layout[0]}, rank {a} and rank {b} both trained on sample {both[0]} in epoch "
                        f"{epoch + 1} ({len(both)} in common, more than the sampler's {padding} padding "
                        f"repeats): build the loader with idist.auto_dataloader so that each process reads "
                        f"its own shard")
    check_replicas_equal(ranks, layout[0])
    try:
        compare_with_one_process(ranks[0]["exact_step"], world, reference, THREE["exact"], rtol=1e-6)
    except harness.ExerciseFailure as failure:
        raise harness.ExerciseFailure(f"on {layout[0]}: {failure}") from None


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# The reference's half is one step of plain SGD in one process from the reference's
# make_model(), the step every layout's rank 0 must equal; the learner's half is what each
# rank's training did (samples fetched, ignite calls noted, weights).

LAYOUT = {layout[0]: layout for layout in harness.LAYOUTS}
TWO, NODES, ONE, THREE_PROCESSES = (harness.LAYOUTS[i][0] for i in (1, 3, 0, 2))
PARTS = (TWO, NODES, ONE, THREE_PROCESSES)  # the order of the tests above


def collect(part, whos, seed):
    """``{who: data}`` for one layout: the learner's ranks, the reference's one-process step."""
    found = {}
    if harness.LEARNER in whos:
        harness.preload_for("02", (harness.LEARNER,))
        if part == TWO:  # started by idist.Parallel, as a notebook's cell starts them
            ranks = harness.run_ranks(on_rank)
        else:
            args = THREE.values() if part == THREE_PROCESSES else ()
            ranks = harness.run_layouts(on_rank, *args, layouts=[LAYOUT[part]])[part]
        # only rank 0's exact step is judged
        found[harness.LEARNER] = [{k: v for k, v in r.items() if rank == 0 or k != "exact_step"}
                                  for rank, r in enumerate(ranks)]
    if harness.REFERENCE in whos:
        make_model = harness.load_reference("02").make_model
        batch = THREE["exact"] if part == THREE_PROCESSES else EXACT_BATCH
        found[harness.REFERENCE] = {"float32": one_process_step(make_model, torch.float32, batch),
                                    "float64": one_process_step(make_model, torch.float64, batch)}
    return found


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    ranks = harness.same_ranks(got, [None] * (LAYOUT[part][1] * LAYOUT[part][2]))
    if part == TWO:
        judge_two_processes(ranks, expected)
    elif part == THREE_PROCESSES:
        judge_three_processes(ranks, expected)
    else:
        judge_like_one_process(part, ranks, expected)
