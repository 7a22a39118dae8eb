"""The families of hangs, as data: draw a run's collectives, plant one disagreement at
one rank, and build each rank's record as :mod:`distkit.observe.hang_records` writes it
(a rank waiting in the collective it is stuck in; the collectives before it completed).

tests/observe/test_hangs.py checks the doctor's verdicts on them. Each case says what a correct diagnosis names: ``(rank, kind, line)``, kinds:

- ``op``: the rank called a different collective at that number (wrong op, other order);
- ``shape`` / ``dtype``: the same collective with different tensors;
- ``missing``: the rank never reached a collective another rank waits in (skipped it,
  computes, ended, died, or stuck making a group the others did not make).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

FAMILIES = ("wrong_op", "shape", "dtype", "order", "skip", "one_more", "computes", "dies",
            "new_group")
OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


@dataclass
class Case:
    family: str
    world: int
    rank: int  # the rank that does something else
    kind: str  # op / shape / dtype / missing
    line: str  # that rank's line where it went its own way
    records: list = field(default_factory=list)


def _call(op, shape, dtype, line):
    return {"op": op, "shapes": [list(shape)] if op != "barrier" else [],
            "dtypes": [dtype] if op != "barrier" else [], "line": line}


def _entries(calls, group="0"):
    return [{"group": group, "seq": i + 1, "op": c["op"], "shapes": c["shapes"],
             "dtypes": c["dtypes"], "done": True} for i, c in enumerate(calls)]


def _stuck(rank, calls, error=None):
    """A rank that called ``calls`` and waits (or raised) in the last one."""
    entries = _entries(calls)
    entries[-1]["done"] = False
    record = {"rank": rank, "state": "raised" if error else "in collective",
              "where": calls[-1]["line"], "call": calls[-1]["op"], "current": len(calls),
              "collectives": entries}
    if error:
        record["error"] = error
    return record


@st.composite
def cases(draw, families=FAMILIES, worlds=(2, 3, 4)):
    family = draw(st.sampled_from(families))
    world = draw(st.sampled_from(worlds))
    odd = draw(st.integers(0, world - 1))
    n = draw(st.integers(1, 6))  # collectives every rank completed before
    lines = iter(draw(st.lists(st.integers(5, 400), min_size=n + 4, max_size=n + 4,
                               unique=True)))
    script = draw(st.sampled_from(["train.py", "eval.py", "course/step.py"]))

    def call(op=None, shape=None, dtype="float32"):
        op = op or draw(st.sampled_from(OPS))
        shape = shape or [draw(st.integers(1, 4096))]
        return _call(op, shape, dtype, f"{script}:{next(lines)}")

    before = [call() for _ in range(n)]
    stuck = call()
    error = draw(st.sampled_from([None, "RuntimeError: Timed out waiting 5000ms for recv "
                                        "operation to complete"]))
    case = Case(family, world, odd, "", "")
    if family in ("wrong_op", "order"):
        other_op = draw(st.sampled_from([o for o in OPS if o != stuck["op"]]))
        if family == "order":  # the odd rank calls the next two in the other order
            mine = dict(call(op=other_op), line=f"{script}:{next(lines)}")
        else:
            mine = dict(stuck, op=other_op, line=f"{script}:{next(lines)}")
        case.kind, case.line = "op", mine["line"]
    elif family == "shape":
        size = stuck["shapes"][0][0] + draw(st.integers(1, 100))
        mine = dict(stuck, shapes=[[size]])
        case.kind, case.line = "shape", mine["line"]
    elif family == "dtype":
        mine = dict(stuck, dtypes=[draw(st.sampled_from(["float64", "float16", "int64"]))])
        case.kind, case.line = "dtype", mine["line"]
    else:
        mine = None
        case.kind = "missing"
    records = []
    for rank in range(world):
        if rank != odd or mine is not None:
            records.append(_stuck(rank, before + [mine if rank == odd else stuck], error))
    if mine is None:
        records.insert(odd, _missing(family, odd, before, stuck, call, draw))
        case.line = records[odd].get("where") or stuck["line"]
        if family == "skip":  # the others wait in the barrier the odd rank skipped
            barrier = _call("barrier", [], "float32", stuck["line"])
            for r in records:
                if r["rank"] != odd:
                    r.update(_stuck(r["rank"], before + [barrier], error))
            case.line = stuck["line"]
        if family == "one_more":  # the others ended; the odd rank waits in one more
            records = [r if r["rank"] == odd else
                       {"rank": r["rank"], "state": "ended", "collectives": _entries(before)}
                       for r in records]
            case.line = stuck["line"]
    case.records = records
    return case


def _missing(family, rank, before, stuck, call, draw):
    """The odd rank's record when it never reached ``stuck``."""
    done = _entries(before)
    if family == "skip":  # skipped the barrier: it waits in the next collective
        record = _stuck(rank, before + [stuck])
        return record
    if family == "one_more":  # the others ended; this rank calls one more
        return _stuck(rank, before + [stuck])
    if family == "computes":
        return {"rank": rank, "state": "computing", "where": call()["line"], "call": None,
                "current": None, "collectives": done}
    if family == "dies":
        return {"rank": rank, "state": "died", "signal": draw(st.sampled_from(
            ["SIGKILL", "SIGSEGV"])), "collectives": []}
    return {"rank": rank, "state": "in collective", "where": call()["line"],
            "call": "new_group", "current": None, "collectives": done}
