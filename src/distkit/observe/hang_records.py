"""Each rank's record for the hang doctor (:mod:`distkit.observe.hangs`), and the
supervisor's side that gathers them.

In a rank the kit starts, :func:`arm` starts a thread that waits for the supervisor's
request (a file in the run's failure folder) and then writes ``hang-rank<R>.json``: the
rank's Flight Recorder dump (torch records every collective: op, sequence number,
shapes, dtypes, whether it completed) and where its main thread is (its Python stack,
read from another thread as ``faulthandler`` does). A rank whose collective raised
writes its record itself (:func:`write_raised`) before it exits. Ranks joined to a
torchrun or srun launch, with no supervisor of the kit above them, meet in the run folder
instead, and the first whose collective fails prints (:func:`arm_joined`,
:func:`joined_rank_failed`).

Torch's dump is ``_dump_fr_trace_json``: it answers in microseconds from any thread.
The pickled dump with each entry's Python frames (``_dump_fr_trace``) imports
torch._inductor on first use (8 s on the 2-core VM) and does not return from a second
thread while the main thread computes, so the line of a collective is read from the
main thread's stack instead: known for the collective a rank is in, not for those it
went past.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
import types

from distkit.host.files import write_json_quietly
from distkit.observe.failures import (KIT_ROOT, PEER_LOST_WORDS, _create_once, _library_roots, peer_lost,
                                     run_dir_of_this_process, shown_path)
from distkit.observe.hangs import collectives_from_fr, without_fingerprints


REQUEST = "hang-request"  # the supervisor creates it: every live rank writes its record


def _shown(path: str) -> str:
    """``distkit/train/training.py`` for the kit's files, else as a learner reads it."""
    real = os.path.realpath(path)
    if real.startswith(KIT_ROOT):
        return "distkit/" + real[len(KIT_ROOT):]
    return shown_path(path)


def record_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"hang-rank{rank}.json")


def _flight_recorder() -> list[dict]:
    try:
        import torch
        import torch._C._distributed_c10d as c10d

        dumps = [c10d._dump_fr_trace_json]  # the instance gloo's groups record into
        if torch.cuda.is_initialized() and hasattr(c10d, "_dump_nccl_trace_json"):
            dumps.append(c10d._dump_nccl_trace_json)  # nccl's groups record into their own
        entries = [e for dump in dumps for e in json.loads(dump()).get("entries", [])]
        entries.sort(key=lambda e: e.get("time_created_ns", 0))
        collectives = collectives_from_fr({"entries": entries})
    except Exception:  # no process group yet, or a torch without the recorder
        return []
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        collectives = without_fingerprints(collectives)
    return collectives


def _stack(frame) -> list:
    """The frames from the outermost to ``frame``."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _where(frames) -> tuple[str | None, object | None]:
    """``(file:line, c10d frame)``: the innermost frame of the user's code, and the frame
    of the torch.distributed function it called (None when it is not inside one)."""
    libraries = _library_roots()
    user_at = kit_at = None
    for i, f in enumerate(frames):
        name = f.f_code.co_filename
        path = os.path.realpath(name)
        if path.startswith(KIT_ROOT):
            kit_at = i
        elif not (name.startswith("<") or path.startswith(libraries)):
            user_at = i
    if user_at is None:  # the kit's own step (DDP's backward, say): its line then
        user_at = kit_at
    if user_at is None:
        return None, None
    f = frames[user_at]
    where = f"{_shown(f.f_code.co_filename)}:{f.f_lineno}"
    called = [f for f in frames[user_at + 1:]
              if f.f_code.co_filename.endswith(os.path.join("torch", "distributed",
                                                            "distributed_c10d.py"))
              and waits_on_others(f.f_code.co_name)]
    return where, (called[0] if called else None)


def waits_on_others(function: str) -> bool:
    """Whether torch.distributed's ``function`` can wait on other ranks: a collective, or a
    call that makes a group (``new_group`` waits in the store for every member). Only the
    functions torch.distributed offers its users (its ``__all__``) call other ranks; a
    question about this process (``get_rank``, ``is_initialized``: a loop that spins asking
    it is computing, not waiting) does not, nor does anything such a question passes
    through: torch's helpers (``_get_default_group``), ``GroupMember.WORLD``'s getter."""
    return function in _public_c10d() and not function.startswith(
        ("get_", "is_", "supports_", "set_", "record_"))  # set_timeout, record_comm: this process's settings


@functools.lru_cache(maxsize=1)
def _public_c10d() -> frozenset:
    import torch.distributed.distributed_c10d as c10d

    functions = vars(c10d)  # type(), not getattr: torch warns at a read of its deprecated names
    return frozenset(name for name in c10d.__all__ if type(functions.get(name)) is types.FunctionType)


def is_collective(function: str) -> bool:
    """Whether torch.distributed's ``function`` is a collective the Flight Recorder numbers:
    it waits on other ranks, and does not make or end groups."""
    return waits_on_others(function) and not function.startswith(
        ("new_", "init_", "destroy_", "split_", "shrink_"))


_TENSOR_ARGUMENTS = ("tensor", "input_tensor", "input", "tensor_list", "input_tensor_list",
                     "object_list", "obj")


def _called(c10d_frame) -> dict | None:
    """A collective the rank called but torch did not record (it raised before), from
    its call's arguments: op, shapes, dtypes, its group's name."""
    import torch

    op = c10d_frame.f_code.co_name
    if not is_collective(op):
        return None
    args = c10d_frame.f_locals
    for name in _TENSOR_ARGUMENTS:
        value = args.get(name)
        found = [value] if isinstance(value, torch.Tensor) else (
            [v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, list) else [])
        if found:
            return {"op": op, "shapes": [list(t.shape) for t in found],
                    "dtypes": [str(t.dtype).replace("torch.", "") for t in found],
                    "done": False}
    return {"op": op, "shapes": [], "dtypes": [], "done": False}  # barrier: no tensors


def _record(rank: int, state: str, innermost, raised: bool, error_text: str = "") -> dict:
    where, c10d_frame = _where(_stack(innermost)) if innermost is not None else (None, None)
    call = c10d_frame.f_code.co_name if c10d_frame is not None else None
    collectives = _flight_recorder()
    # a collective that raised before torch started it (its checks, or DETAIL's
    # fingerprints disagreeing) has no ``work`` yet and no entry: make it from its call
    started = c10d_frame is not None and "work" in c10d_frame.f_locals
    seq = _current(collectives, call) if started or not raised else None
    if seq is None and c10d_frame is not None:
        made = _called(c10d_frame)  # raised before torch recorded it: the next number
        if made is not None:
            group = collectives[-1]["group"] if collectives else "0"
            seq = 1 + max([c["seq"] for c in collectives if c["group"] == group], default=0)
            collectives.append({"group": group, "seq": seq, **made})
    lost = any(words in (error_text or "").lower() for words in PEER_LOST_WORDS)
    if seq is None and call is None and collectives and (lost or not raised and not collectives[-1]["done"]):
        # a collective started outside Python (DDP's all-reduce from autograd's hooks); a rank
        # that raised in its own code (a refusal after an all_gather the recorder had not
        # marked done) failed in no collective, whatever the recorder's last entry says
        seq, call = collectives[-1]["seq"], collectives[-1]["op"]
    if state == "live":
        state = "in collective" if call else "computing"
    return {"rank": rank, "state": state, "where": where, "call": call, "current": seq,
            "collectives": collectives}


def _same_op(call: str, op: str) -> bool:
    """Whether torch.distributed's function ``call`` records as ``op``
    (``all_gather_into_tensor`` as ``_allgather_base``)."""
    return call.replace("_", "")[:6] == op.replace("_", "")[:6]


def _current(collectives: list[dict], call: str | None) -> int | None:
    """The number of the collective the rank is in (or raised in): torch records a
    collective as it starts, so it is the last one recorded when that is the call."""
    if not call or not collectives:
        return None
    last = collectives[-1]
    return last["seq"] if _same_op(call, last["op"]) else None


def live_record(rank: int, frame) -> dict:
    """The record of a rank that is still running, its main thread at ``frame``."""
    return _record(rank, "live", frame, raised=False)


def raised_record(rank: int, error: BaseException) -> dict:
    from distkit.observe.failures import first_line

    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    record = _record(rank, "raised", tb.tb_frame if tb is not None else None, raised=True,
                     error_text=str(error))
    record["error"] = f"{type(error).__name__}: {first_line(error)}"[:200]
    return record


def _write(folder: str, record: dict) -> None:
    write_json_quietly(record_path(folder, record["rank"]), record)


# One record per rank: the watcher's live one is never written over the rank's own raised one
_writing = threading.Lock()


def write_raised(folder: str, rank: int, error: BaseException) -> None:
    """A rank whose code raised: its record, before it exits."""
    with _writing:
        _write(folder, raised_record(rank, error))


def _answer(folder: str, rank: int, main: int) -> bool:
    """Write the live record of this rank (its main thread's ident: ``main``) unless it
    has written its own; True when this call wrote it."""
    with _writing:  # checked and written at once: the rank raising meanwhile waits
        if os.path.exists(record_path(folder, rank)):
            return False
        _write(folder, live_record(rank, sys._current_frames().get(main)))
        return True


def arm(folder: str, rank: int, poll_s: float = 0.1) -> threading.Thread:
    """Start the thread that writes this rank's record when the supervisor asks."""
    main = threading.main_thread().ident

    def watch():
        request = os.path.join(folder, REQUEST)
        while not os.path.exists(request):
            time.sleep(poll_s)
        _answer(folder, rank, main)

    try:  # a rank that gloo aborts (SIGABRT) or that crashes leaves its Python stack here
        import faulthandler

        faulthandler.enable(open(os.path.join(folder, f"crash-rank{rank}.txt"), "w"))
    except OSError:
        pass
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
            where, call = crash_site(os.path.join(folder, f"crash-rank{rank}.txt"))
            records[rank].update(where=where, call=call)
    return [records[r] for r in sorted(records)]


def crash_site(path: str) -> tuple[str | None, str | None]:
    """``(file:line, torch.distributed call)`` of the main thread in ``faulthandler``'s
    report of a crashed rank (its format: ``File "train.py", line 21 in <module>``, most
    recent call first; the main thread is the one running ``<module>``), or Nones.

    The one place a text is read back: a rank that gloo aborts (SIGABRT in C++) runs no
    more Python, and faulthandler's report, written by the interpreter at the signal, is
    all it leaves; every other failure travels as a record."""
    import re

    libraries = _library_roots()
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None, None
    threads = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    main = next((t for t in threads if " in <module>" in t), threads[-1])
    call = None
    for name, line, function in re.findall(r'File "([^"]+)", line (\d+) in (\S+)', main):
        path = os.path.realpath(name)
        if name.endswith(os.path.join("torch", "distributed", "distributed_c10d.py")):
            if waits_on_others(function):  # the outermost torch.distributed frame is the user's call
                call = function
        elif not (name.startswith("<") or path.startswith(libraries) or path.startswith(KIT_ROOT)):
            return f"{_shown(name)}:{line}", call
    return None, None


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
    """Whether the run failed on a collective: a rank raised inside torch.distributed, or
    one died while another waited in a collective. A rank that raised in its own code
    while the others waited for it is the failure line's business alone."""
    raised = [r for r in records if r.get("state") == "raised"]
    if raised:  # one rank's own error first, then its peers lost in a collective: its line says it
        return all(r.get("call") for r in raised)
    return any(r.get("state") == "died" for r in records) and \
        any(r.get("call") for r in records if r.get("state") == "in collective")


def doctor_lines(folder: str, codes: dict, wait_s: float = 3.0) -> tuple[list[str], list[int]]:
    """The doctor's lines for a run where a rank failed, or [] when no rank was in a
    collective; and the ranks that were in a collective then (not busy in their own code)."""
    from distkit.observe.hangs import diagnose

    records = gather(folder, codes, wait_s)
    waiting = [r["rank"] for r in records if r.get("call")]
    return (diagnose(records) if involves_collectives(records) else []), waiting


# --- ranks under a launcher that ends them all when one fails (torch's spawn, torchrun) ---

FOLDER_VARIABLE = "DISTKIT_HANG_RECORDS"  # the launcher's folder for the records


def in_collective(error: BaseException) -> bool:
    """Whether ``error`` was raised inside a torch.distributed call."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(
                os.path.join("torch", "distributed", "distributed_c10d.py")):
            return True
        tb = tb.tb_next
    return False


def _wait_for_records(folder: str, world: int, wait_s: float) -> bool:
    """Whether every rank's record came within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while not all(os.path.exists(record_path(folder, r)) for r in range(world)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def on_rank_failure(rank: int, world: int, error: BaseException, wait_s: float = 2.0) -> None:
    """In a rank that raised, before it exits (its launcher then ends the others): write
    its record; where a collective raised, ask the others for theirs, waiting up to
    ``wait_s``."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder:
        return
    write_raised(folder, rank, error)  # an error in its own code too: then no verdict is due
    # a collective started outside Python (DDP's, from autograd's hooks) raises from the
    # backward call: its message says a peer was lost or late
    if not (in_collective(error) or peer_lost(error)):
        return
    try:
        open(os.path.join(folder, REQUEST), "w").close()
    except OSError:
        return
    _wait_for_records(folder, world, wait_s)


def doctor_lines_after(folder: str, world: int) -> list[str]:
    """The doctor's lines from the records the ranks left in ``folder`` (a rank with none
    was ended before it could write one), or [] when no rank was in a collective."""
    from distkit.observe.hangs import diagnose

    records = []
    for rank in range(world):
        try:
            with open(record_path(folder, rank)) as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            where, call = crash_site(os.path.join(folder, f"crash-rank{rank}.txt"))
            records.append({"rank": rank, "state": "died" if where else "computing",
                            "where": where, "call": call, "collectives": []})
    return diagnose(records) if involves_collectives(records) else []


def folder_for_ranks() -> str:
    """A folder for the records of the ranks this launcher starts, named to them in
    :data:`FOLDER_VARIABLE`."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="distkit-hangs-")
    os.environ[FOLDER_VARIABLE] = folder
    return folder


def arm_from_environment() -> None:
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder and os.path.isdir(folder):
        import ignite.distributed as idist

        arm(folder, idist.get_rank())


def print_doctor_lines(folder: str, world: int) -> None:
    print_lines(doctor_lines_after(folder, world))


def print_lines(lines: list[str]) -> None:
    for line in lines:
        sys.stderr.write(f"distkit: hang: {line}\n")
    sys.stderr.flush()


def drop_folder(folder: str) -> None:
    import shutil

    if os.environ.get(FOLDER_VARIABLE) == folder:
        del os.environ[FOLDER_VARIABLE]
    shutil.rmtree(folder, ignore_errors=True)


# --- ranks joined to a torchrun / SLURM launch: no supervisor of the kit above them -------
#
# The records meet in the run folder, which every node of a cluster already shares (its
# checkpoints need that): ``<run>/hangs/``. The first rank whose collective fails claims
# the request file (created exclusively: one claim however many ranks fail at once),
# asks the others for their records, and prints the lines; the others print none. A rank
# that only answered (its main thread computing, or still waiting in a collective) then
# ends itself: torchrun's agent and srun end a rank with SIGTERM, which training only
# notes until its next iteration, which a stalled rank never reaches (then SIGKILL
# 30 s later).

HANGS = "hangs"  # inside the run folder
PRINTED = "hang-printed"  # the rank that printed the lines creates it: the others may end
JOINED_POLL_S = 0.5  # a stat of the shared folder per rank: slower than the spawned ranks' 0.1 s
JOINED_WAIT_S = 3.0  # the claiming rank's wait for the records: six polls of the others

_joined: list[threading.Thread] = []


def joined_folder(run_dir: str | None) -> str | None:
    """Where the ranks of a joined launch leave their records: ``<run>/hangs``."""
    return os.path.join(run_dir, HANGS) if run_dir else None


def arm_joined(rank: int, exit_code: int, poll_s: float = JOINED_POLL_S,
               wait_s: float = JOINED_WAIT_S) -> threading.Thread:
    """In a rank joined to a torchrun / SLURM launch: a thread that waits for a request
    in the run folder this process trains in (known once training has named it,
    :func:`distkit.observe.failures.run_dir_of_this_process`), writes the rank's record,
    waits for the claiming rank to print (up to ``wait_s`` + 2 s) and ends the process
    with ``exit_code``. One thread per process however many launches it joins."""
    if _joined:
        return _joined[0]
    main = threading.main_thread().ident

    def watch():
        while True:
            folder = joined_folder(run_dir_of_this_process())
            if folder and os.path.exists(os.path.join(folder, REQUEST)):
                break
            time.sleep(poll_s)
        if not _answer(folder, rank, main):
            return  # this rank raised: its own failure path reports and ends it
        deadline = time.monotonic() + wait_s + 2.0
        while not os.path.exists(os.path.join(folder, PRINTED)) and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)

    thread = threading.Thread(target=watch, name="distkit-hang-records", daemon=True)
    thread.start()
    _joined.append(thread)
    return thread


def joined_rank_failed(rank: int, world: int, error: BaseException,
                       wait_s: float = JOINED_WAIT_S) -> tuple[list[str], bool]:
    """In a joined rank whose training raised ``error``: write its record in the run
    folder; where a collective failed and no rank claimed the request before, claim it,
    wait up to ``wait_s`` for every rank's record and return the doctor's lines, which
    this rank prints (:func:`joined_printed`), and whether every rank answered (a rank
    that did not has died: torchrun must see that one first). ([], True) where it prints
    none (a claim with no rank in a collective lets the ranks that answered end at once)."""
    folder = joined_folder(run_dir_of_this_process())
    if folder is None:  # failed before training named its folder: no place to meet
        return [], True
    write_raised(folder, rank, error)  # an error in its own code too: then no verdict is due
    if not (in_collective(error) or peer_lost(error)):
        return [], True
    if not _create_once(os.path.join(folder, REQUEST)):
        return [], True  # another rank claimed it: that one prints
    answered = _wait_for_records(folder, world, wait_s)
    lines = doctor_lines_after(folder, world)
    if not lines:
        joined_printed(lines)
    return lines, answered


def joined_printed(lines: list[str]) -> None:
    """Print the doctor's lines, then let the ranks that answered end."""
    print_lines(lines)
    folder = joined_folder(run_dir_of_this_process())
    if folder:
        try:
            open(os.path.join(folder, PRINTED), "w").close()
        except OSError:
            pass
