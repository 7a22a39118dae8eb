"""``distkit shard-check``: which process sees which sample, checked, not assumed.

Spawns ``--nproc-per-node`` gloo processes, builds in each a loader, gathers every rank's
sample indices and prints the report. Three things to check:

- ``--dataset-size N``: a dataset of N indices, loaded the way training loads it
  (``idist.auto_dataloader`` with the GLOBAL ``--batch-size``, ``set_epoch`` every epoch);
- ``--dataset module:attr``: your own map-style dataset (an object, or a function with no
  arguments that returns one), loaded the same way;
- ``--loader module:attr``: a function with no arguments that returns YOUR ``DataLoader``,
  checked as it is (its sampler, batch size, ``drop_last``); nobody calls ``set_epoch``
  for it, so a shuffling sampler replays one order and the report warns that your loop
  must call it.

``module`` is importable from the current folder, or a path: ``path/to/file.py:attr``.
The function runs in every rank, inside the process group, so it may call
``idist.auto_dataloader``; it is called once here first, so that a broken one fails in
one line before any process starts. Exits 1 when shards overlap beyond the padding
``DistributedSampler`` adds, or when samples are missing beyond what ``drop_last``
explains (a plain ``DataLoader`` without a ``DistributedSampler``: every rank reads it all)::

    distkit shard-check --dataset-size 101 --nproc-per-node 2
    distkit shard-check --dataset-size 101 --nproc-per-node 2 --plant-overlap   # exits 1
    distkit shard-check --loader course.py:train_loader --nproc-per-node 2
"""
from __future__ import annotations

import argparse
import json

from distkit.errors import DistkitError

# Every index is gathered and compared: about 1 GB and a minute per million samples with
# 2 ranks on 2 cores (measured). Beyond this, refuse with the arithmetic instead of
# growing without bound.
MAX_CHECKED_SAMPLES = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--dataset-size", type=int, help="check a dataset of this many indices")
    what.add_argument("--dataset", metavar="MODULE:ATTR",
                      help="check your map-style dataset (or a function returning it), loaded as training loads it")
    what.add_argument("--loader", metavar="MODULE:ATTR",
                      help="check the DataLoader a function with no arguments returns, as it is")
    p.add_argument("--nproc-per-node", type=int, required=True, help="processes to spawn (gloo)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="GLOBAL batch size, divided among the processes (default: 8 per process); "
                        "not with --loader")
    p.add_argument("--drop-last", action="store_true", help="DataLoader drop_last=True; not with --loader")
    p.add_argument("--epochs", type=int, default=2,
                   help="epochs to check (set_epoch is called, except with --loader)")
    p.add_argument("--plant-overlap", action="store_true",
                   help="demo: give every rank a sampler with rank=0 (a classic bug); the check must fail")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def check_args(args) -> int | None:
    """Refuse bad input before starting any process; returns the global batch size
    (None with ``--loader``: the loader has its own)."""
    if args.dataset_size is not None and args.dataset_size < 1:
        raise DistkitError(f"--dataset-size must be >= 1, got {args.dataset_size}")
    if args.nproc_per_node < 1:
        raise DistkitError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.epochs < 1:
        raise DistkitError(f"--epochs must be >= 1, got {args.epochs}")
    if args.loader:
        for flag, given in (("--batch-size", args.batch_size is not None), ("--drop-last", args.drop_last),
                            ("--plant-overlap", args.plant_overlap)):
            if given:
                raise DistkitError(f"{flag} does not apply to --loader, which is checked as it is: "
                                   f"set it in the DataLoader your function returns, or drop {flag}")
        return None
    batch = args.batch_size if args.batch_size is not None else 8 * args.nproc_per_node
    if batch < args.nproc_per_node:
        raise DistkitError(
            f"global --batch-size {batch} is smaller than --nproc-per-node {args.nproc_per_node}: "
            f"every process needs at least one sample; use --batch-size >= {args.nproc_per_node}")
    return batch


def check_size(size: int, world: int, per_rank_batch: int, drop_last: bool, flag: str) -> None:
    """Refuse a dataset too big to gather index by index, in one line that still gives
    the arithmetic answer (for ``--dataset-size``) and a way to check a smaller one."""
    if size <= MAX_CHECKED_SAMPLES:
        return
    too_big = (f"{flag}: {size} samples is more than {MAX_CHECKED_SAMPLES}, the most this check "
               "gathers index by index (about 1 GB per million)")
    if flag != "--dataset-size":
        raise DistkitError(f"{too_big}: return a torch.utils.data.Subset of it from your function")
    from distkit.sharding import expected_counts

    exp = expected_counts(size, world, per_rank_batch, drop_last)
    step = world * per_rank_batch  # keeps the remainders modulo the world size and the batch
    smaller = (MAX_CHECKED_SAMPLES // step - 1) * step + size % step
    raise DistkitError(
        f"{too_big}; by arithmetic alone, DistributedSampler gives each of {world} ranks "
        f"{exp['samples_per_rank']} samples ({exp['padding']} padding duplicate(s)), of which each "
        f"sees {exp['seen_per_rank']} with drop_last={drop_last}: to check it for real, pass "
        f"--dataset-size {smaller} (same remainder modulo {step})")


def resolve(spec: str, flag: str):
    """The object ``--dataset`` / ``--loader`` names, called once here (not in a process
    group) so that a wrong path, a wrong type or a broken function fails in one line
    before any process starts. Returns ``(object, what it gave here)``."""
    from torch.utils.data import DataLoader, Dataset

    from distkit.tasks import import_spec  # the same import rules as --task

    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise DistkitError(f"{flag} {spec!r} is not module:attr: pass e.g. {flag} course:attr "
                           f"(course.py in the current folder) or {flag} path/to/course.py:attr")
    try:
        module = import_spec(spec, module_name)
    except DistkitError as e:
        raise DistkitError(str(e).replace("--task", flag)) from None
    if not hasattr(module, attr):
        raise DistkitError(f"{flag} {spec!r}: module {module.__name__!r} has no attribute {attr!r}: "
                           "name one defined at its top level")
    obj = getattr(module, attr)
    if flag == "--dataset" and isinstance(obj, Dataset):
        made = obj
    elif callable(obj) and not isinstance(obj, (DataLoader, Dataset)):
        from distkit.host.facts import quiet_ignite_logs

        try:
            with quiet_ignite_logs():
                made = obj()
        except Exception as e:
            raise DistkitError(f"{flag} {spec!r}: calling {attr}() raised {type(e).__name__}: {e}: "
                               "fix that function (it takes no arguments)") from None
    else:
        raise DistkitError(f"{flag} {spec!r} is a {type(obj).__name__}: name a function with no "
                           "arguments" + (" or a Dataset" if flag == "--dataset" else
                                          " that builds the DataLoader (each rank builds its own, "
                                          "after the process group exists)"))
    wanted = DataLoader if flag == "--loader" else Dataset
    if not isinstance(made, wanted) or (flag == "--dataset" and not hasattr(made, "__len__")):
        raise DistkitError(f"{flag} {spec!r} gave a {type(made).__name__}, not a "
                           f"{'DataLoader' if flag == '--loader' else 'map-style Dataset (with __len__)'}"
                           f": return one" + (", or use --loader for a DataLoader" if flag == "--dataset" else ""))
    return obj, made


def _start_method() -> str | None:
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def main(args) -> int:
    from distkit.launch.entry import describe_process_failure
    from distkit.sharding import (check_dataset, check_loader, check_shards, format_report,
                                  format_settings, run_on_ranks, shard_report)

    batch = check_args(args)
    world = args.nproc_per_node
    if args.dataset_size is not None:
        check_size(args.dataset_size, world, batch // world, args.drop_last, "--dataset-size")
        worker, what = check_shards, args.dataset_size
    elif args.dataset:
        obj, dataset = resolve(args.dataset, "--dataset")
        check_size(len(dataset), world, batch // world, args.drop_last, "--dataset")
        worker, what = check_dataset, obj
    else:
        obj, loader = resolve(args.loader, "--loader")
        check_size(len(loader.dataset), world, 1, False, "--loader")
        worker, what = check_loader, obj
    options = dict(epochs=args.epochs)
    if not args.loader:
        options.update(batch_size=batch, drop_last=args.drop_last, plant_overlap=args.plant_overlap)
    try:
        # fork: the children need no fresh interpreter (no CUDA here), start in milliseconds
        # instead of re-importing torch each, and inherit the module --dataset/--loader named
        record = run_on_ranks(worker, world, what, start_method=_start_method(), **options)
    except Exception as e:
        failure = describe_process_failure(e, 0, world)
        if failure is None:
            raise
        raise failure from None
    report = shard_report(record)
    if args.json:
        print(json.dumps({"settings": record["settings"], "report": report, "seen": record["seen"]}))
    else:
        print(format_settings([record["settings"]]))
        print(format_report(report))
    # A frozen order is a warning, not a failure: with --loader the loop that would call
    # set_epoch is not here to run (distkit.sharding.collect_loader_indices takes its hook).
    return 0 if report["ok"] else 1
