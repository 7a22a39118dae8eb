"""The hang doctor: from what each rank was doing, say which rank is where and why.

Pure functions over data. Each rank's record is a dict (what
:mod:`distkit.observe.hang_records` writes, and what exercise 16 hands the learner)::

    {"rank": 1,
     "state": "in collective" | "raised" | "computing" | "ended" | "died",
     "where": "train.py:21",        # the user's line the rank is at (or raised at)
     "call": "all_reduce",          # the torch.distributed function it is inside, if any
     "current": 6,                  # the collective it is in (or raised in), if any
     "signal": "SIGKILL",           # for a rank that died
     "error": "Timed out ...",      # for a rank that raised
     "collectives": [{"group": "0", "seq": 1, "op": "all_reduce", "shapes": [[1000]],
                      "dtypes": ["float32"], "done": True}, ...]}

``collectives`` is the rank's Flight Recorder dump (torch's
``_dump_fr_trace_json``), one entry per collective in the order the rank called them,
numbered per process group (:func:`collectives_from_fr` reads torch's format).

:func:`rank_lines` says, one line per rank, what it was doing; :func:`verdict` says what
the ranks disagree on: different collectives at one number, different shapes or dtypes,
a rank that never reached a collective another rank waits in.
"""
from __future__ import annotations

import math

# torch's scalar type names (c10's ScalarType) as Python users write them
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def collectives_from_fr(fr: dict) -> list[dict]:
    """The entries of a Flight Recorder dump (``json.loads(_dump_fr_trace_json())``),
    each as ``{group, seq, op, shapes, dtypes, done}``; point-to-point ones left out."""
    out = []
    for e in fr.get("entries", []):
        if e.get("is_p2p"):
            continue
        op = e.get("profiling_name", "?").split(":")[-1]
        out.append({"group": str(e.get("pg_id", 0)),
                    "seq": int(e.get("collective_seq_id", 0)), "op": op,
                    "shapes": [list(s) for s in e.get("input_sizes", [])],
                    "dtypes": [_DTYPES.get(d, d) for d in e.get("input_dtypes", [])],
                    "done": bool(e.get("retired"))})
    return out


def without_fingerprints(collectives: list[dict]) -> list[dict]:
    """Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` each group has a helper group on which
    torch all-gathers every collective's fingerprint (int64 tensors) before running it:
    leave the helper groups' entries out."""
    fingerprint = lambda c: c["op"] == "all_gather" and c["dtypes"] == ["int64"]  # noqa: E731
    helpers = {c["group"] for c in collectives} - {
        c["group"] for c in collectives if not fingerprint(c)}
    return [c for c in collectives if c["group"] not in helpers]


def tensors(c: dict) -> str:
    """``float32[1000]``: a collective's input tensors, as its call passed them."""
    parts = [f"{d}[{', '.join(map(str, s))}]" for d, s in zip(c["dtypes"], c["shapes"])]
    return ", ".join(parts)


def elements(c: dict) -> int:
    return sum(math.prod(s) for s in c["shapes"])


def named(c: dict) -> str:
    """``all_reduce #6 (float32[1000])``; a subgroup's collective says its group."""
    group = "" if c["group"] in ("0", "") else f" on group {c['group']}"
    shown = tensors(c)
    return f"{c['op']} #{c['seq']}{group}" + (f" ({shown})" if shown else "")


def _by_key(record: dict) -> dict:
    return {(c["group"], c["seq"]): c for c in record.get("collectives", [])}


def current(record: dict) -> dict | None:
    """The collective the rank is in (or raised in), or None."""
    seq = record.get("current")
    if seq is None:
        return None
    mine = [c for c in record.get("collectives", []) if c["seq"] == seq]
    return mine[-1] if mine else None


def rank_line(record: dict) -> str:
    """What one rank was doing, in words, at the user's line."""
    who, state, where = f"rank {record['rank']}", record.get("state"), record.get("where")
    at = f" at {where}" if where else ""
    if state == "died":
        inside = f" in {record['call']}" if record.get("call") else ""
        return f"{who}: died" + (f" ({record['signal']})" if record.get("signal") else "") + \
            inside + at
    if state == "ended":
        return f"{who}: ended"
    c = current(record)
    if state == "raised":
        what = f"{named(c)} failed" if c else (
            f"{record['call']} failed" if record.get("call") else "raised")
        error = record.get("error")
        return f"{who}: {what}{at}" + (f": {error}" if error else "")
    if c is not None:
        return f"{who}: in {named(c)}{at}"
    if record.get("call"):
        return f"{who}: in {record['call']} (not a recorded collective){at}"
    return f"{who}: not in a collective:{at or ' where unknown'}"


def rank_lines(records: list[dict]) -> list[str]:
    return [rank_line(r) for r in sorted(records, key=lambda r: r["rank"])]


def line_of(record: dict, c: dict) -> str:
    """`` at train.py:15`` when the rank is at that collective now; its line is not
    recorded for the collectives it went past."""
    mine = current(record)
    if mine is not None and (mine["group"], mine["seq"]) == (c["group"], c["seq"]) \
            and record.get("where"):
        return f" at {record['where']}"
    return ""


def _differ(a: dict, ra: dict, b: dict, rb: dict) -> str | None:
    """The verdict when rank ``ra`` and ``rb`` disagree at one collective number."""
    wa, wb = line_of(ra, a), line_of(rb, b)
    who = f"rank {ra['rank']} and rank {rb['rank']}"
    if a["op"] != b["op"]:
        for x, rx, y, ry, wy in ((a, ra, b, rb, wb), (b, rb, a, ra, wa)):
            if x["op"] == "barrier" and line_of(rx, x):
                return (f"rank {ry['rank']} never reached barrier #{x['seq']}{line_of(rx, x)} "
                        f"(it is in {y['op']} #{y['seq']}{wy})")
        return (f"{who} called different collectives (#{a['seq']}: {a['op']}{wa} vs "
                f"{b['op']}{wb})")
    if a["shapes"] != b["shapes"]:
        if a["op"] in ("all_gather", "_allgather_base", "allgather_into_tensor_coalesced"):
            sizes = (f"{elements(a)} vs {elements(b)} elements{wa or wb}" if wa == wb or not
                     (wa and wb) else f"{elements(a)} elements{wa} vs {elements(b)}{wb}")
            return (f"the ranks all-gathered different sizes ({sizes}; rank {ra['rank']} and "
                    f"rank {rb['rank']}, {a['op']} #{a['seq']})")
        return (f"{who} passed different shapes to {a['op']} #{a['seq']} ({tensors(a)}{wa} "
                f"vs {tensors(b)}{wb})")
    if a["dtypes"] != b["dtypes"]:
        return (f"{who} passed different dtypes to {a['op']} #{a['seq']} ({tensors(a)}{wa} "
                f"vs {tensors(b)}{wb})")
    return None


def first_difference(records: list[dict]) -> str | None:
    """The first collective number (in call order) at which two ranks' records differ."""
    tables = [(r, _by_key(r)) for r in sorted(records, key=lambda r: r["rank"])]
    keys = sorted({k for _, t in tables for k in t}, key=lambda k: (k[1], k[0]))
    for key in keys:
        having = [(r, t[key]) for r, t in tables if key in t]
        kinds = {}
        for r, c in having:
            kinds.setdefault((c["op"], str(c["shapes"]), str(c["dtypes"])), []).append((r, c))
        if len(kinds) < 2:
            continue
        # the odd one out against the most common call (the lower rank on a tie)
        ranked = sorted(kinds.values(), key=lambda g: (-len(g), g[0][0]["rank"]))
        (ra, a), (rb, b) = ranked[0][0], ranked[1][0]
        if ra["rank"] > rb["rank"]:
            (ra, a), (rb, b) = (rb, b), (ra, a)
        said = _differ(a, ra, b, rb)
        if said:
            return said
    return None


def _behind(waiting: dict, c: dict, other: dict) -> str:
    """Rank ``other`` never reached collective ``c`` that rank ``waiting`` is in."""
    how = rank_line(other).split(": ", 1)[1]
    mine, at = current(other), f" at {other['where']}" if other.get("where") else ""
    if other.get("state") in ("died", "ended"):
        how = f"it {how}"
    elif mine is not None:
        how = f"it is in {named(mine)}{line_of(other, mine)}"
    elif other.get("state") == "raised":
        inside = f" in {other['call']}" if other.get("call") else ""
        how = f"it raised{inside}{at}: {other.get('error', '')}"
    else:
        how = f"it is {how}"
    if other.get("state") == "died":
        said = (f"rank {other['rank']} {how[3:]} while rank {waiting['rank']} was in "
                f"{c['op']} #{c['seq']}{line_of(waiting, c)}")
    else:
        said = (f"rank {other['rank']} never reached {c['op']} #{c['seq']}, which rank "
                f"{waiting['rank']} waits in{line_of(waiting, c)} ({how})")
    if other.get("signal") == "SIGABRT":  # gloo aborts a rank sent more bytes than it expects
        said += (f"; gloo aborts a rank that receives more data than its tensor holds: do the "
                 f"ranks' shapes or dtypes differ at {c['op']} #{c['seq']}? --debug-collectives "
                 "compares them before each collective")
    return said


def verdict(records: list[dict]) -> str:
    """What the ranks disagree on, in one sentence."""
    said = first_difference(records)
    if said:
        return said
    for waiting in sorted(records, key=lambda r: r["rank"]):
        c = current(waiting)
        if c is None:
            continue
        for other in sorted(records, key=lambda r: r["rank"]):
            if other is not waiting and (c["group"], c["seq"]) not in _by_key(other) \
                    and _in_group(other, c, records):
                return _behind(waiting, c, other)
    return "the ranks' recorded collectives agree: no collective disagreement found"


def _in_group(other: dict, c: dict, records: list[dict]) -> bool:
    """Whether ``other`` takes part in ``c``'s group: the default group has every rank;
    of a subgroup, a rank that recorded any collective on it (or an earlier one)."""
    if c["group"] in ("0", ""):
        return True
    return any(x["group"] == c["group"] for x in other.get("collectives", []))


def diagnose(records: list[dict]) -> list[str]:
    """One line per rank, then ``verdict: ...``."""
    return rank_lines(records) + [f"verdict: {verdict(records)}"]
