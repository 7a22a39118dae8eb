"""See what data parallelism does to the data, instead of trusting it.

Four tools, each usable from a notebook, a course or ``distkit shard-check``:

- :func:`describe_loader` reads back what ``idist.auto_dataloader`` did from the loader's
  own settings: the global batch divided by the world size (and what happens when it does
  not divide), ``num_workers`` divided among the processes of a node, the
  ``DistributedSampler`` it inserted, ``pin_memory``.
- :func:`collect_indices` runs on every rank: it iterates a loader built by
  ``auto_dataloader`` over any map-style dataset (wrapped in
  :class:`distkit.builtin.data.IndexedDataset`, so every batch carries its sample indices) and
  gathers every rank's indices with ``idist.all_gather``.
- :func:`collect_loader_indices` does the same for a ``DataLoader`` you built, checked as
  it is: its own sampler, batch size and ``drop_last``, and ``set_epoch`` called only if
  your ``on_epoch`` calls it, so a training loop that forgets it is caught.
- :func:`shard_report` turns those indices into a verdict: disjoint or not, coverage, the
  duplicates ``DistributedSampler`` adds to pad a dataset that does not divide by the
  world size, what ``drop_last`` removed, and whether the order changes between epochs
  (it does only when ``sampler.set_epoch`` is called).

Example, in two processes on a CPU (a script: under spawn the function each rank runs
must be importable, hence the ``__main__`` guard)::

    import ignite.distributed as idist
    import torch
    from torch.utils.data import TensorDataset

    from distkit.launch.runner import run_per_rank
    from distkit.sharding import collect_indices, collect_loader_indices, format_report, shard_report

    def check(local_rank):
        dataset = TensorDataset(torch.arange(101.0), torch.zeros(101))
        # the loader training builds, with set_epoch called every epoch
        as_training_builds_it = collect_indices(dataset, batch_size=20, epochs=2)
        # your own loop's loader, as it is: here nobody calls set_epoch
        loader = idist.auto_dataloader(dataset, batch_size=20, shuffle=True)
        my_loop = collect_loader_indices(loader, epochs=2)
        return as_training_builds_it, my_loop

    if __name__ == "__main__":
        good, frozen = map(shard_report, run_per_rank(check, 2)[0])
        print(format_report(good))
        print(format_report(frozen))
        assert good["ok"] and good["order_changes_between_epochs"] == [True]
        assert frozen["ok"] and frozen["frozen_order"]   # shards fine, order replayed
"""
from __future__ import annotations

import math
from collections import Counter

import ignite.distributed as idist
import torch
from torch.utils.data.distributed import DistributedSampler

from distkit.builtin.data import IndexedDataset


# --------------------------------------------------------------------------------------
# What auto_dataloader did
# --------------------------------------------------------------------------------------

def describe_loader(loader, batch_size: int | None = None, num_workers: int | None = None) -> dict:
    """What ``idist.auto_dataloader`` made of the arguments it was given, read back from
    the loader itself (call it on any rank, inside the distributed context).

    ``batch_size`` and ``num_workers`` are the GLOBAL values that were passed to
    ``auto_dataloader``; they are only used to explain the difference."""
    world_size, nproc = idist.get_world_size(), idist.get_nproc_per_node()
    sampler = loader.sampler
    per_rank_batch = loader.batch_size
    out = {
        "world_size": world_size,
        "nproc_per_node": nproc,
        "requested_batch_size": batch_size,
        "per_rank_batch_size": per_rank_batch,
        "effective_global_batch_size": per_rank_batch * world_size if per_rank_batch else None,
        "requested_num_workers": num_workers,
        "per_process_num_workers": loader.num_workers,
        "workers_on_this_node": loader.num_workers * nproc,
        "sampler": type(sampler).__name__,
        "sampler_shuffle": getattr(sampler, "shuffle", None),
        "sampler_rank": getattr(sampler, "rank", None),
        "sampler_num_replicas": getattr(sampler, "num_replicas", None),
        "samples_per_rank": len(sampler),
        "batches_per_rank": len(loader),
        "drop_last": loader.drop_last,
        "pin_memory": loader.pin_memory,
    }
    out["notes"] = _loader_notes(out, idist.device().type)
    return out


def _loader_notes(d: dict, device_type: str) -> list[str]:
    notes, w = [], d["world_size"]
    b, eff = d["requested_batch_size"], d["effective_global_batch_size"]
    if b is not None and w > 1:
        if b < w:
            notes.append(f"global batch {b} < world size {w}: auto_dataloader left it at {b} per "
                         f"rank, so one step uses {eff} samples (distkit refuses this case)")
        elif b % w:
            notes.append(f"global batch {b} does not divide by {w}: each rank takes {b} // {w} = "
                         f"{d['per_rank_batch_size']}, so one step uses {eff} samples, not {b}")
        else:
            notes.append(f"global batch {b} / {w} ranks = {d['per_rank_batch_size']} per rank")
    nw, nproc = d["requested_num_workers"], d["nproc_per_node"]
    if nw is not None and w > 1 and nw > 0:
        if nw >= nproc:
            notes.append(f"num_workers {nw} over {nproc} processes on this node: ceil({nw}/{nproc}) = "
                         f"{d['per_process_num_workers']} each, {d['workers_on_this_node']} in all")
        else:
            notes.append(f"num_workers {nw} < {nproc} processes: left at {nw} per process, "
                         f"{d['workers_on_this_node']} in all")
    if d["sampler"] == "DistributedSampler":
        notes.append(f"DistributedSampler: rank {d['sampler_rank']} of "
                     f"{d['sampler_num_replicas']}, shuffle={d['sampler_shuffle']}, "
                     f"{d['samples_per_rank']} samples per rank")
    notes.append(f"pin_memory={d['pin_memory']}" + (
        "" if device_type == "cuda" or b is None else
        " (no CUDA device: auto_dataloader turns it on only with CUDA)"))
    return notes


def format_settings(settings: list[dict]) -> str:
    """A few lines per loader description, for printing."""
    lines = []
    for d in settings:
        made = ("your DataLoader" if d["requested_batch_size"] is None else
                 f"auto_dataloader(batch_size={d['requested_batch_size']}, num_workers={d['requested_num_workers']})")
        lines.append(f"{made} on {d['world_size']} ranks -> batch "
                     f"{d['per_rank_batch_size']} per rank, {d['per_process_num_workers']} worker(s) "
                     f"per process, {d['sampler']}, {d['batches_per_rank']} batches per rank")
        lines.extend(f"    {n}" for n in d["notes"])
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Gather every rank's sample indices
# --------------------------------------------------------------------------------------

def gather_variable(t: torch.Tensor) -> list[torch.Tensor]:
    """``idist.all_gather`` for 1-D integer tensors whose length differs between ranks:
    gather the lengths, pad to the longest, gather, cut. Returns one tensor per rank."""
    t = t.reshape(-1).long().cpu()
    sizes = idist.all_gather(torch.tensor([t.numel()], dtype=torch.long)).reshape(-1).cpu().tolist()
    longest = max(sizes)
    if longest == 0:
        return [torch.zeros(0, dtype=torch.long) for _ in sizes]
    padded = torch.full((longest,), -1, dtype=torch.long)
    padded[: t.numel()] = t
    gathered = idist.all_gather(padded.to(idist.device())).cpu().reshape(len(sizes), longest)
    return [gathered[r, : sizes[r]].long() for r in range(len(sizes))]


def collect_indices(dataset, batch_size: int, epochs: int = 1, drop_last: bool = False,
                    shuffle: bool = True, set_epoch: bool = True, num_workers: int = 0,
                    sampler=None) -> dict:
    """Run on EVERY rank. Build the loader exactly as training does
    (``idist.auto_dataloader`` with the GLOBAL ``batch_size``), iterate it for ``epochs``
    epochs and gather the sample indices every rank saw, in order.

    ``dataset``: any map-style dataset whose items are ``(x, y, ...)`` tuples.
    ``sampler``: pass one to check it instead of the ``DistributedSampler`` that
    ``auto_dataloader`` would insert. Returns the same record on every rank, for
    :func:`shard_report`."""
    kwargs = dict(batch_size=batch_size, num_workers=num_workers, drop_last=drop_last)
    if sampler is None:
        kwargs["shuffle"] = shuffle
    else:
        kwargs["sampler"] = sampler
    loader = idist.auto_dataloader(IndexedDataset(dataset), **kwargs)
    seen = []
    for epoch in range(epochs):
        if set_epoch and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batches = [batch[2] for batch in loader]
        mine = torch.cat(batches) if batches else torch.zeros(0, dtype=torch.long)
        seen.append([t.tolist() for t in gather_variable(mine)])
    s = loader.sampler
    return {
        "dataset_size": len(dataset),
        "world_size": idist.get_world_size(),
        "batch_size": batch_size,
        "per_rank_batch_size": loader.batch_size,
        "drop_last": drop_last,
        "sampler": type(s).__name__,
        # a DistributedSampler may drop the tail itself instead of padding
        "sampler_drop_last": bool(getattr(s, "drop_last", False)) if isinstance(s, DistributedSampler) else False,
        "shuffle": bool(getattr(s, "shuffle", shuffle)),
        "set_epoch": set_epoch,
        "seen": seen,  # seen[epoch][rank] = indices in the order that rank saw them
    }


def collect_loader_indices(loader, epochs: int = 2, on_epoch=None) -> dict:
    """Run on EVERY rank with the ``DataLoader`` that rank trains on, as it is: its own
    sampler, batch size and ``drop_last``. Reads ``epochs`` epochs of sample indices and
    gathers them like :func:`collect_indices`; the record goes to :func:`shard_report`.

    ``on_epoch(epoch)``, if given, is called before each epoch, as your training loop
    does at the start of an epoch (for example
    ``lambda epoch: loader.sampler.set_epoch(epoch)``). Nothing else calls ``set_epoch``:
    if your loop forgets it, the report says ``frozen_order``.

    The indices are read from the loader's own index stream (``loader.batch_sampler``,
    or ``loader.sampler`` without automatic batching): exactly the indices the loader
    hands to its fetcher and workers, without loading a sample. An ``IterableDataset``
    has no indices and is refused in one line."""
    from distkit.errors import DistkitError

    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        raise DistkitError("the loader reads an IterableDataset, which has no sample indices to "
                           "check: shard it yourself (by idist.get_rank()) or check a map-style dataset")
    index_stream = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    seen = []
    for epoch in range(epochs):
        if on_epoch is not None:
            on_epoch(epoch)
        mine = []
        for item in index_stream:
            mine.extend(item if isinstance(item, (list, tuple)) else [item])
        seen.append([t.tolist() for t in gather_variable(torch.tensor(mine, dtype=torch.long))])
    s = loader.sampler
    return {
        "dataset_size": len(loader.dataset),
        "world_size": idist.get_world_size(),
        "batch_size": (loader.batch_size or 1) * idist.get_world_size(),
        "per_rank_batch_size": loader.batch_size or 1,
        "drop_last": bool(loader.drop_last),
        "sampler": type(s).__name__,
        "sampler_drop_last": bool(getattr(s, "drop_last", False)) if isinstance(s, DistributedSampler) else False,
        "shuffle": _shuffles(s),
        "set_epoch": None if on_epoch is not None else False,
        "seen": seen,
    }


def _shuffles(sampler) -> bool | None:
    """Whether ``sampler`` draws a new order: True, False, or None (cannot tell)."""
    if isinstance(sampler, torch.utils.data.RandomSampler):
        return True
    if isinstance(sampler, torch.utils.data.SequentialSampler):
        return False
    shuffle = getattr(sampler, "shuffle", None)
    return bool(shuffle) if shuffle is not None else None


def run_on_ranks(fn, nproc_per_node: int, *args, backend: str = "gloo", timeout_s: float = 120.0,
                 start_method: str | None = None, **kwargs):
    """``distkit.launch.runner.run_per_rank(...)[0]``: rank 0's return value, which is all the
    sharding checks need (their record is the same on every rank). Processes start as
    ``run_per_rank`` says: forked under IPython, so ``fn`` may be defined in a notebook
    cell; spawned from a script, so ``fn`` must be importable."""
    from distkit.launch.runner import run_per_rank

    return run_per_rank(fn, nproc_per_node, backend, *args, start_method=start_method,
                        timeout_s=timeout_s, **kwargs)[0]


# --------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------

def expected_counts(dataset_size: int, world_size: int, per_rank_batch_size: int,
                    drop_last: bool, sampler_drop_last: bool = False) -> dict:
    """What a correct ``DistributedSampler`` + ``DataLoader`` pair must produce, from
    arithmetic alone: samples per rank, padding duplicates, samples dropped."""
    n, w, b = dataset_size, world_size, per_rank_batch_size
    if sampler_drop_last and n % w:
        per_rank = n // w  # the sampler drops the tail instead of padding
    else:
        per_rank = math.ceil(n / w)
    padding = max(0, per_rank * w - n)
    sampler_dropped = max(0, n - per_rank * w)
    per_rank_seen = (per_rank // b) * b if drop_last else per_rank
    # Rank r reads positions r, r + w, ... of the padded list; the padding is its last
    # ``padding`` positions, and the loader's drop_last drops each rank's last ones: the
    # positions [per_rank_seen * w, per_rank * w). A padding position (>= n) that is
    # dropped is a duplicate that never reaches the model; a real position (< n) that is
    # dropped is a sample nobody sees. Counted, not listed: a billion samples cost nothing.
    first_dropped, end = per_rank_seen * w, per_rank * w
    padding_seen = padding - max(0, end - max(n, first_dropped))
    unseen = sampler_dropped + max(0, min(n, end) - first_dropped)
    return {"samples_per_rank": per_rank, "padding": padding, "sampler_dropped": sampler_dropped,
            "seen_per_rank": per_rank_seen, "loader_dropped_per_rank": per_rank - per_rank_seen,
            "padding_seen": padding_seen, "unseen": unseen}


def shard_report(record: dict) -> dict:
    """Check the gathered indices of :func:`collect_indices` or :func:`collect_loader_indices`.

    Per epoch: samples per rank, indices seen by more than one rank, duplicates in all,
    the padding ``DistributedSampler`` is allowed to add, coverage and missing samples.
    ``ok`` is False when shards overlap beyond that padding, or when samples are missing
    beyond what ``drop_last`` explains. ``frozen_order`` is True when the sampler
    shuffles but every epoch replays the first one's order (``set_epoch`` never called);
    the shards are still correct then, so ``ok`` does not change."""
    n, w = record["dataset_size"], record["world_size"]
    exp = expected_counts(n, w, record["per_rank_batch_size"], record["drop_last"],
                          record.get("sampler_drop_last", False))
    allowed_missing = exp["sampler_dropped"] + w * exp["loader_dropped_per_rank"]
    epochs = []
    for e, ranks in enumerate(record["seen"]):
        counts = Counter(i for r in ranks for i in r)
        owners = {}
        for r, idx in enumerate(ranks):
            for i in set(idx):
                owners.setdefault(i, set()).add(r)
        total = sum(len(r) for r in ranks)
        duplicates = total - len(counts)
        out_of_range = sorted(i for i in counts if not 0 <= i < n)
        missing = n - len([i for i in counts if 0 <= i < n])
        overlap_beyond = max(0, duplicates - exp["padding"])
        epochs.append({
            "epoch": e + 1,
            "per_rank": [len(r) for r in ranks],
            "shared_indices": sum(1 for o in owners.values() if len(o) > 1),
            "duplicates": duplicates,
            "padding_duplicates": min(duplicates, exp["padding"]),
            "overlap_beyond_padding": overlap_beyond,
            "coverage": (n - missing) / n if n else 1.0,
            "missing": missing,
            "out_of_range": out_of_range[:10],
            "ok": overlap_beyond == 0 and missing <= allowed_missing and not out_of_range,
        })
    seen = record["seen"]
    order_changed = [any(seen[e][r] != seen[e - 1][r] for r in range(w)) for e in range(1, len(seen))]
    # a shuffling sampler that replays one order: nobody calls set_epoch (or equivalent)
    # (8 samples or more: 8! orders, so an unchanged order is not chance)
    frozen = bool(record.get("shuffle")) and n >= 8 and bool(order_changed) and not any(order_changed)
    return {
        "dataset_size": n, "world_size": w, "batch_size": record["batch_size"],
        "per_rank_batch_size": record["per_rank_batch_size"], "drop_last": record["drop_last"],
        "sampler": record["sampler"], "shuffle": record["shuffle"], "set_epoch": record["set_epoch"],
        "expected": {**exp, "allowed_missing": allowed_missing},
        "epochs": epochs,
        "disjoint": all(ep["duplicates"] == 0 for ep in epochs),
        "order_changes_between_epochs": order_changed,
        "frozen_order": frozen,
        "ok": all(ep["ok"] for ep in epochs),
    }


_SET_EPOCH = {True: "called", False: "NOT called", None: "left to on_epoch"}


def _expected_padding(exp: dict) -> str:
    if exp["padding_seen"] == exp["padding"]:
        return f"{exp['padding']} padding duplicate(s)"
    return (f"{exp['padding']} padding duplicate(s) of which the loader's drop_last drops "
            f"{exp['padding'] - exp['padding_seen']} ({exp['padding_seen']} seen)")


def format_report(report: dict) -> str:
    """The report in plain words, a few lines."""
    exp = report["expected"]
    lines = [f"{report['dataset_size']} samples on {report['world_size']} ranks, global batch "
             f"{report['batch_size']} ({report['per_rank_batch_size']} per rank), drop_last="
             f"{report['drop_last']}, {report['sampler']} shuffle={report['shuffle']}, "
             f"set_epoch={_SET_EPOCH[report['set_epoch']]}",
             f"expected: {exp['samples_per_rank']} samples per rank, " + _expected_padding(exp)
             + f", {exp['unseen']} sample(s) unseen"]
    for ep in report["epochs"]:
        verdict = "ok" if ep["ok"] else "FAIL"
        line = (f"epoch {ep['epoch']}: per rank {ep['per_rank']}, coverage {ep['coverage']:.1%} "
                f"({ep['missing']} missing), {ep['duplicates']} duplicate(s) "
                f"({ep['padding_duplicates']} padding), {ep['shared_indices']} index(es) on >1 rank: {verdict}")
        if ep["overlap_beyond_padding"]:
            line += f"  <- shards overlap by {ep['overlap_beyond_padding']} beyond the padding"
        if ep["out_of_range"]:
            line += f"  <- indices outside the dataset: {ep['out_of_range']}"
        lines.append(line)
    changes = report["order_changes_between_epochs"]
    if changes:
        lines.append("order changes between epochs: " + ", ".join(
            f"{e + 1}->{e + 2} {'yes' if c else 'NO'}" for e, c in enumerate(changes)))
    if report["sampler"] in ("RandomSampler", "SequentialSampler") and report["world_size"] > 1:
        lines.append(f"the sampler is a {report['sampler']}, not a DistributedSampler: every rank reads "
                     "the whole dataset; build the loader with idist.auto_dataloader (or give it a "
                     "DistributedSampler)")
    if report.get("frozen_order"):
        lines.append("WARNING: the sampler shuffles but every epoch replays the same order: the "
                     "loop must call loader.sampler.set_epoch(epoch) at the start of each epoch")
    if report["disjoint"]:
        disjoint = "disjoint: yes"
    elif all(ep["overlap_beyond_padding"] == 0 for ep in report["epochs"]):
        disjoint = "disjoint apart from the padding duplicates"
    else:
        disjoint = "NOT disjoint: shards overlap beyond the padding"
    lines.append(f"{disjoint}; verdict: {'OK' if report['ok'] else 'FAIL'}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# A classic bug, planted on purpose so that the check can be seen to catch it
# --------------------------------------------------------------------------------------

def rank_zero_sampler(dataset, shuffle: bool = True) -> DistributedSampler:
    """A ``DistributedSampler`` whose rank is hard-coded to 0: every process then reads
    rank 0's shard. Planted on purpose; :func:`shard_report` must say FAIL."""
    return DistributedSampler(dataset, num_replicas=idist.get_world_size(), rank=0, shuffle=shuffle)


def check_shards(local_rank, dataset_size: int, batch_size: int, epochs: int = 2,
                 drop_last: bool = False, plant_overlap: bool = False, num_workers: int = 0):
    """Worker of ``distkit shard-check --dataset-size``: :func:`check_dataset` on a
    dataset of ``dataset_size`` indices."""
    dataset = torch.utils.data.TensorDataset(torch.arange(dataset_size), torch.zeros(dataset_size))
    return check_dataset(local_rank, dataset, batch_size, epochs, drop_last, plant_overlap, num_workers)


def check_dataset(local_rank, dataset, batch_size: int, epochs: int = 2, drop_last: bool = False,
                  plant_overlap: bool = False, num_workers: int = 0):
    """Worker of ``distkit shard-check --dataset``: the loader training would build over
    ``dataset`` (a map-style dataset, or a function with no arguments returning one),
    checked with :func:`collect_indices`. Returns the record on rank 0, None elsewhere."""
    if callable(dataset) and not isinstance(dataset, torch.utils.data.Dataset):
        dataset = dataset()
    sampler = rank_zero_sampler(IndexedDataset(dataset)) if plant_overlap else None
    if sampler is not None:
        import warnings

        warnings.filterwarnings("ignore", message="Found distributed sampler with rank")
    record = collect_indices(dataset, batch_size=batch_size, epochs=epochs, drop_last=drop_last,
                             num_workers=num_workers, sampler=sampler)
    loader = idist.auto_dataloader(dataset, batch_size=batch_size, num_workers=num_workers,
                                   shuffle=True, drop_last=drop_last)
    record["settings"] = describe_loader(loader, batch_size, num_workers)
    return record if idist.get_rank() == 0 else None  # the same on every rank: pickle it once


def check_loader(local_rank, make_loader, epochs: int = 2):
    """Worker of ``distkit shard-check --loader``: the ``DataLoader`` that
    ``make_loader()`` returns in this rank, checked as it is with
    :func:`collect_loader_indices` (nobody calls ``set_epoch``). Record on rank 0."""
    loader = make_loader()
    record = collect_loader_indices(loader, epochs=epochs)
    record["settings"] = describe_loader(loader)
    return record if idist.get_rank() == 0 else None
