"""Plausible wrong answers to exercise 15 (reading a merged trace), in the format of
``WRONG_ANSWERS`` in test_exercises.py: (exercise, what the learner did, the change to
the solution, what the learner must read). tests/test_exercise15.py grades them."""

WRONG_ANSWERS_15 = [
    ("15", "the durations added up, overlaps counted twice",
     '''def time_in_collectives(trace, rank):
    return float(sum(e["dur"] for e in trace["traceEvents"] if e.get("ph") == "X"
                     and e.get("pid") == rank and e.get("name", "").startswith(COLLECTIVE_PREFIXES)))
''',
     r"you added up the durations, but two collectives in flight at once"),
    ("15", "the main thread's c10d calls counted as collectives",
     [("lambda name: name.startswith(COLLECTIVE_PREFIXES)",
       "lambda name: name.startswith(COLLECTIVE_PREFIXES) or 'allreduce' in name")],
     r"did you count events that are not collectives \(c10d::allreduce_"),
    ("15", "the rank that waited longest taken for the slow one",
     [("return min(_ranks(trace), key=", "return max(_ranks(trace), key=")],
     r"that is the rank that spent the MOST time in collectives"),
    ("15", "the collectives' own cost not subtracted",
     [("cost = time_in_collectives(trace, slow)", "cost = 0.0")],
     r"subtract the slow rank's time first"),
    ("15", "the slow rank kept in the mean",
     [("        if rank == slow:\n            continue\n", "")],
     r"average over the OTHER ranks only"),
    ("15", "divided by one step",
     [("steps = sum(b - a for a, b in", "steps = max(b - a for a, b in")],
     r"you divided by ONE step"),
    ("15", "a percentage",
     [("return sum(shares) / len(shares)", "return 100 * sum(shares) / len(shares)")],
     r"that is a percentage; return the fraction"),
]
