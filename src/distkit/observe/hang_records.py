"""Each rank's record for the hang doctor (:mod:`distkit.observe.hangs`), and the
supervisor's side that gathers them.

In a rank the kit starts, :func:`arm` starts a thread that waits for the supervisor's
request (a file in the run's failure folder) and then writes ``hang-rank<R>.json``: the
rank's Flight Recorder dump (torch records every collective: op, sequence number,
shapes, dtypes, whether it completed) and where its main thread is (its Python stack,
read from another thread as ``faulthandler`` does). A rank whose collective raised
writes its record itself (:func:`write_raised`) before it exits.

Torch's dump is ``_dump_fr_trace_json``: it answers in microseconds from any thread.
The pickled dump with each entry's Python frames (``_dump_fr_trace``) imports
torch._inductor on first use (8 s on the 2-core VM) and does not return from a second
thread while the main thread computes, so the line of a collective is read from the
main thread's stack instead: known for the collective a rank is in, not for those it
went past.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from distkit.observe.failures import KIT_ROOT, _library_roots, shown_path
from distkit.observe.hangs import collectives_from_fr

REQUEST = "hang-request"  # the supervisor creates it: every live rank writes its record
_C10D = os.sep + os.path.join("torch", "distributed") + os.sep


def record_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"hang-rank{rank}.json")


def _flight_recorder() -> list[dict]:
    try:
        import torch._C._distributed_c10d as c10d

        return collectives_from_fr(json.loads(c10d._dump_fr_trace_json()))
    except Exception:  # no process group yet, or a torch without the recorder
        return []


def _where(frames) -> tuple[str | None, str | None]:
    """``(file:line, call)``: the innermost frame of the user's code, and the
    torch.distributed function it called (None when it is not inside one)."""
    libraries = _library_roots()
    user_at = None
    for i, f in enumerate(frames):
        path = os.path.realpath(f.filename)
        if not (f.filename.startswith("<") or path.startswith(libraries)
                or path.startswith(KIT_ROOT)):
            user_at = i
    if user_at is None:
        return None, None
    where = f"{shown_path(frames[user_at].filename)}:{frames[user_at].lineno}"
    called = [f for f in frames[user_at + 1:]
              if _C10D in f.filename and os.path.basename(f.filename) == "distributed_c10d.py"]
    return where, (called[0].name if called else None)


def _current(collectives: list[dict], call: str | None, raised: bool) -> int | None:
    """The number of the collective the rank is in (or raised in)."""
    if not call or not collectives:
        return None
    pending = [c for c in collectives if not c["done"]]
    if pending:
        return pending[-1]["seq"]
    last = collectives[-1]
    return last["seq"] if raised and call.lstrip("_").startswith(last["op"].lstrip("_")) else None


def live_record(rank: int, frame) -> dict:
    """The record of a rank that is still running, its main thread at ``frame``."""
    where, call = _where(traceback.extract_stack(frame)) if frame else (None, None)
    collectives = _flight_recorder()
    seq = _current(collectives, call, raised=False)
    state = "in collective" if call else "computing"
    return {"rank": rank, "state": state, "where": where, "call": call, "current": seq,
            "collectives": collectives}


def raised_record(rank: int, error: BaseException) -> dict:
    from distkit.observe.failures import first_line

    where, call = _where(traceback.extract_tb(error.__traceback__))
    collectives = _flight_recorder()
    return {"rank": rank, "state": "raised", "where": where, "call": call,
            "current": _current(collectives, call, raised=True),
            "error": f"{type(error).__name__}: {first_line(error)}"[:200],
            "collectives": collectives}


def _write(folder: str, record: dict) -> None:
    path = record_path(folder, record["rank"])
    try:
        with open(path + ".partial", "w") as f:
            json.dump(record, f)
        os.replace(path + ".partial", path)
    except OSError:
        pass


def write_raised(folder: str, rank: int, error: BaseException) -> None:
    """A rank whose code raised: its record, before it exits."""
    _write(folder, raised_record(rank, error))


def arm(folder: str, rank: int, poll_s: float = 0.1) -> threading.Thread:
    """Start the thread that writes this rank's record when the supervisor asks."""
    main = threading.main_thread().ident

    def watch():
        request = os.path.join(folder, REQUEST)
        while not os.path.exists(request):
            time.sleep(poll_s)
        if not os.path.exists(record_path(folder, rank)):
            _write(folder, live_record(rank, sys._current_frames().get(main)))

    thread = threading.Thread(target=watch, name="distkit-hang-records", daemon=True)
    thread.start()
    return thread


# --- the supervisor's side ---------------------------------------------------------------

def gather(folder: str, codes: dict, wait_s: float = 3.0) -> list[dict]:
    """Ask every live rank for its record and read them all; ``codes``: rank -> exit
    status (None while running, negative for a signal). A rank that ended or died
    without a record gets one that says so."""
    try:
        open(os.path.join(folder, REQUEST), "w").close()
    except OSError:
        return []
    deadline = time.monotonic() + wait_s
    records = {}
    while True:
        for rank in codes:
            if rank not in records:
                try:
                    with open(record_path(folder, rank)) as f:
                        records[rank] = json.load(f)
                except (OSError, ValueError):
                    pass
        waiting = [r for r, c in codes.items() if r not in records and c in (None, 1)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for rank, code in codes.items():
        if rank not in records:
            records[rank] = _ended(rank, code)
    return [records[r] for r in sorted(records)]


def _ended(rank: int, code: int | None) -> dict:
    if code is not None and code < 0:
        return {"rank": rank, "state": "died", "signal": signal.Signals(-code).name,
                "collectives": []}
    if code == 0:
        return {"rank": rank, "state": "ended", "collectives": []}
    state = "died" if code is not None else "computing"
    return {"rank": rank, "state": state, "signal": f"exit {code}" if code else None,
            "collectives": []}


def involves_collectives(records: list[dict]) -> bool:
    """Whether the doctor has something to say: a rank is in, or raised in, a collective."""
    return any(r.get("current") is not None or r.get("call") for r in records)


def doctor_lines(folder: str, codes: dict, wait_s: float = 3.0) -> list[str]:
    """The doctor's lines for a run where a rank failed, or [] when no rank was in a
    collective."""
    from distkit.observe.hangs import diagnose

    records = gather(folder, codes, wait_s)
    return diagnose(records) if involves_collectives(records) else []
