"""Checks for exercise 03: the shards of 2 ranks over 3 epochs."""
import sys

import pytest
import torch
from distkit.builtin.data import IndexedDataset, synthetic_dataset

import harness

pytestmark = pytest.mark.ex03


def loader_of(module, dataset, global_batch, seed):
    """``module.make_train_loader(...)``, or the learner's message if it is not a DataLoader."""
    loader = module.make_train_loader(dataset, global_batch, seed=seed)
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise harness.ExerciseFailure(
            f"make_train_loader returned {harness.describe(loader)}: return the DataLoader (whose "
            f"sampler is the DistributedSampler), so that a training loop can iterate over it")
    return loader


def indices_of(module, loader, epoch):
    """``module.epoch_indices(loader, epoch)`` as a list of ints, or the learner's message."""
    got = module.epoch_indices(loader, epoch)
    if isinstance(got, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in got):
        return list(got)
    inner = f" of {harness.describe(got[0])}" if isinstance(got, (list, tuple)) and got else ""
    raise harness.ExerciseFailure(
        f"epoch_indices(loader, {epoch}) returned {harness.describe(got)}{inner}: return a flat list of "
        f"Python ints, the sample indices in the order read (int(i) for each index of each batch)")

N_SAMPLES = 20
GLOBAL_BATCH = 4
EPOCHS = 3


def on_rank(whos):
    dataset = IndexedDataset(synthetic_dataset(N_SAMPLES, shape=(1, 2, 2)))
    found = {}
    for who in whos:
        ex = harness.answer("03", who)
        loader = loader_of(ex, dataset, GLOBAL_BATCH, 0)
        sizes = [len(batch[2]) for batch in loader]
        other_seed = loader_of(ex, dataset, GLOBAL_BATCH, 1)
        found[who] = {"batch_sizes": sizes,
                      "epochs": [indices_of(ex, loader, epoch) for epoch in range(EPOCHS)],
                      "other_seed": indices_of(ex, other_seed, 0)}
    return found


def test_each_rank_gets_its_own_shard_reshuffled_every_epoch():
    harness.judge_here(sys.modules[__name__], [SHARDS], harness.check_seed())


NODE_SAMPLES, NODE_BATCH = 40, 8  # on 2 nodes of 2 processes: 10 samples, batches of 2 each


def on_node_rank(whos):
    import ignite.distributed as idist

    dataset = IndexedDataset(synthetic_dataset(NODE_SAMPLES, shape=(1, 2, 2)))
    found = {}
    for who in whos:
        ex = harness.answer("03", who)
        report = {"rank": idist.get_rank(), "local_rank": idist.get_local_rank(),
                  "nproc_per_node": idist.get_nproc_per_node(), "world_size": idist.get_world_size()}
        try:
            loader = loader_of(ex, dataset, NODE_BATCH, 0)
            report["batch_sizes"] = [len(batch[2]) for batch in loader]
            report["epochs"] = [indices_of(ex, loader, epoch) for epoch in range(2)]
        except ValueError as error:  # DistributedSampler refuses a rank >= num_replicas
            report["error"] = f"{type(error).__name__}: {error}"
        found[who] = report
    return found


def test_shards_follow_the_global_rank_on_two_nodes():
    # 2 nodes x 2 processes: world size 4, 2 processes per node, local ranks 0, 1, 0, 1.
    harness.judge_here(sys.modules[__name__], [NODES], harness.check_seed())


def judge_nodes(got, expected):
    # where each rank ran is the reference's run's to say, not the learner's data
    ranks = [{**g, **{k: e[k] for k in ("rank", "local_rank", "nproc_per_node", "world_size")}}
             for g, e in zip(harness.same_ranks(got, expected), expected)]
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
                f"{where}rank {r['rank']} got batches of {r['batch_sizes'][0]} samples: the GLOBAL "
                f"batch of {NODE_BATCH} divided by {per_node}, not by the world size 4 ({per_node} is the "
                f"number of processes of ONE node, idist.get_nproc_per_node(), or of a 2-process run); "
                f"divide by idist.get_world_size() = 4, to get {NODE_BATCH // 4}")
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
                    f"the sampler's set_epoch with the epoch before each epoch, so the shuffle changes")
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
# 22 samples do not divide by 3 or 4 processes (DistributedSampler pads with repeats), and
# a global batch of 10 divides by neither 3 nor 4 (the task's global_batch_size // world
# size rounds down: 3 and 2 per process); on 2 processes 11 samples per rank end in a
# partial batch (5, 5, 1).
ODD_SAMPLES, ODD_BATCH = 22, 10


def on_rank_both(seed, whos):
    """What the learner's loader and the reference's give this rank: batch sizes and the
    indices of 2 epochs, for the same dataset and seed."""
    dataset = IndexedDataset(synthetic_dataset(ODD_SAMPLES, shape=(1, 2, 2)))
    result = {}
    for who in whos:
        module = harness.answer("03", who)
        loader = loader_of(module, dataset, ODD_BATCH, seed)
        result[who] = {"batch sizes": [len(batch[2]) for batch in loader],
                       "epochs": [indices_of(module, loader, epoch) for epoch in range(2)]}
    return result


def test_shards_equal_the_reference_in_every_layout():
    harness.judge_here(sys.modules[__name__], AGAINST_REFERENCE, harness.check_seed())


def judge_against_reference(layout, got, expected, seed):
    for rank, (got_rank, want) in enumerate(zip(harness.same_ranks(got, expected, f"on {layout}: "), expected)):
        for epoch in range(2):
            differs = harness.difference(want["epochs"][epoch], got_rank["epochs"][epoch],
                                         what=f"the indices read in epoch {epoch}")
            if differs:
                raise harness.ExerciseFailure(
                    f"on {layout}, rank {rank}, {ODD_SAMPLES} samples (not a multiple of the world size): "
                    f"{differs}; expected {harness.short_list(want['epochs'][epoch], 8)}, got "
                    f"{harness.short_list(got_rank['epochs'][epoch], 8)}. The reference is DistributedSampler("
                    f"dataset, num_replicas=world size, rank=rank, shuffle=True, seed=seed) (it pads the "
                    f"last round with repeats, drop_last=False), with set_epoch(epoch) {harness.replay(seed)}")
        differs = harness.difference(want["batch sizes"], got_rank["batch sizes"], what="the batch sizes")
        if differs:
            raise harness.ExerciseFailure(
                f"on {layout}, rank {rank}, {ODD_SAMPLES} samples in global batches of {ODD_BATCH}: {differs}; "
                f"expected {harness.short_list(want['batch sizes'])}, got "
                f"{harness.short_list(got_rank['batch sizes'])} (global_batch_size // world size per batch, "
                f"rounded down, the last batch smaller) {harness.replay(seed)}")


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

SHARDS, NODES = "shards on 2 processes", "shards on 2 nodes x 2 processes"
AGAINST_REFERENCE = [f"the reference on {layout[0]}" for layout in harness.MULTI_FIRST]
PARTS = (SHARDS, NODES, *AGAINST_REFERENCE)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` for one part of the check."""
    harness.preload_for("03", whos)
    if part == SHARDS:
        return harness.by_who(harness.run_ranks(on_rank, whos), whos)
    if part == NODES:
        return harness.by_who(harness.run_nodes(on_node_rank, whos), whos)
    layout = harness.MULTI_FIRST[AGAINST_REFERENCE.index(part)]
    ranks = harness.run_layouts(on_rank_both, seed % 1000, whos, layouts=[layout])[layout[0]]
    return harness.by_who(ranks, whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    if part == SHARDS:
        check_shards(harness.same_ranks(got, expected))
    elif part == NODES:
        judge_nodes(got, expected)
    else:
        judge_against_reference(part[len("the reference on "):], got, expected, seed % 1000)
