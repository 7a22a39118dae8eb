"""Plausible wrong answers to exercise 16 (reading a hung run's records), in the format of
``WRONG_ANSWERS`` in test_exercises.py: (exercise, what the learner did, the change to
the solution, what the learner must read); their families (tests/wrong_answer_families.py),
which families apply and why the others do not. tests/exercises/test_exercise16.py grades
them in its own process (the check starts no process)."""

FAMILY = {}


def _tag(family, *names):
    for name in names:
        FAMILY[("16", name)] = family


ONE_RECORD_PER_RANK = '            return odd, kind, records[odd].get("where")'

WRONG_ANSWERS_16 = [
    # --- right on benign records only (3 ranks in rank order, the odd one not first, whole lists)
    ("16", "the first record taken for what every rank should have called", '''
def _odd_one(values):
    first = next(iter(values.values()))  # rank 0 is the reference
    return next((rank for rank, value in values.items() if value != first), None)
''', r"in a hung run of 3 ranks \(skip\): diagnose\(dumps\) returned \(1, .*did you compare every rank with the "
     r"first record\? Here that is rank 0, the odd one itself"),
    ("16", "the record's place in the list taken for its rank",
     [('records = {d["rank"]: d for d in dumps}', "records = dict(enumerate(dumps))")],
     r"that is the position of rank \d's record in the list; the records come in any order"),
    ("16", "the collectives lined up by their place in the list",
     [('{c["seq"]: c for c in d["collectives"]}', 'dict(enumerate(d["collectives"]))')],
     r"in records whose Flight Recorder lists begin at different numbers .*rank 0's Flight Recorder kept only its "
     r"latest entries \(its list begins at #2, the others' at #1\): line the collectives up by their number"),
    ("16", "how far a rank got counted in entries",
     [("reached = {rank: max(table, default=0)", "reached = {rank: len(table)")],
     r"in records whose Flight Recorder lists begin at different numbers .*returned \(1, 'extra', .*rank 0's list "
     r"is short only because its Flight Recorder dropped its oldest entries"),
    ("16", "element counts compared instead of shapes", '''
def _call(c):
    import math

    return (c["op"], sum(math.prod(s) for s in c["shapes"]), str(c["dtypes"]))  # the bytes sent
''', r"in records with a transposed tensor .*returned None \(NoneType\), .*the shapes differ though their element "
     r"counts agree"),
    ("16", "the first three records read (a run of 3 processes)",
     [('records = {d["rank"]: d for d in dumps}', 'records = {d["rank"]: d for d in dumps[:3]}')],
     r"in a hung run of 4 ranks \(computes\): diagnose\(dumps\) returned None .*these dumps of 4 ranks hold one "
     r"disagreement"),
    # --- answers the check must survive and describe -------------------------------------------
    ("16", "the doctor's sentence returned", '''
_diagnose = diagnose


def diagnose(dumps):
    rank, kind, line = _diagnose(dumps)
    return f"rank {rank} disagrees ({kind}) at {line}"
''', r"returned 'rank 2 disagrees \(op\) at train.py:21' \(str\), .*not a sentence"),
    ("16", "the odd rank's record returned", '''
_diagnose = diagnose


def diagnose(dumps):
    rank = _diagnose(dumps)[0]
    return next(d for d in dumps if d["rank"] == rank)
''', r"returned .*\(dict\), .*return the tuple \(rank, kind, line\), not a record"),
    ("16", "a list returned", '''
_diagnose = diagnose


def diagnose(dumps):
    return list(_diagnose(dumps))
''', r"returned a list of 3 \(list\), .*return a tuple \(rank, kind, line\), not a list"),
    ("16", "every record's where read", [('else "extra"\n    return odd, kind, records[odd].get("where")',
                                        'else "extra"\n    return odd, kind, records[odd]["where"]')],
     r"diagnose\(dumps\) raised KeyError: 'where' \(line \d+: .*a rank that ended or died has no \"where\""),
    ("16", "the answer printed, not returned", '''
_diagnose = diagnose


def diagnose(dumps):
    print("the odd rank, its kind, its line:", _diagnose(dumps))
''', r"diagnose\(dumps\) returned None \(NoneType\), but at collective #6 rank 2 called broadcast"),
    ("16", "the odd rank's op given as the kind", '''
_diagnose = diagnose


def diagnose(dumps):
    rank, kind, line = _diagnose(dumps)
    record = next(d for d in dumps if d["rank"] == rank)
    return rank, record.get("call") or kind, line
''', r"returned \(2, 'broadcast', 'train.py:21'\), .*the kind is one of KINDS, and 'broadcast' is not"),
    ("16", "the line number alone", '''
_diagnose = diagnose


def diagnose(dumps):
    rank, kind, line = _diagnose(dumps)
    return rank, kind, int(line.split(":")[1]) if line else None
''', r"returned \(2, 'op', 21\), .*the line is the record's \"where\" as it stands, a text like 'train.py:21'"),
    ("16", "the rank as text", '''
_diagnose = diagnose


def diagnose(dumps):
    rank, kind, line = _diagnose(dumps)
    return f"rank {rank}", kind, line
''', r"returned \('rank 2', 'op', 'train.py:21'\), .*the rank is an int \(the record's \"rank\"\), not text"),
    # --- mistakes about the task itself ----------------------------------------------------------
    ("16", "the rank that got furthest blamed",
     [("odd = _odd_one(reached)", "odd = max(reached, key=reached.get)  # the one left waiting")],
     r"in a hung run of 4 ranks \(computes\): diagnose\(dumps\) returned \(0, .*rank 0 is one of the ranks that "
     r"called collective #\d+; the odd one is the rank that never reached it"),
    ("16", "a skipped barrier called missing",
     [('kind = ("op" if mine["op"] != theirs["op"] else',
       'kind = ("missing" if "barrier" in (mine["op"], theirs["op"]) else "op" if mine["op"] != theirs["op"] else')],
     r"in a hung run of 3 ranks \(skip\): .*rank 0 skipped the barrier, so its next collective took the barrier's "
     r"number"),
    ("16", "every difference called op",
     [('kind = ("op" if mine["op"] != theirs["op"] else\n                    "shape" if mine["shapes"] != '
       'theirs["shapes"] else "dtype")', 'kind = "op"')],
     r"in a hung run of 3 ranks \(shape\): .*the op and the dtypes are the same; the shapes differ"),
    ("16", "the other ranks' line returned",
     [(ONE_RECORD_PER_RANK, '            return odd, kind, records[min(set(records) - {odd})].get("where")')],
     r"returned \(2, 'op', 'train.py:19'\), .*'train.py:19' is where the other ranks are; return the line of rank 2"),
    ("16", "missing and extra swapped",
     [('kind = "missing" if reached[odd] < others else "extra"',
       'kind = "extra" if reached[odd] < others else "missing"')],
     r"in a hung run of 4 ranks \(computes\): .*returned \(3, 'extra', .*rank 3 got less far than the others"),
    ("16", "each rank's last entry compared", '''
def diagnose(dumps):
    records = {d["rank"]: d for d in dumps}
    last = {rank: d["collectives"][-1] for rank, d in records.items()}  # where each rank is stuck
    odd = _odd_one({rank: _call(c) for rank, c in last.items()})
    if odd is None:
        return None
    mine, theirs = last[odd], next(c for rank, c in last.items() if rank != odd)
    kind = "op" if mine["op"] != theirs["op"] else "shape" if mine["shapes"] != theirs["shapes"] else "dtype"
    return odd, kind, records[odd].get("where")
''', r"in a hung run of 4 ranks \(computes\): .*returned \(3, '(op|shape)', .*rank 3's record has no collective "
     r"#\d+ for another rank's to differ from \(compare collectives of the same number only\)"),
]

_tag("inputs", "the first record taken for what every rank should have called",
     "the record's place in the list taken for its rank", "the collectives lined up by their place in the list",
     "how far a rank got counted in entries", "element counts compared instead of shapes",
     "the first three records read (a run of 3 processes)")
_tag("robust", "the doctor's sentence returned", "the odd rank's record returned", "a list returned",
     "every record's where read", "the answer printed, not returned", "the odd rank's op given as the kind",
     "the line number alone", "the rank as text")
_tag("understanding", "the rank that got furthest blamed", "a skipped barrier called missing",
     "every difference called op", "the other ranks' line returned", "missing and extra swapped",
     "each rank's last entry compared")

APPLIES = {"16": ("inputs", "robust")}

NOT_APPLICABLE = {
    ("16", "layout"): "diagnose reads a list of dicts in one process: no process group, rank or world size of "
                      "its own. What a run's layout changes is the records it reads (how many ranks, which one "
                      "is odd, their order); the check varies that (3 to 6 ranks, the odd one anywhere, the "
                      "records in any order) and those answers are graded as inputs",
    ("16", "structure"): "the answer's own code has no structure to teach (no collective, no overlap, no memory "
                         "held): one tuple computed from the records, compared exactly with the planted answer",
    ("16", "device"): "no tensor and no device: the records are JSON (the Flight Recorder's entries on gloo and "
                      "nccl alike)",
}

GRADED_APART = WRONG_ANSWERS_16  # tests/wrong_answer_families.py counts them
