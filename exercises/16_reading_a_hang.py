"""Exercise 16: read the records of a hung run: which rank went its own way, how, and where?

Topic: hangs (notebook 16, ``distkit launch``'s hang lines, docs/hangs.md). Every rank
must call the same collectives in the same order with the same tensors. When one rank
does not, the others wait for it until the timeout. The kit then asks every rank for a
record of what it was doing; you get them as ``dumps``, a list with one dict per rank,
in no particular order::

    {"rank": 2,
     "state": "in collective",     # or "raised" (it gave up waiting), "computing", "ended", "died"
     "where": "train.py:21",       # the line the rank is at now (none for "ended" and "died")
     "call": "broadcast",          # the torch.distributed function it is inside, or None
     "current": 6,                 # the number of the collective it is in, or None
     "collectives": [              # torch's Flight Recorder: what the rank called, in order
         {"group": "0", "seq": 5, "op": "all_reduce", "shapes": [[1000]],
          "dtypes": ["float32"], "done": True},
         {"group": "0", "seq": 6, "op": "broadcast", "shapes": [[1000]],
          "dtypes": ["float32"], "done": False},
     ]}

A rank numbers its collectives 1, 2, 3, ... in the order it calls them (``seq``); here
every collective is on the default group ``"0"``. The Flight Recorder is a ring buffer:
it keeps only a rank's most recent entries, so two ranks' lists may begin at different
numbers. A rank that skips a collective gives its next one the skipped one's number. A
rank that died left no entries.

The dumps come from runs of 3 or more ranks in which every rank but ONE did the same
thing. That rank's disagreement is one of ``KINDS``:

- ``"op"``: at some number it called another collective than the others (wrong op,
  another order, a skipped barrier);
- ``"shape"``: the same collective, tensors of other shapes;
- ``"dtype"``: the same collective and shapes, other dtypes;
- ``"missing"``: it never reached a collective the others called (it computes, ended,
  died, or is stuck elsewhere);
- ``"extra"``: it called a collective that none of the others reached.

Task: write ``diagnose(dumps)`` that returns a tuple ``(rank, kind, line)``: the odd
rank, the kind of its disagreement, and the line that rank is at now (its ``"where"``;
None when it has none).

Check it:  pytest exercises -m ex16     (or: distkit check 16)
Stuck?     distkit check 16 --hint     (or read exercises/hints.md)
"""
KINDS = ("op", "shape", "dtype", "missing", "extra")


def diagnose(dumps):
    """``(rank, kind, line)`` of the one rank that did something else than the others."""
    # TODO: line the ranks' collectives up, compare them, and find the rank that differs;
    # then say how it differs (one of KINDS) and where it is.
    raise NotImplementedError("exercise 16: write diagnose")
