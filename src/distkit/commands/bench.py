"""``distkit bench``: what the kit costs, what scaling buys, where the limit is, and how
the kit's whole command compares with torchrun, plain ignite, accelerate and Fabric.

Prints a table of ratios and writes ``bench-<mode>.json`` and ``bench-<mode>.png`` under
``--output`` (default ``benchmarks/results``). See the package ``distkit.bench`` for the method and
``benchmarks/README.md`` for the recorded results.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distkit.bench import MEASUREMENTS

    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="fewer repeats, steps and whole commands: under 2 minutes on 2 cores")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="the full measurement (the default)")
    mode.add_argument("--tiny", dest="mode", action="store_const", const="tiny",
                      help=argparse.SUPPRESS)  # for the tests: every code path, seconds of work
    p.set_defaults(mode="full")
    p.add_argument("--output", default="benchmarks/results",
                   help="folder for bench-<mode>.json and bench-<mode>.png")
    p.add_argument("--only", default=",".join(MEASUREMENTS),
                   help=f"comma-separated subset of: {', '.join(MEASUREMENTS)}")
    p.add_argument("--note", default="",
                   help="recorded with the results, e.g. 'machine shared with other jobs'")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the 1-process measurements (default: all cores, the "
                        "kit's rule); 1 gives steadier numbers on a busy machine")
    p.add_argument("--check", action="store_true",
                   help="exit with code 1 if a kit/hand-written ratio or the hang records' "
                        "cost per step misses its target")


def main(args) -> int:
    import sys

    from distkit.bench import run_benchmarks, table, targets_missed

    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    results = run_benchmarks(args.mode, output_dir=args.output, only=only, note=args.note,
                             threads=args.threads, log=lambda line: print(line, flush=True))
    print()
    print(table(results))
    missed = targets_missed(results)
    if missed and args.check:
        sys.stderr.write(f"distkit: error: the kit misses its target in: "
                         f"{', '.join(missed)}: see the table above\n")
        return 1
    return 0
