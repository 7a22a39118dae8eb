"""Exercise 15: read a merged trace: which rank is slow, and how long did the others wait?

Topic: profiler traces of every rank (notebook 15, ``distkit train --trace``). A merged
trace is a dict (the JSON of ``trace/merged.json``) whose ``"traceEvents"`` list holds
every rank's events. A *complete* event is ``{"ph": "X", "name": ..., "pid": rank,
"tid": thread, "ts": start, "dur": duration}``, times in microseconds, the ranks'
clocks aligned. Other events (``"ph": "M"`` names a process or a thread, and flow
arrows) have no duration: skip them. Each recorded step of a rank is one event named
``ProfilerStep#N``; a collective shows as a range named ``gloo:...`` (``nccl:...`` on a
GPU), e.g. ``gloo:all_reduce``, on one of gloo's worker threads, from the moment it
runs to the moment every rank has joined. Two collectives in flight at once run on two
threads, so their ranges can overlap.

In synchronous data parallelism every rank waits in the collective for the slowest one.
The slow rank arrives last and finds the others there: it waits least.

Task: write three functions of a merged trace.

1. ``time_in_collectives(trace, rank)``: the time (microseconds) during which rank
   ``rank`` had at least one collective running: overlapping ranges count once.
2. ``slow_rank(trace)``: the rank the others waited for (the one that spent the least
   time in collectives).
3. ``waited_fraction(trace)``: the share of their steps that the OTHER ranks spent
   waiting for the slow one. A rank's waiting is its time in collectives minus the slow
   rank's (what the collectives cost everyone); divide it by that rank's time in its
   recorded steps (all its ``ProfilerStep#N`` events), and return the mean over the
   other ranks, as a fraction (0.25, not 25).

Check it:  pytest exercises -m ex15     (or: distkit check 15)
Stuck?     distkit check 15 --hint     (or read exercises/hints.md)
"""
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")


def _spans(trace, rank, accept):
    """(start, end) of the rank's complete events whose name ``accept`` takes, by start."""
    return sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("pid") == rank and accept(e.get("name", "")))


def _ranks(trace):
    return sorted({e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"})


def time_in_collectives(trace, rank):
    """Microseconds during which ``rank`` had a collective running (overlaps counted once)."""
    covered, end = 0.0, float("-inf")
    for a, b in _spans(trace, rank, lambda name: name.startswith(COLLECTIVE_PREFIXES)):
        if b > end:  # the part of this range that no earlier range covered
            covered += b - max(a, end)
            end = b
    return covered


def slow_rank(trace):
    """The rank every other rank waited for."""
    return min(_ranks(trace), key=lambda rank: time_in_collectives(trace, rank))


def waited_fraction(trace):
    """The mean share of their recorded steps that the other ranks waited for the slow one."""
    slow = slow_rank(trace)
    cost = time_in_collectives(trace, slow)  # what the collectives cost when nobody waits
    shares = []
    for rank in _ranks(trace):
        if rank == slow:
            continue
        steps = sum(b - a for a, b in _spans(trace, rank, lambda name: name.startswith("ProfilerStep#")))
        shares.append((time_in_collectives(trace, rank) - cost) / steps)
    return sum(shares) / len(shares)
