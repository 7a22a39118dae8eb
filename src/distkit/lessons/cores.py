"""Sentences about this machine's cores, computed instead of written for one machine.

A notebook prints these where its prose would otherwise say "2 per core" or "one thread
each", which holds on a 2-core machine only. ``cores`` defaults to the cores this
process may run on; ``tests/lessons/test_lessons_cores.py`` passes other counts::

    >>> sharing_sentence(4, cores=2)
    'this machine has 2 cores: N=4 processes share them, 2 per core'
    >>> sharing_sentence(4, cores=8)
    'this machine has 8 cores: N=4 processes, one torch thread each, run on 4 of them'
"""
from __future__ import annotations

import os


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def sharing_sentence(processes: int, cores: int | None = None) -> str:
    """How ``processes`` single-threaded processes sit on the cores (notebook 08)."""
    cores = machine_cores() if cores is None else cores
    head = f"this machine has {cores} core{'s' if cores != 1 else ''}: N={processes} processes"
    if processes > cores:
        return f"{head} share them, {processes / cores:.3g} per core"
    if processes == cores:
        return f"{head} get one core each"
    return f"{head}, one torch thread each, run on {processes} of them"


def threads_sentence(processes: int, threads: int, cores: int | None = None) -> str:
    """What the spawned processes and the single process of notebook 04's comparison ran
    with: ``threads`` torch threads each (``threads_per_process``: cores // processes)."""
    cores = machine_cores() if cores is None else cores
    each = f"{threads} CPU thread{'s' if threads != 1 else ''}"
    extra = "a second core" if threads == 1 else f"{threads} more cores"
    return (f"each of the {processes} spawned processes had {each} ({cores} cores // "
            f"{processes} processes); the single process gets {threads} too, so the comparison "
            f"asks what a second process, on {extra}, buys")
