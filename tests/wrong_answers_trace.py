"""Plausible wrong answers to exercise 15 (reading a merged trace), in the format of
``WRONG_ANSWERS`` in test_exercises.py: (exercise, what the learner did, the change to
the solution, what the learner must read). tests/exercises/test_exercise15.py grades them."""

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
    # --- issue 35: traces that expose shortcuts (the first trace, 3 ranks with the last one slow,
    # gloo names, equal steps, events in order, let these pass) --------------------------------
    ("15", "the last rank taken for the slow one (notebook 15's straggler is the last)", """
def slow_rank(trace):
    return _ranks(trace)[-1]  # the straggler joins last: the highest rank
""", r"in a trace of 4 ranks whose slow rank is rank 1: slow_rank returned 3, but the others waited for rank 1 "
     r".*that is the last rank of the trace: the slow rank can be any of them"),
    ("15", "the ranks written in: 0, 1 and 2", """
def _ranks(trace):
    return [0, 1, 2]  # the run has three processes
""", r"in a trace of 4 ranks whose slow rank is rank 1: waited_fraction\(trace\) returned .*that is the mean over "
     r"ranks \[0, 2\] only; this trace's other ranks are \[0, 2, 3\] \(rank\(s\) \[3\] left out\)"),
    ("15", "the mean over the two other ranks of a 3-rank run",
     [("return sum(shares) / len(shares)", "return sum(shares) / 2  # the two ranks that waited")],
     r"in a trace of 4 ranks whose slow rank is rank 1: waited_fraction\(trace\) returned .*you divided the sum of "
     r"the 3 other ranks' shares by 2"),
    ("15", "only gloo's collectives (the names of a CPU run)",
     [("lambda name: name.startswith(COLLECTIVE_PREFIXES)", 'lambda name: name.startswith("gloo:")')],
     r"in the trace of a GPU run \(collectives named 'nccl:...'\): time_in_collectives\(trace, 0\) returned 0 us, "
     r"but rank 0 had a collective running for 39000 us: you kept only the names that start with 'gloo:'"),
    ("15", "the ranges walked in the order of the file", """
def _spans(trace, rank, accept):
    return [(e["ts"], e["ts"] + e.get("dur", 0)) for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("pid") == rank and accept(e.get("name", ""))]
""", r"in a trace whose events are not in the order of their start times: time_in_collectives\(trace, 0\) returned "
     r"162500 us, .*sort the ranges by start"),
    ("15", "every range's end added beyond the last one, even a range inside another", """
def time_in_collectives(trace, rank):
    covered, end = 0.0, float("-inf")
    for a, b in _spans(trace, rank, lambda name: name.startswith(COLLECTIVE_PREFIXES)):
        covered += b - max(a, end)  # what this range adds beyond the previous one
        end = b
    return covered
""", r"in a trace where one collective's range lies inside another's: time_in_collectives\(trace, 0\) returned "
     r"\d+ us, .*here a range lies inside an earlier one .*a negative length"),
    ("15", "the waiting and the steps each summed over the other ranks, then divided", """
def waited_fraction(trace):
    slow = slow_rank(trace)
    cost = time_in_collectives(trace, slow)
    waited = steps = 0.0
    for rank in _ranks(trace):
        if rank != slow:
            waited += time_in_collectives(trace, rank) - cost
            steps += sum(b - a for a, b in _spans(trace, rank, lambda name: name.startswith("ProfilerStep#")))
    return waited / steps
""", r"in a trace of 4 ranks whose slow rank is rank 1: waited_fraction\(trace\) returned .*a ratio of sums, which "
     r"equals the mean of each rank's share only when their steps last equally long"),
    ("15", "every step taken to last as long as the first", """
def waited_fraction(trace):
    slow = slow_rank(trace)
    cost = time_in_collectives(trace, slow)
    shares = []
    for rank in _ranks(trace):
        if rank != slow:
            steps = _spans(trace, rank, lambda name: name.startswith("ProfilerStep#"))
            step = steps[0][1] - steps[0][0]  # every step lasts the same
            shares.append((time_in_collectives(trace, rank) - cost) / (len(steps) * step))
    return sum(shares) / len(shares)
""", r"in a trace whose steps last 100 ms and 60 ms: waited_fraction\(trace\) returned .*you took every step to "
     r"last as long as the first"),
    # --- issue 35: answers the check must survive and describe -------------------------------
    ("15", "the merged ranges returned, not their length", """
def time_in_collectives(trace, rank):
    merged = []
    for a, b in _spans(trace, rank, lambda name: name.startswith(COLLECTIVE_PREFIXES)):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
""", r"time_in_collectives\(trace, 0\) returned a list of 2 \(list\); return a number"),
    ("15", "the slow rank returned with its time (min over the dict's items)", """
def slow_rank(trace):
    times = {rank: time_in_collectives(trace, rank) for rank in _ranks(trace)}
    return min(times.items(), key=lambda item: item[1])
""", r"slow_rank returned \(2, 30000\.0\), but the others waited for rank 2 .*return the rank alone, an int"),
    ("15", "the slow rank's process name returned", """
def slow_rank(trace):
    rank = min(_ranks(trace), key=lambda rank: time_in_collectives(trace, rank))
    return next(e["args"]["name"] for e in trace["traceEvents"]
                if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid") == rank)
""", r"slow_rank returned 'rank 2', but the others waited for rank 2 .*return the rank as an int"),
    ("15", "every event of the rank read before the names are filtered", """
def _spans(trace, rank, accept):
    spans = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace["traceEvents"] if e.get("pid") == rank]
    return sorted((a, b) for a, b, name in spans if accept(name))
""", r"time_in_collectives\(trace, 0\) raised KeyError: 'ts' \(line \d+: .*keep the complete events "
     r"\(\"ph\": \"X\"\) first"),
    ("15", "the time in collectives printed, not returned", """
def time_in_collectives(trace, rank):
    covered, end = 0.0, float("-inf")
    for a, b in _spans(trace, rank, lambda name: name.startswith(COLLECTIVE_PREFIXES)):
        if b > end:
            covered += b - max(a, end)
            end = b
    print(f"rank {rank}: {covered / 1000:.1f} ms in collectives")
""", r"time_in_collectives\(trace, 0\) returned None \(NoneType\); return a number"),
    ("15", "each other rank's share returned, not their mean", """
def waited_fraction(trace):
    slow = slow_rank(trace)
    cost = time_in_collectives(trace, slow)
    return {rank: (time_in_collectives(trace, rank) - cost)
            / sum(b - a for a, b in _spans(trace, rank, lambda name: name.startswith("ProfilerStep#")))
            for rank in _ranks(trace) if rank != slow}
""", r"waited_fraction\(trace\) returned \{0: 0\.6, 1: 0\.4\} \(dict\); return a number"),
]

GRADED_APART = WRONG_ANSWERS_15  # tests/wrong_answer_families.py counts them
