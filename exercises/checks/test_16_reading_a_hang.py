"""Checks for exercise 16: reading the records of a hung run. First records built by
hand, whose answer is known; then records in which the check planted one rank's
disagreement, drawn anew each run (every family of hang: another op, another order, a
skipped barrier, other shapes, other dtypes, a rank that computes, ended, died, is stuck
making a group, or calls one more), and records built to expose shortcuts."""
import copy
import random
import sys

import pytest

import harness

pytestmark = pytest.mark.ex16

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
KIND_OF = {"wrong_op": "op", "order": "op", "skip": "op", "shape": "shape", "dtype": "dtype",
           "computes": "missing", "ended": "missing", "dies": "missing", "new_group": "missing",
           "one_more": "extra"}
TIMED_OUT = "RuntimeError: Timed out waiting 5000ms for recv operation to complete"


# --- records as the hang doctor writes them (distkit.observe.hang_records) ----------------

def _entries(calls, first=1):
    return [{"group": "0", "seq": first + i, "op": c["op"], "shapes": c["shapes"],
             "dtypes": c["dtypes"], "done": True} for i, c in enumerate(calls)]


def _waiting(rank, calls, error=None):
    """A rank that called ``calls`` and waits (or gave up waiting) in the last one."""
    entries = _entries(calls)
    entries[-1]["done"] = False
    record = {"rank": rank, "state": "raised" if error else "in collective", "where": calls[-1]["line"],
              "call": calls[-1]["op"], "current": len(calls), "collectives": entries}
    if error:
        record["error"] = error
    return record


def _call(op, shape, dtype, line):
    barrier = op == "barrier"
    return {"op": op, "shapes": [] if barrier else [list(shape)], "dtypes": [] if barrier else [dtype],
            "line": line}


def _shown(c) -> str:
    tensors = ", ".join(f"{d}{s}" for d, s in zip(c["dtypes"], c["shapes"]))
    return f"{c['op']} ({tensors})" if tensors else c["op"]


class Planted:
    """One hung run's records with one rank's disagreement planted, and what the check
    knows about it: the answer, and the facts its messages name."""

    def __init__(self, rng, family, world, odd, trim=0, transposed=False, order=None, before=None):
        self.family, self.world, self.odd = family, world, odd
        script = rng.choice(["train.py", "eval.py", "course/step.py"])
        lines = iter(rng.sample(range(5, 400), 12))

        def call(op=None, shape=None, dtype="float32", avoid=()):
            op = op or rng.choice([o for o in OPS if o not in avoid])
            return _call(op, shape or [rng.randint(1, 4096)], dtype, f"{script}:{next(lines)}")

        n = rng.randint(3 if trim else 1, 6) if before is None else before  # collectives all completed
        before = []
        for _ in range(n):  # neighbours differ, so that a list read by position misaligns
            before.append(call(avoid=[before[-1]["op"]] if before else []))
        stuck = call(shape=[64, 32] if transposed else None, avoid=[before[-1]["op"]] if before else [])
        error = rng.choice([None, TIMED_OUT])
        self.seq, self.theirs = n + 1, stuck  # where the disagreement shows, and the others' call
        mine = None
        if family in ("wrong_op", "order"):
            mine = call(avoid=[stuck["op"]])
        elif family == "shape":
            shape = [32, 64] if transposed else [stuck["shapes"][0][0] + rng.randint(1, 100)]
            mine = dict(stuck, shapes=[shape])
        elif family == "dtype":
            mine = dict(stuck, dtypes=[rng.choice(["float64", "float16", "int64"])])
        elif family == "skip":  # the others wait in the barrier; the odd rank went on to `stuck`
            self.theirs, mine = call(op="barrier"), stuck
        self.mine = mine
        records = [_waiting(r, before + [mine if r == odd and mine else self.theirs], error)
                   for r in range(world)]
        if family in ("computes", "new_group"):
            records[odd] = {"rank": odd, "state": "computing" if family == "computes" else "in collective",
                            "where": call()["line"], "call": None if family == "computes" else "new_group",
                            "current": None, "collectives": _entries(before)}
        elif family == "ended":
            records[odd] = {"rank": odd, "state": "ended", "collectives": _entries(before)}
        elif family == "dies":
            records[odd] = {"rank": odd, "state": "died", "signal": rng.choice(["SIGKILL", "SIGSEGV"]),
                            "collectives": []}
        elif family == "one_more":  # the others ended after `before`; the odd rank calls one more
            records = [r if r["rank"] == odd else {"rank": r["rank"], "state": "ended",
                                                   "collectives": _entries(before)} for r in records]
        self.trimmed = None
        if trim:  # the ring buffer dropped one other rank's oldest entries
            self.trimmed = next(r for r in range(world) if r != odd)
            records[self.trimmed]["collectives"] = records[self.trimmed]["collectives"][trim:]
        self.records = {r["rank"]: r for r in records}
        self.dumps = [self.records[r] for r in (order or range(world))]
        self.answer = (odd, KIND_OF[family], self.records[odd].get("where"))

    def story(self) -> str:
        """What rank ``odd`` did, in words (what the learner should have found)."""
        odd, seq, theirs = self.odd, self.seq, _shown(self.theirs)
        at = f" at {self.answer[2]}" if self.answer[2] else ""
        if self.mine is not None:
            return f"at collective #{seq} rank {odd} called {_shown(self.mine)}{at}, the others {theirs}"
        if self.family == "one_more":
            return (f"rank {odd} waits in collective #{seq}, {theirs}{at}, which none of the others "
                    f"reached (they ended after #{seq - 1})")
        how = {"computes": "is computing", "ended": "ended", "dies": "died",
               "new_group": "is stuck making a group (new_group)"}[self.family]
        return f"the others wait in collective #{seq}, {theirs}; rank {odd} never reached it: it {how}{at}"


# --- what an answer is told ----------------------------------------------------------------

def _advice(error):
    if isinstance(error, KeyError):
        return (" Not every record has every key: a rank that ended or died has no \"where\", a rank "
                "that died no entries (read such keys with .get)")
    return ""


def diagnosed(ex, planted, on="") -> dict:
    """``ex.diagnose`` on the planted records, as :func:`harness.outcome`'s data."""
    dumps = copy.deepcopy(planted.dumps)  # an answer may change what it is given
    return harness.outcome(f"{on}diagnose(dumps)", ex.diagnose, dumps, advice=_advice)


def _right(got, planted) -> bool:
    return isinstance(got, tuple) and len(got) == 3 and all(
        type(g) is type(a) and g == a for g, a in zip(got, planted.answer))


def judge_one(result, planted, on=""):
    """What the answer gave on ``planted`` (a :func:`diagnosed` outcome) against the planted answer."""
    got = harness.returned(result)
    if _right(got, planted):
        return
    raise harness.ExerciseFailure(f"{on}diagnose(dumps) returned {_said(got)}, but {planted.story()}: "
                                  f"{why(got, planted)}")


def _said(got) -> str:
    if isinstance(got, tuple) and len(got) == 3:
        return repr(got)
    return f"{harness.describe(got)} ({type(got).__name__})"


def why(got, p) -> str:
    rank, kind, line = p.answer
    if got is None:
        if p.family == "shape" and p.theirs["shapes"] == [[64, 32]]:
            return ("the shapes differ though their element counts agree ([64, 32] vs [32, 64], a "
                    "transposed tensor): compare the shapes themselves")
        return (f"these dumps of {p.world} ranks hold one disagreement; compare every rank's record, "
                "number by number, and how far each rank got")
    if isinstance(got, dict):
        return "return the tuple (rank, kind, line), not a record"
    if isinstance(got, str):
        return "return the tuple (rank, kind, line), not a sentence"
    if not isinstance(got, tuple):
        return f"return a tuple (rank, kind, line), not a {type(got).__name__}"
    if len(got) != 3:
        return f"return three things, (rank, kind, line), not {len(got)}"
    got_rank, got_kind, got_line = got
    if type(got_rank) is not int or got_rank != rank:
        return _why_rank(got_rank, p)
    if type(got_kind) is not str or got_kind != kind:
        return _why_kind(got_kind, p)
    return _why_line(got_line, p)


def _why_rank(got_rank, p) -> str:
    rank, kind, _ = p.answer
    positions = [d["rank"] for d in p.dumps]
    if isinstance(got_rank, str):
        return "the rank is an int (the record's \"rank\"), not text"
    if type(got_rank) is not int:
        return f"the rank is an int (the record's \"rank\"), not {harness.describe(got_rank)}"
    if got_rank not in positions:
        return f"there is no rank {got_rank!r} in these dumps (their ranks: {sorted(positions)})"
    if positions.index(rank) == got_rank:
        return ("that is the position of rank {0}'s record in the list; the records come in any order "
                "(here {1}): a rank is its record's \"rank\"").format(rank, positions)
    if positions[0] == rank and got_rank == positions[1]:
        return (f"did you compare every rank with the first record? Here that is rank {rank}, the odd "
                f"one itself: compare each rank with what MOST ranks called")
    if p.trimmed is not None and got_rank == p.trimmed:
        return (f"rank {got_rank}'s Flight Recorder kept only its latest entries (its list begins at "
                f"#{p.records[got_rank]['collectives'][0]['seq']}, the others' at #1): line the "
                f"collectives up by their number (\"seq\"), not by their position in the list")
    if p.trimmed is not None and kind in ("missing", "extra"):
        return (f"rank {p.trimmed}'s list is short only because its Flight Recorder dropped its oldest "
                f"entries (it begins at #{p.records[p.trimmed]['collectives'][0]['seq']}): how far a rank "
                f"got is the number of its last collective, not how many entries it has")
    if kind == "missing":
        return (f"rank {got_rank} is one of the ranks that called collective #{p.seq}; the odd one is the "
                f"rank that never reached it")
    if kind == "extra":
        return (f"rank {got_rank} stopped where most ranks stopped; the odd one is the rank that went on "
                f"to a collective none of the others reached")
    return f"rank {got_rank} called the same as most ranks; find the one rank whose call differs"


def _why_kind(got_kind, p) -> str:
    rank, kind, _ = p.answer
    if type(got_kind) is not str:
        return f"the kind is one of KINDS, a text, not {harness.describe(got_kind)}"
    if got_kind not in ("op", "shape", "dtype", "missing", "extra"):
        return f"the kind is one of KINDS, and {got_kind!r} is not"
    if p.family == "skip" and got_kind == "missing":
        return (f"rank {rank} skipped the barrier, so its next collective took the barrier's number: at "
                f"#{p.seq} it called another collective than the others, which is what it looks like in "
                f"the records (kind \"op\")")
    if kind in ("missing", "extra") and got_kind in ("op", "shape", "dtype"):
        return (f"rank {rank}'s record has no collective #{p.seq} for another rank's to differ from "
                if kind == "missing" else
                f"none of the others has a collective #{p.seq} for rank {rank}'s to differ from ") + \
            "(compare collectives of the same number only); it is about how far each rank got"
    if {kind, got_kind} == {"missing", "extra"}:
        return (f"rank {rank} got less far than the others ({kind!r})" if kind == "missing" else
                f"rank {rank} got further than the others ({kind!r})")
    if kind == "op":
        return f"the op itself differs at #{p.seq}: {p.theirs['op']} vs {p.mine['op']}"
    if kind == "shape":
        return (f"at #{p.seq} the op and the dtypes are the same; the shapes differ "
                f"({p.theirs['shapes']} vs {p.mine['shapes']})")
    if kind == "dtype":
        return (f"at #{p.seq} the op and the shapes are the same; the dtypes differ "
                f"({p.theirs['dtypes']} vs {p.mine['dtypes']})")
    return f"its kind is {kind!r}"


def _why_line(got_line, p) -> str:
    rank, _, line = p.answer
    others = {r["where"] for r in p.dumps if r["rank"] != rank and r.get("where")}
    if line is None:
        return (f"rank {rank} {p.records[rank]['state']}: it is at no line, and its record has no "
                f"\"where\"; return None as its line")
    if not (got_line is None or isinstance(got_line, (str, int))):
        return f"the line is the record's \"where\" as it stands, a text like {line!r}"
    if got_line in others:
        return f"{got_line!r} is where the other ranks are; return the line of rank {rank}"
    if isinstance(got_line, int) or got_line is None:
        return f"the line is the record's \"where\" as it stands, a text like {line!r}"
    return f"return the line rank {rank} is at now, its record's \"where\""


# --- the tests -----------------------------------------------------------------------------

# (what the learner reads about the dumps, how they are built): each answers a shortcut that
# benign records (3 ranks, in rank order, the odd one not first, whole lists) let pass
VARIED = [
    ("records whose odd rank is rank 0", dict(family="wrong_op", world=4, odd=0)),
    ("records in no order (rank 2's record first)", dict(family="dtype", world=3, odd=1, order=[2, 0, 1])),
    ("records whose Flight Recorder lists begin at different numbers",
     dict(family="computes", world=3, odd=2, trim=1)),
    ("records of 6 ranks whose odd rank is rank 4", dict(family="shape", world=6, odd=4)),
    ("records with a transposed tensor", dict(family="shape", world=3, odd=1, transposed=True)),
    ("records of a rank that called one more collective", dict(family="one_more", world=5, odd=3)),
    ("records of a rank that died before its first collective",
     dict(family="dies", world=3, odd=1, before=0)),
]


def known_run():
    """3 ranks, each completed all_reduce #5; then ranks 0 and 1 wait in all_reduce #6 at
    train.py:19 while rank 2 waits in broadcast #6 at train.py:21 (the stub's example)."""
    done = {"group": "0", "seq": 5, "op": "all_reduce", "shapes": [[1000]], "dtypes": ["float32"],
            "done": True}
    dumps = []
    for rank in (0, 1, 2):
        op, line = ("broadcast", "train.py:21") if rank == 2 else ("all_reduce", "train.py:19")
        dumps.append({"rank": rank, "state": "in collective", "where": line, "call": op, "current": 6,
                      "collectives": [dict(done), dict(done, seq=6, op=op, done=False)]})
    return dumps


class Known(Planted):
    def __init__(self, dumps, answer, story):
        self.dumps, self.answer, self._story = dumps, answer, story
        self.records = {d["rank"]: d for d in dumps}
        self.family, self.world, self.odd, self.seq, self.trimmed = "wrong_op", 3, 2, 6, None
        self.theirs = {"op": "all_reduce", "shapes": [[1000]], "dtypes": ["float32"]}
        self.mine = dict(self.theirs, op="broadcast")

    def story(self):
        return self._story


def test_records_whose_answer_is_known():
    harness.judge_here(sys.modules[__name__], [KNOWN], harness.check_seed())


def known_cases(seed) -> list:
    """``(planted, on)``: the stub's example, then fixed records of three more kinds (the same every run)."""
    cases = [(Known(known_run(), (2, "op", "train.py:21"),
                    "at collective #6 rank 2 called broadcast at train.py:21, the others all_reduce"), "")]
    for family, world, odd in (("shape", 3, 1), ("computes", 4, 3), ("skip", 3, 0)):
        cases.append((Planted(random.Random(16), family, world, odd), f"in a hung run of {world} ranks ({family}): "))
    return cases


def test_records_with_a_planted_disagreement_of_every_family():
    harness.judge_here(sys.modules[__name__], [PLANTED], harness.check_seed())


def planted_cases(seed) -> list:
    """``(planted, on)``: a disagreement of every family, then the VARIED records, drawn from ``seed``."""
    rng, cases = random.Random(seed), []
    for family in KIND_OF:
        world = rng.randint(3, 6)
        odd = rng.randrange(world)
        order = rng.sample(range(world), world) if rng.random() < 0.5 else None
        on = f"in a hung run of {world} ranks ({family}) {harness.replay(seed)}: "
        cases.append((Planted(rng, family, world, odd, order=order), on))
    for description, how in VARIED:
        cases.append((Planted(rng, **how), f"in {description} {harness.replay(seed)}: "))
    return cases


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# The check plants each answer itself: the judge rebuilds the records from the seed and
# compares the learner's answers with the planted ones (the reference's data is not needed).

KNOWN, PLANTED = "records whose answer is known", "records with a planted disagreement of every family"
PARTS = (KNOWN, PLANTED)
CASES = {KNOWN: known_cases, PLANTED: planted_cases}


def collect(part, whos, seed):
    """``{who: [diagnose's outcome on each case's records]}``, up to the first wrong one."""
    found = {}
    for who in whos:
        ex, results = harness.answer("16", who), []
        for planted, on in CASES[part](seed):
            results.append(diagnosed(ex, planted, on))
            if not _right(results[-1].get("returned"), planted):
                break
        found[who] = results
    return found


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` at the first case ``got`` answers wrong."""
    if not isinstance(got, list):
        raise harness.ExerciseFailure(f"the check's data should hold a list of answers, got {harness.describe(got)}")
    for i, (planted, on) in enumerate(CASES[part](seed)):
        judge_one(got[i] if i < len(got) else None, planted, on)
