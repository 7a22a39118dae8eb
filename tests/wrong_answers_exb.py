"""Issue 35's families for exercises 10, 12, 13, 14 and 15 (tests/wrong_answer_families.py
says what they mean): the family of every wrong answer of these exercises, wherever it is
listed (tests/test_exercises.py, wrong_answers_layouts.py for 10, wrong_answers_parallel.py
for 12 and 13, wrong_answers_flops.py for 14, wrong_answers_trace.py for 15), which
families apply to each exercise and why the others do not; and ``WRONG_ANSWERS``, the
newer wrong answers of 10, 12, 13 and 14 (exercise 15's are in wrong_answers_trace.py's
``WRONG_ANSWERS_15``, which tests/test_exercise15.py grades), in the format of
test_exercises.py's list: (exercise, what the learner did, the change to the solution, what
the learner must read)."""

FAMILY = {}


def _tag(number, family, *names):
    for name in names:
        FAMILY[(number, name)] = family


# --- 15 reading a trace ---------------------------------------------------------------
_tag("15", "understanding", "the durations added up, overlaps counted twice",
     "the main thread's c10d calls counted as collectives", "the rank that waited longest taken for the slow one",
     "the collectives' own cost not subtracted", "the slow rank kept in the mean", "divided by one step",
     "a percentage")
_tag("15", "inputs", "the last rank taken for the slow one (notebook 15's straggler is the last)",
     "the ranks written in: 0, 1 and 2", "the mean over the two other ranks of a 3-rank run",
     "only gloo's collectives (the names of a CPU run)", "the ranges walked in the order of the file",
     "every range's end added beyond the last one, even a range inside another",
     "the waiting and the steps each summed over the other ranks, then divided",
     "every step taken to last as long as the first")
_tag("15", "robust", "the merged ranges returned, not their length",
     "the slow rank returned with its time (min over the dict's items)", "the slow rank's process name returned",
     "every event of the rank read before the names are filtered", "the time in collectives printed, not returned",
     "each other rank's share returned, not their mean")

APPLIES = {
    "15": ("inputs", "robust"),
}

NOT_APPLICABLE = {
    ("15", "layout"): "the three functions read a dict in one process: no process group, rank or world size "
                      "of their own. What a run's layout changes is the trace they read (how many ranks, "
                      "which one is slow); the check varies that (2, 3 and 4 ranks, the slow one first, in "
                      "the middle or last) and those answers are graded as inputs",
    ("15", "structure"): "the answer's own code has no structure to teach (no overlap, no memory held): it "
                         "computes three numbers from a trace, compared exactly with the reference's",
    ("15", "device"): "no tensor and no device: the functions read JSON. The one-machine habit it can carry, "
                      "knowing only gloo's 'gloo:' names, is graded as an input (the trace of a GPU run, "
                      "'nccl:' names)",
}

WRONG_ANSWERS = []
