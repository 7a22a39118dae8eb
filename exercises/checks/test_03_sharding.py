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
    check_shards(harness.run_ranks(on_rank))


NODE_SAMPLES, NODE_BATCH = 40, 8  # on 2 nodes of 2 processes: 10 samples, batches of 2 each


def on_node_rank():
    import ignite.distributed as idist

    ex = harness.load("03")
    dataset = IndexedDataset(synthetic_dataset(NODE_SAMPLES, shape=(1, 2, 2)))
    report = {"rank": idist.get_rank(), "local_rank": idist.get_local_rank(),
              "nproc_per_node": idist.get_nproc_per_node(), "world_size": idist.get_world_size()}
    try:
        loader = ex.make_train_loader(dataset, NODE_BATCH, seed=0)
        report["batch_sizes"] = [len(batch[2]) for batch in loader]
        report["epochs"] = [list(ex.epoch_indices(loader, epoch)) for epoch in range(2)]
    except ValueError as error:  # DistributedSampler refuses a rank >= num_replicas
        report["error"] = f"{type(error).__name__}: {error}"
    return report


def test_shards_follow_the_global_rank_on_two_nodes():
    # 2 nodes x 2 processes: world size 4, 2 processes per node, local ranks 0, 1, 0, 1.
    ranks = harness.run_nodes(on_node_rank)
    where = "on 2 nodes of 2 processes each (world size 4, local ranks 0, 1, 0, 1): "
    per_node = ranks[0]["nproc_per_node"]
    for r in ranks:
        if "error" in r:
            raise harness.ExerciseFailure(
                f"{where}rank {r['rank']}'s make_train_loader raised {r['error']}: a "
                f"DistributedSampler needs num_replicas = the WORLD size, idist.get_world_size() "
                f"(4), not the processes of one node, idist.get_nproc_per_node() ({per_node})")
    for r in ranks:
        if r["batch_sizes"] and r["batch_sizes"][0] == NODE_BATCH // per_node:
            raise harness.ExerciseFailure(
                f"{where}rank {r['rank']} got batches of {r['batch_sizes'][0]} samples: you "
                f"divided the GLOBAL batch of {NODE_BATCH} by the processes of one node "
                f"(idist.get_nproc_per_node() = {per_node}); divide by the world size, "
                f"idist.get_world_size() = 4, to get {NODE_BATCH // 4}")
    for epoch in range(2):
        for a in ranks:
            for b in ranks:
                if a["rank"] < b["rank"] and a["epochs"][epoch] == b["epochs"][epoch]:
                    same_local = a["local_rank"] == b["local_rank"]
                    why = (f"both have local rank {a['local_rank']}: the shard must follow the "
                           f"GLOBAL rank, idist.get_rank(), not idist.get_local_rank()"
                           if same_local else "each rank needs its own shard")
                    raise harness.ExerciseFailure(
                        f"{where}rank {a['rank']} (node {a['rank'] // per_node}) and rank "
                        f"{b['rank']} (node {b['rank'] // per_node}) read the same samples in "
                        f"epoch {epoch} ({harness.short_list(a['epochs'][epoch], 5)}): {why}")
    check_shards([{**r, "other_seed": None} for r in ranks], NODE_SAMPLES, NODE_BATCH, 2, where)


def check_shards(ranks, n_samples=N_SAMPLES, global_batch=GLOBAL_BATCH, epochs=EPOCHS, where=""):
    world = len(ranks)
    for rank, r in enumerate(ranks):
        wrong = [s for s in r["batch_sizes"] if s != global_batch // world]
        if wrong:
            raise harness.ExerciseFailure(
                where + f"rank {rank} got batches of {wrong[0]} samples, but a GLOBAL batch of "
                f"{global_batch} over {world} processes is {global_batch // world} per process: "
                f"use batch_size=global_batch_size // world size")
    for epoch in range(epochs):
        shards = [r["epochs"][epoch] for r in ranks]
        for rank, shard in enumerate(shards):
            if len(shard) != len(set(shard)):
                twice = sorted({i for i in shard if shard.count(i) > 1})
                raise harness.ExerciseFailure(
                    where + f"rank {rank} read sample {twice[0]} more than once in epoch {epoch}: "
                    f"each sample once per epoch (a DistributedSampler does that)")
        pairs = [(a, b) for a in range(world) for b in range(a + 1, world)
                 if set(shards[a]) & set(shards[b])]
        if pairs:
            a, b = pairs[0]
            common = sorted(set(shards[a]) & set(shards[b]))
            raise harness.ExerciseFailure(
                where + f"rank {a} and rank {b} both trained on sample {common[0]} in epoch {epoch} "
                f"({len(common)} of {n_samples} samples in common): give each rank its own "
                f"shard with DistributedSampler(dataset, num_replicas=world size, rank=rank), "
                f"the same seed on every rank")
        missed = sorted(set(range(n_samples)) - {i for shard in shards for i in shard})
        if missed:
            raise harness.ExerciseFailure(
                where + f"no rank trained on sample(s) {harness.short_list(missed)} in epoch {epoch}: "
                f"together the shards must cover the dataset (use the same seed on every rank)")
    for rank, r in enumerate(ranks):
        first = r["epochs"][0]
        if first == sorted(first):
            raise harness.ExerciseFailure(
                where + f"rank {rank} read its samples in sorted order ({harness.short_list(first, 5)}): "
                f"shuffle them (DistributedSampler(..., shuffle=True, seed=seed))")
        for epoch in range(1, epochs):
            if r["epochs"][epoch] == r["epochs"][epoch - 1]:
                raise harness.ExerciseFailure(
                    where + f"rank {rank} read the same samples in the same order in epochs "
                    f"{epoch - 1} and {epoch} ({harness.short_list(first, 5)}): call "
                    f"loader.sampler.set_epoch(epoch) before each epoch, so the shuffle changes")
        sets = [sorted(e) for e in r["epochs"]]
        if all(s == sets[0] for s in sets[1:]):
            raise harness.ExerciseFailure(
                where + f"rank {rank} read the same SET of samples in every epoch (only their "
                f"order changed): its shard is fixed, so it never sees the other ranks' samples. "
                f"A DistributedSampler(shuffle=True) with set_epoch(epoch) permutes the WHOLE "
                f"dataset every epoch before dealing it out, so each rank's samples change")
        if r["other_seed"] is not None and r["other_seed"] == first:
            raise harness.ExerciseFailure(
                where + f"make_train_loader(..., seed=0) and make_train_loader(..., seed=1) gave rank "
                f"{rank} the same order in epoch 0 ({harness.short_list(first, 5)}): pass seed "
                f"to the DistributedSampler, so a run can choose its shuffle")


# --- against the reference, in every layout -----------------------------------------------
# 22 samples do not divide by 3 or 4 processes (DistributedSampler pads with repeats); a
# global batch of 12 divides by every world size of the layouts.
ODD_SAMPLES, ODD_BATCH = 22, 12


def on_rank_both(seed):
    """What the learner's loader and the reference's give this rank: batch sizes and the
    indices of 2 epochs, for the same dataset and seed."""
    dataset = IndexedDataset(synthetic_dataset(ODD_SAMPLES, shape=(1, 2, 2)))
    result = {}
    for who, module in (("expected", harness.load_reference("03")), ("got", harness.load("03"))):
        loader = module.make_train_loader(dataset, ODD_BATCH, seed=seed)
        result[who] = {"batch sizes": [len(batch[2]) for batch in loader],
                       "epochs": [list(module.epoch_indices(loader, epoch)) for epoch in range(2)]}
    return result


def test_shards_equal_the_reference_in_every_layout():
    seed = harness.check_seed() % 1000
    for layout, ranks in harness.each_layout(on_rank_both, seed, layouts=harness.MULTI_FIRST):
        for rank, r in enumerate(ranks):
            want, got = r["expected"], r["got"]
            for epoch in range(2):
                differs = harness.difference(want["epochs"][epoch], got["epochs"][epoch],
                                             what=f"the indices read in epoch {epoch}")
                if differs:
                    raise harness.ExerciseFailure(
                        f"on {layout}, rank {rank}, {ODD_SAMPLES} samples (not a multiple of the world size): "
                        f"{differs}; expected {harness.short_list(want['epochs'][epoch], 8)}, got "
                        f"{harness.short_list(got['epochs'][epoch], 8)}. The reference is DistributedSampler("
                        f"dataset, num_replicas=world size, rank=rank, shuffle=True, seed=seed) (it pads the "
                        f"last round with repeats, drop_last=False), with set_epoch(epoch) {harness.replay(seed)}")
            differs = harness.difference(want["batch sizes"], got["batch sizes"], what="the batch sizes")
            if differs:
                raise harness.ExerciseFailure(
                    f"on {layout}, rank {rank}, {ODD_SAMPLES} samples in global batches of {ODD_BATCH}: {differs} "
                    f"(global_batch_size // world size per batch, the last batch smaller)")
