"""Checks for exercise 03: the shards of 2 ranks over 3 epochs."""
import pytest
import torch
from distkit.data import IndexedDataset, synthetic_dataset

import harness

pytestmark = pytest.mark.ex03

N_SAMPLES = 20
GLOBAL_BATCH = 4
EPOCHS = 3


def on_rank():
    ex = harness.load("03")
    dataset = IndexedDataset(synthetic_dataset(N_SAMPLES, shape=(1, 2, 2)))
    loader = ex.make_train_loader(dataset, GLOBAL_BATCH, seed=0)
    sizes = [len(batch[2]) for batch in loader]
    other_seed = ex.make_train_loader(dataset, GLOBAL_BATCH, seed=1)
    return {"batch_sizes": sizes,
            "epochs": [list(ex.epoch_indices(loader, epoch)) for epoch in range(EPOCHS)],
            "other_seed": list(ex.epoch_indices(other_seed, 0))}


def test_each_rank_gets_its_own_shard_reshuffled_every_epoch():
    ranks = harness.run_ranks(on_rank)
    world = len(ranks)
    for rank, r in enumerate(ranks):
        wrong = [s for s in r["batch_sizes"] if s != GLOBAL_BATCH // world]
        if wrong:
            raise harness.ExerciseFailure(
                f"rank {rank} got batches of {wrong[0]} samples, but a GLOBAL batch of "
                f"{GLOBAL_BATCH} over {world} processes is {GLOBAL_BATCH // world} per process: "
                f"use batch_size=global_batch_size // world size")
    for epoch in range(EPOCHS):
        shards = [r["epochs"][epoch] for r in ranks]
        for rank, shard in enumerate(shards):
            if len(shard) != len(set(shard)):
                twice = sorted({i for i in shard if shard.count(i) > 1})
                raise harness.ExerciseFailure(
                    f"rank {rank} read sample {twice[0]} more than once in epoch {epoch}: "
                    f"each sample once per epoch (a DistributedSampler does that)")
        common = sorted(set(shards[0]) & set(shards[1]))
        if common:
            raise harness.ExerciseFailure(
                f"rank 0 and rank 1 both trained on sample {common[0]} in epoch {epoch} "
                f"({len(common)} of {N_SAMPLES} samples in common): give each rank its own "
                f"shard with DistributedSampler(dataset, num_replicas=world size, rank=rank), "
                f"the same seed on every rank")
        missed = sorted(set(range(N_SAMPLES)) - set(shards[0]) - set(shards[1]))
        if missed:
            raise harness.ExerciseFailure(
                f"no rank trained on sample(s) {harness.short_list(missed)} in epoch {epoch}: "
                f"together the shards must cover the dataset (use the same seed on every rank)")
    for rank, r in enumerate(ranks):
        first = r["epochs"][0]
        if first == sorted(first):
            raise harness.ExerciseFailure(
                f"rank {rank} read its samples in sorted order ({harness.short_list(first, 5)}): "
                f"shuffle them (DistributedSampler(..., shuffle=True, seed=seed))")
        for epoch in range(1, EPOCHS):
            if r["epochs"][epoch] == r["epochs"][epoch - 1]:
                raise harness.ExerciseFailure(
                    f"rank {rank} read the same samples in the same order in epochs "
                    f"{epoch - 1} and {epoch} ({harness.short_list(first, 5)}): call "
                    f"loader.sampler.set_epoch(epoch) before each epoch, so the shuffle changes")
        if r["other_seed"] == first:
            raise harness.ExerciseFailure(
                f"make_train_loader(..., seed=0) and make_train_loader(..., seed=1) gave rank "
                f"{rank} the same order in epoch 0 ({harness.short_list(first, 5)}): pass seed "
                f"to the DistributedSampler, so a run can choose its shuffle")
