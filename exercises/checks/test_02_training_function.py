"""Checks for exercise 02: ``training(local_rank, config)`` on 2 processes.

Each rank trains on a dataset that records which samples it hands out, in which order,
then reports them with its final weights; the parent compares the ranks and the epochs.
The check also notes whether ``idist.auto_optim`` was called (ignite's own function
still runs): on CPUs it returns the optimizer unchanged, so nothing else would show it."""
import copy
import functools

import pytest
import torch
from distkit.data import synthetic_dataset
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


def on_rank():
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
        set_epoch_calls.append((epoch, sampler.shuffle))
        return real_set_epoch(sampler, epoch)

    idist.auto_optim = recording_auto_optim
    DistributedSampler.set_epoch = recording_set_epoch
    dataset = RecordingDataset()
    torch.manual_seed(0)
    initial_loss = full_loss(ex.make_model(), dataset)
    config = {"dataset": dataset, "batch_size": GLOBAL_BATCH, "lr": 0.2, "epochs": EPOCHS}
    try:
        returned = ex.training(idist.get_local_rank(), config)
    finally:
        idist.auto_optim = real_auto_optim
        DistributedSampler.set_epoch = real_set_epoch
    if not (isinstance(returned, tuple) and len(returned) == 2):
        raise harness.ExerciseFailure(
            f"training returned {type(returned).__name__}; return the pair (model, train_loader)")
    model, loader = returned
    return {
        "fetched": list(dataset.fetched),
        "batch_size": getattr(loader, "batch_size", None),
        "weights": harness.flat_weights(model),
        "wrapped": type(model).__name__,
        "initial_loss": initial_loss,
        "final_loss": full_loss(model, dataset),
        "auto_optim": auto_optim_calls,
        "steps": steps,
        "set_epoch": set_epoch_calls,
    }


def _counted_step(step, optimizer, steps, which, *args, **kwargs):
    steps[which] += 1
    return step(optimizer, *args, **kwargs)


def test_training_shards_data_and_keeps_replicas_equal():
    ranks = harness.run_ranks(on_rank)
    per_rank = N_SAMPLES // len(ranks)
    for rank, r in enumerate(ranks):
        if r["batch_size"] != GLOBAL_BATCH // len(ranks):
            raise harness.ExerciseFailure(
                f"rank {rank}'s loader takes {r['batch_size']} samples per step, but a GLOBAL "
                f"batch of {GLOBAL_BATCH} over {len(ranks)} processes is "
                f"{GLOBAL_BATCH // len(ranks)} each: pass the global batch size to "
                f"idist.auto_dataloader, which divides it by the world size itself")
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
                f"calls train_loader.sampler.set_epoch(engine.state.epoch - 1)")
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
    r = ranks[0]
    if not r["final_loss"] < 0.8 * r["initial_loss"]:
        raise harness.ExerciseFailure(
            f"the model did not learn: loss {r['initial_loss']:.3f} before training, "
            f"{r['final_loss']:.3f} after; build the optimizer on model.parameters() of the "
            f"model idist.auto_model returned, and run the trainer")
