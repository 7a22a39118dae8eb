"""``distkit shard-check``: which process sees which sample, checked, not assumed.

Spawns ``--nproc-per-node`` gloo processes, builds in each the loader that training
builds (``idist.auto_dataloader`` with the GLOBAL ``--batch-size``) over a dataset of
``--dataset-size`` indices, gathers every rank's indices and prints the report. Exits 1
when shards overlap beyond the padding ``DistributedSampler`` adds (or samples are missing
beyond what ``--drop-last`` explains)::

    distkit shard-check --dataset-size 101 --nproc-per-node 2
    distkit shard-check --dataset-size 101 --nproc-per-node 2 --plant-overlap   # exits 1
"""
from __future__ import annotations

import argparse
import json

from distkit.errors import DistkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--dataset-size", type=int, required=True, help="samples in the dataset")
    p.add_argument("--nproc-per-node", type=int, required=True, help="processes to spawn (gloo)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="GLOBAL batch size, divided among the processes (default: 8 per process)")
    p.add_argument("--drop-last", action="store_true", help="DataLoader drop_last=True")
    p.add_argument("--epochs", type=int, default=2, help="epochs to check (set_epoch is called)")
    p.add_argument("--plant-overlap", action="store_true",
                   help="demo: give every rank a sampler with rank=0 (a classic bug); the check must fail")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def check_args(args) -> int:
    """Refuse bad input before starting any process; returns the global batch size."""
    if args.dataset_size < 1:
        raise DistkitError(f"--dataset-size must be >= 1, got {args.dataset_size}")
    if args.nproc_per_node < 1:
        raise DistkitError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.epochs < 1:
        raise DistkitError(f"--epochs must be >= 1, got {args.epochs}")
    batch = args.batch_size if args.batch_size is not None else 8 * args.nproc_per_node
    if batch < args.nproc_per_node:
        raise DistkitError(
            f"global --batch-size {batch} is smaller than --nproc-per-node {args.nproc_per_node}: "
            f"every process needs at least one sample; use --batch-size >= {args.nproc_per_node}")
    return batch


def _start_method() -> str | None:
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else None


def main(args) -> int:
    from distkit.launch import describe_process_failure
    from distkit.sharding import check_shards, format_report, format_settings, run_on_ranks, shard_report

    batch = check_args(args)
    try:
        # fork: the children need no fresh interpreter (no CUDA here), and start in
        # milliseconds instead of re-importing torch each
        record = run_on_ranks(check_shards, args.nproc_per_node, args.dataset_size, batch,
                              epochs=args.epochs, drop_last=args.drop_last,
                              plant_overlap=args.plant_overlap, start_method=_start_method())
    except Exception as e:
        failure = describe_process_failure(e, 0, args.nproc_per_node)
        if failure is None:
            raise
        raise failure from None
    report = shard_report(record)
    if args.json:
        print(json.dumps({"settings": record["settings"], "report": report,
                          "seen": record["seen"]}))
    else:
        print(format_settings([record["settings"]]))
        print(format_report(report))
    return 0 if report["ok"] else 1
