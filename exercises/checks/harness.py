"""What every exercise check shares.

- :func:`load` imports the exercise file the checks should grade: the stubs in
  ``exercises/`` (default), the reference answers in ``exercises/solutions/``
  (``DISTKIT_EXERCISES=solutions``), or any folder of ``NN_topic.py`` files
  (``DISTKIT_EXERCISES=/path/to/folder``).
- :func:`run_ranks` runs a check function in 2 real processes joined by the gloo backend,
  through distkit's one process runner (:func:`distkit.launch.runner.run_per_rank`, which uses
  ``idist.Parallel``), and returns what each rank returned.
- :func:`run_layouts` runs a check function in every layout a learner's code meets: 1
  process with no process group at all, 2 and 3 processes on one node, and 2 "nodes" of 2
  processes (world size 4, processes per node 2); :func:`load_reference` imports the
  reference solution, so that a check runs the learner's function and the reference's on
  the same inputs, in the same processes, and compares what they produce
  (:func:`difference` says how two results differ, whatever they are).
- :func:`check_seed` chooses the seed of a check's random inputs (``DISTKIT_CHECK_SEED``
  replays one); :class:`Recorder` notes every ``torch.distributed`` call an answer makes
  (and, if asked, its matrix products), for the checks of structure.
- :class:`ExerciseFailure` carries the sentence the learner reads; ``conftest.py`` prints
  it without a traceback.

Processes start with ``fork`` on Linux (about 0.3 s instead of about 10 s with
``spawn``); set ``DISTKIT_START_METHOD=spawn`` to use spawn (the default on macOS and
Windows). Every function that runs on a rank is defined at module level so that spawn
can pickle it.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from types import ModuleType

EXERCISES_DIR = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = EXERCISES_DIR / "solutions"
NPROC = 2
# A rank that waits this long in a collective that another rank never joined fails,
# instead of hanging the check.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("DISTKIT_CHECK_TIMEOUT", "30"))


class ExerciseFailure(AssertionError):
    """The learner's code ran but did the wrong thing; the message says what and why."""


class NotSolved(ExerciseFailure):
    """The learner's code still raises ``NotImplementedError``."""


# --- which files are graded -----------------------------------------------------------

def exercise_dir() -> Path:
    choice = os.environ.get("DISTKIT_EXERCISES", "").strip()
    if choice in ("", "stubs"):
        return EXERCISES_DIR
    if choice == "solutions":
        return SOLUTIONS_DIR
    path = Path(choice).expanduser().resolve()
    if not path.is_dir():
        raise ExerciseFailure(
            f"DISTKIT_EXERCISES={choice!r} is neither 'stubs', 'solutions' nor a folder: "
            "unset it to check your own files in exercises/")
    return path


def exercise_file(number: str) -> Path:
    folder = exercise_dir()
    found = sorted(folder.glob(f"{number}_*.py"))
    if not found:
        raise ExerciseFailure(f"no file {number}_*.py in {folder}: restore it from git "
                              f"(git checkout -- exercises/) or copy it from exercises/solutions/")
    return found[0]


def load(number: str) -> ModuleType:
    """Import exercise ``number`` (e.g. ``"03"``) from the chosen folder, once per process."""
    path = exercise_file(number)
    name = f"distkit_exercise_{number}"
    module = sys.modules.get(name)
    if module is not None and Path(module.__file__) == path:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def not_solved_message(error: BaseException) -> str:
    """'exercise 03 is not solved yet: ...' for a NotImplementedError from an exercise file."""
    frames = traceback.extract_tb(error.__traceback__)
    return not_solved_message_from(_exercise_frame(frames), type(error).__name__)


def _in_exercise_file(filename: str) -> bool:
    path = Path(filename)
    return path.parent == exercise_dir() and path.name[:2].isdigit()


def _exercise_frame(frames):
    for frame in reversed(frames):
        if _in_exercise_file(frame.filename):
            return (frame.filename, frame.lineno, frame.name)
    last = frames[-1] if frames else None
    return (last.filename, last.lineno, last.name) if last else ("?", 0, "?")


def call_answer(what: str, function, *args, advice=lambda error: ""):
    """``function(*args)``, the learner's function called in the check's own process: what
    it raises becomes the learner's message (``what`` raised ``Type: text`` (line N: the
    learner's line). ``advice(error)``), never a crash of the check; a stub's
    ``NotImplementedError`` goes on to read "not solved yet"."""
    try:
        return function(*args)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - any error of the answer is reported, not crashed on
        raise ExerciseFailure(_raised_message(what, error, advice)) from None


def _raised_message(what: str, error: BaseException, advice) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if _in_exercise_file(f.filename)]
    at = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    return f"{what} raised {type(error).__name__}: {error}{at}.{advice(error)}{what_it_means(str(error))}"


def not_solved_message_from(where, error_type="NotImplementedError") -> str:
    filename, lineno, func = where
    number = Path(filename).name[:2]
    try:
        shown = os.path.relpath(filename)
    except ValueError:
        shown = filename
    if shown.startswith(os.pardir):  # run from elsewhere (the grader's sandbox): the file's own name
        shown = Path(filename).name
    return (f"exercise {number} is not solved yet: {func}() in {shown}:{lineno} still raises "
            f"{error_type}. Replace the TODO with your code; stuck? run "
            f"`distkit check {number} --hint` or read exercises/hints.md")


# --- running code on several ranks ----------------------------------------------------

def start_method() -> str:
    default = "fork" if sys.platform.startswith("linux") else "spawn"
    return os.environ.get("DISTKIT_START_METHOD", default)


def run_ranks(target, *args, nproc: int = NPROC) -> list:
    """Run ``target(*args)`` on ``nproc`` gloo ranks; return the list of their return values
    (index = rank). A learner error on any rank becomes one :class:`ExerciseFailure`."""
    from distkit.launch.runner import run_per_rank

    # ignite logs every auto_* call at INFO level; the learner only needs to see failures
    # (and their own prints).
    for name in ("auto.auto_dataloader", "auto.auto_model", "auto.auto_optim"):
        logging.getLogger(f"ignite.distributed.{name}").setLevel(logging.WARNING)
    # torch warns when it stops the other ranks after one failed; the failure says enough.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    _warm_for_fork()
    for attempt in range(3):
        reports_dir = Path(tempfile.mkdtemp(prefix="distkit-check-"))
        try:
            try:
                return run_per_rank(_rank_main, nproc_per_node=nproc, backend="gloo",
                                    start_method=start_method(), timeout_s=COLLECTIVE_TIMEOUT_S,
                                    check=target, reports_dir=str(reports_dir), check_args=args)
            except Exception as error:  # a rank raised or died: say which, and why
                reports = _read_reports(reports_dir, nproc)
                if attempt < 2 and _port_taken(reports, error):
                    continue  # another program grabbed the port between bind and use
                failure = _rank_failure(reports, error, _finished(reports_dir, nproc))
            raise failure  # outside the except block: no exception chain in the report
        finally:
            shutil.rmtree(reports_dir, ignore_errors=True)
    raise AssertionError("unreachable")


def run_nodes(target, *args, nnodes: int = 2, nproc_per_node: int = 2, group: bool = True) -> list:
    """Run ``target(*args)`` as ``nnodes`` "nodes" of ``nproc_per_node`` processes each, on
    127.0.0.1; return what each rank returned (index = global rank).

    Each process gets the environment torchrun gives a rank of such a run (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``) and joins it with ``idist.initialize("gloo")``, as a training script
    launched by ``torchrun --nnodes 2`` does. So the world size (4) differs from the
    processes per node (2) and the global rank from the local rank: an answer that uses
    ``idist.get_nproc_per_node()`` or ``idist.get_local_rank()`` where the world size or
    the rank belongs shows it here, and not on one node. ``nnodes=1`` runs one node of
    ``nproc_per_node`` processes the same way; ``group=False`` (one process) makes no
    process group at all."""
    world = nnodes * nproc_per_node
    _warm_for_fork()
    for attempt in range(3):
        reports_dir = Path(tempfile.mkdtemp(prefix="distkit-check-nodes-"))
        try:
            failed = _start_nodes(target, args, nnodes, nproc_per_node, reports_dir, group)
            reports = _read_reports(reports_dir, world)
            if not failed and not reports:
                return _read_results(reports_dir, world)
            error = RuntimeError(failed or "a rank failed")
            if attempt < 2 and _port_taken(reports, error):
                continue
            failure = _rank_failure(reports, error, _finished(reports_dir, world))
            raise failure
        finally:
            shutil.rmtree(reports_dir, ignore_errors=True)
    raise AssertionError("unreachable")


_WARM = []


def _warm_for_fork() -> None:
    """Import (and run once) in the parent what every rank would otherwise import after
    the fork: the four layouts of an empty target took 1.4 s instead of 17.8 s with
    ``ignite.distributed`` imported here; ``ignite.handlers`` cost 2.3 s, and the first
    ``TorchDispatchMode`` (``CommCounter``, ``Recorder(compute=True)``) 3.5 to 7.7 s, in
    EACH rank of a loaded 2-core machine (2026-11-26, load average 9 to 11)."""
    if _WARM or start_method() != "fork":
        return
    import ignite.distributed  # noqa: F401
    import ignite.engine  # noqa: F401
    import ignite.handlers  # noqa: F401
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Nothing():
        torch.ones(1) + 1
    _WARM.append(True)


def _start_nodes(target, args, nnodes, nproc_per_node, reports_dir, group=True) -> str:
    """Start every rank of every node, wait for them; '' when all ended well, else what
    went wrong. A rank that fails gets the others stopped within a few seconds. With
    ``group=False`` (one process only) no process group is made at all."""
    import multiprocessing
    import time

    from distkit.host.facts import free_port, stop_processes

    context = multiprocessing.get_context(start_method())
    port, world = free_port(), nnodes * nproc_per_node
    processes = []
    for node in range(nnodes):
        for local in range(nproc_per_node):
            env = {"RANK": str(node * nproc_per_node + local), "LOCAL_RANK": str(local),
                   "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(nproc_per_node),
                   "GROUP_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1"} if group else {"OMP_NUM_THREADS": "1"}
            p = context.Process(target=_node_rank_main,
                                args=(env, target, str(reports_dir), args, group), daemon=True)
            p.start()
            processes.append(p)
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S + 60
    failed_at = None
    while any(p.is_alive() for p in processes):
        codes = [p.exitcode for p in processes]
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()  # the others get a moment to write their reports
        if (failed_at is not None and time.monotonic() > failed_at + 3) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    hung = failed_at is None and any(p.is_alive() for p in processes)
    stop_processes(processes, grace_s=5)
    if hung:
        return (f"{HUNG}: the check's processes were still running after "
                f"{COLLECTIVE_TIMEOUT_S + 60:.0f} s and were stopped")
    bad = [(rank, p.exitcode) for rank, p in enumerate(processes) if p.exitcode != 0]
    return ", ".join(f"rank {rank} ended with exit code {code}" for rank, code in bad)


HUNG = "hung"


def _node_rank_main(env, check, reports_dir, check_args, group=True):
    from datetime import timedelta

    os.environ.update(env)
    if not group:  # the 1-process layout: no process group, as a plain `python train.py`
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
    import ignite.distributed as idist
    import torch

    torch.set_num_threads(1)
    logging.getLogger("ignite.distributed.utils").setLevel(logging.WARNING)
    if group:
        idist.initialize("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        from distkit.launch.supervise import write_result

        value = _rank_main(int(env.get("LOCAL_RANK", 0)), check, reports_dir, check_args)
        write_result(reports_dir, int(env.get("RANK", 0)), value)
    except BaseException:
        os._exit(1)  # reported by _rank_main; do not wait on the others in finalize
    if group:
        idist.finalize()


def _read_results(reports_dir: Path, world: int) -> list:
    from distkit.launch.supervise import read_result

    return [read_result(str(reports_dir), rank) for rank in range(world)]


def _finished(reports_dir: Path, world: int) -> list:
    """The ranks whose check function returned."""
    return [r for r in range(world) if (reports_dir / f"done{r}").exists()]


def _rank_main(local_rank, check, reports_dir, check_args):
    import ignite.distributed as idist

    try:
        value = check(*check_args)
        # The parent reads this to tell a rank that finished from one still in a collective.
        open(os.path.join(reports_dir, f"done{idist.get_rank()}"), "w").close()
        return value
    except BaseException as error:
        # The parent reads this to tell the learner what went wrong, and where. Written whole,
        # then renamed into place: when another rank fails first, torch.multiprocessing
        # SIGTERMs this one, and a half-written file made the parent fail on
        # "EOFError: Ran out of input" instead of naming the learner's mistake (seen in CI).
        from distkit.launch.supervise import write_result

        write_result(reports_dir, idist.get_rank(), _describe(error), kind="error")
        raise  # torch.multiprocessing then stops the other ranks instead of leaving them waiting


def _describe(error: BaseException) -> dict:
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, ExerciseFailure):
        kind = "failure"
    elif isinstance(error, NotImplementedError):
        kind = "todo"
    else:
        kind = "error"
    learner = [f for f in frames if _in_exercise_file(f.filename)]
    if learner:
        where = "where, in your code:\n" + "".join(traceback.format_list(learner))
    else:
        # Raised in a library (ignite, torch) while it ran what the learner set up, or in
        # the check itself: no line of the learner's file is on the stack.
        last = frames[-1] if frames else None
        where = ("no line of your file was running: it was raised in "
                 f"{_short_path(last.filename)}:{last.lineno} ({last.name}), code your "
                 "functions set up or called\n") if last else ""
    return {
        "kind": kind,
        "type": type(error).__name__,
        "message": str(error),
        "where": list(_exercise_frame(frames)),
        "traceback": where,
    }


def _short_path(filename: str) -> str:
    """``ignite/handlers/checkpoint.py`` rather than the whole site-packages path."""
    parts = Path(filename).parts
    for package in ("ignite", "torch", "distkit"):
        if package in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(package):])
    return filename


def _read_reports(reports_dir: Path, nproc: int) -> dict:
    from distkit.launch.supervise import read_result

    reports = {r: read_result(str(reports_dir), r, kind="error", missing=None) for r in range(nproc)}
    return {r: report for r, report in reports.items() if report is not None}


def _port_taken(reports, error) -> bool:
    text = " ".join(str(rep["message"]) for rep in reports.values()) + str(error)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def _rank_failure(reports: dict, error: Exception, finished=()) -> ExerciseFailure:
    for kind in ("failure", "todo", "error"):
        # A rank that raised is the cause; a rank that then lost its connection to it in a
        # collective is only a consequence: report the cause first.
        for rank, rep in sorted(reports.items(), key=lambda item: (_is_comm_error(item[1]), item[0])):
            if rep["kind"] != kind:
                continue
            if kind == "failure":
                return ExerciseFailure(rep["message"])
            if kind == "todo":
                return NotSolved(not_solved_message_from(rep["where"], rep["type"]))
            return ExerciseFailure(_explain_error(rank, rep, list(finished)))
    if str(error).startswith(HUNG):
        return ExerciseFailure(
            f"your code never returned: {str(error)[len(HUNG) + 2:]}. A rank that waits for "
            f"something no other rank does (a recv with no matching send, a collective only some "
            f"ranks call, a loop that never ends) hangs like this")
    return ExerciseFailure(f"a process of the check died without a Python error "
                          f"({type(error).__name__}: {str(error).strip()[:300]})")


def _is_comm_error(rep: dict) -> bool:
    lowered = str(rep["message"]).lower()
    return any(text in lowered for text in ("timed out", "timeout", "connection closed by peer",
                                            "connection reset", "broken pipe"))


# The whole error, not only its first line (a state-dict error lists its keys after it),
# but bounded: a learner reads it in a terminal.
MAX_ERROR_LINES, MAX_ERROR_CHARS = 40, 4000


def _explain_error(rank: int, rep: dict, finished=()) -> str:
    lines = rep["message"].strip().splitlines()
    text = "\n".join(lines[:MAX_ERROR_LINES])[:MAX_ERROR_CHARS]
    if len(lines) > MAX_ERROR_LINES or len(text) == MAX_ERROR_CHARS:
        text += "\n(...)"
    if _is_comm_error(rep):
        # No other rank raised an error of its own (that one would have been reported
        # first): the others had finished, or were in another collective.
        done = [r for r in finished if r != rank]
        who = " and ".join(f"rank {r}" for r in done) + " had already finished"
        lowered = rep["message"].lower()
        waited = (f" for {COLLECTIVE_TIMEOUT_S:.0f} s" if "timed out" in lowered or "timeout" in lowered
                  else "")
        if not done:
            # Nobody finished and nobody raised: the ranks waited for each other, a
            # mismatch of calls, not necessarily a barrier.
            return (f"rank {rank} waited{waited} in a collective or a point-to-point transfer "
                    f"that no other rank matched, and gave up: every rank must call the same "
                    f"collectives in the same order, and every recv needs the peer's send (and "
                    f"the other way round).\n{rep['traceback']}")
        if any(word in rep["traceback"] for word in ("recv", "send", "P2POp", "request.wait", "req.wait")):
            # the learner's line waited for a point-to-point transfer, not a collective
            return (f"rank {rank} was still waiting{waited} for a point-to-point transfer when {who}: a recv "
                    f"(or a send) whose peer never made the matching call. Every recv needs the peer's send, and "
                    f"the other way round: check that every rank sends what its peer receives, at every step.\n"
                    f"{rep['traceback']}")
        return (f"rank {rank} was still waiting{waited} in a collective when {who}: every rank "
                f"must call the same collectives, in the same order. A barrier or all_reduce "
                f"that only some ranks reach (inside `if rank == 0:` or `if local_rank == 0:`) is "
                f"the usual cause; idist.one_rank_first() makes the others wait correctly.\n"
                f"{rep['traceback']}")
    return f"rank {rank} raised {rep['type']}: {text}{what_it_means(text)}\n{rep['traceback']}"


# Errors torch raises from deep inside, in words that do not say what the learner's call did
# wrong: (words of the error, what it means). Each was raised here by the mistake it names.
_GPU_BY_NAME = ("a tensor or module was put on a GPU by name ('cuda', 'cuda:N'): this machine has none. "
                "Use idist.device(): this rank's own GPU under nccl, the CPU under gloo, so the same "
                "code runs in both")
LIBRARY_ERRORS = (
    (("nvidia driver",), _GPU_BY_NAME),
    (("not compiled with cuda",), _GPU_BY_NAME),
    (("cuda", "no "), _GPU_BY_NAME),
    (("pair is not connected",), "gloo has no connection from a rank to itself: a send or recv whose peer "
                                 "is this rank's own number, e.g. (rank + 2) % N with N = 2"),
    (("invariant encountered", "value was none"),
     "raised inside FSDP's forward: fully_shard the inner modules first and the model itself (the "
     "root) last; a module sharded after its parent leaves the parent's sharding without it"),
)


def what_it_means(text: str) -> str:
    """What a library's error says about the learner's call, as a line to add to it (or "")."""
    lowered = text.lower()
    for words, meaning in LIBRARY_ERRORS:
        if all(w in lowered for w in words):
            return f"\n({meaning})"
    return ""


# --- small helpers the checks share ---------------------------------------------------

def flat_weights(model):
    """All parameters of ``model`` (DDP-wrapped or not) as one detached CPU vector."""
    import torch

    module = getattr(model, "module", model)
    return torch.cat([p.detach().reshape(-1).cpu() for p in module.parameters()])


def short_list(values, limit: int = 6) -> str:
    values = list(values)
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f" (and {len(values) - limit} more)" if len(values) > limit else "")


# --- every layout, against the reference ------------------------------------------------

# (name, nodes, processes per node): the layouts a learner's code meets. The first has no
# process group at all (a plain `python train.py`); the last has a world size (4) that is
# not the processes per node (2), and global ranks that are not local ranks.
LAYOUTS = (("1 process (no process group)", 1, 1), ("2 processes", 1, 2), ("3 processes", 1, 3),
           ("2 nodes x 2 processes", 2, 2))


def run_layouts(target, *args, layouts=LAYOUTS) -> dict:
    """Run ``target(*args)`` in every layout of ``layouts``, one after the other; return
    ``{layout name: [what each rank returned]}``. A rank's error is reported with the
    layout it happened in (``on 2 nodes x 2 processes: rank 3 raised ...``)."""
    results = {}
    for name, nnodes, nproc in layouts:
        try:
            results[name] = run_nodes(target, *args, nnodes=nnodes, nproc_per_node=nproc,
                                      group=nnodes * nproc > 1)
        except NotSolved:
            raise
        except ExerciseFailure as failure:
            raise ExerciseFailure(f"on {name}: {failure}") from None
    return results


def each_layout(target, *args, layouts=LAYOUTS):
    """Like :func:`run_layouts`, one layout at a time: yields ``(layout name, [what each
    rank returned])``, so a check judges a layout before the next one starts (and stops at
    the first wrong one)."""
    for layout in layouts:
        yield layout[0], run_layouts(target, *args, layouts=[layout])[layout[0]]


# the processes' layouts first, then one process: a learner reads first what the
# exercise is about, then that the code must also run with no process group
MULTI_FIRST = LAYOUTS[1:] + LAYOUTS[:1]


def preload(number: str) -> None:
    """Import the learner's file and the reference of exercise ``number`` in the parent
    before processes are forked, so every rank does not import them (and what they import)
    again. A file that fails to import is left for the ranks to report."""
    if start_method() != "fork":
        return
    load_reference(number)
    try:
        load(number)
    except Exception:  # noqa: BLE001 - reported by the rank that imports it
        pass


# --- a check in two halves: the data an answer produces, then the verdict on it -----------
# A check that defines PARTS runs each part's answers with collect(part, whos, seed) and
# judges the data with judge(part, got, expected, seed). distkit check does both in one
# process; distkit grade collects the learner's data in the sandbox, the reference's data
# in a process of its own, and judges both in the grader, which never runs the learner's code.

LEARNER, REFERENCE = "learner", "reference"


def answer(number: str, who: str) -> ModuleType:
    """The learner's file of exercise ``number`` or the reference solution."""
    return load(number) if who == LEARNER else load_reference(number)


def preload_for(number: str, whos) -> None:
    """:func:`preload` of only the answers ``whos`` collects from (the sandbox has no reference)."""
    if start_method() != "fork":
        return
    if REFERENCE in whos:
        load_reference(number)
    if LEARNER in whos:
        try:
            load(number)
        except Exception:  # noqa: BLE001 - reported by the rank that imports it
            pass


def by_who(ranks, whos) -> dict:
    """``[{who: data} per rank]`` -> ``{who: [data per rank]}``."""
    return {who: [rank[who] for rank in ranks] for who in whos}


def same_ranks(got, expected, where: str = "") -> list:
    """``got`` as a list of one entry per rank of ``expected``, or the failure saying it is not."""
    if not isinstance(got, list) or len(got) != len(expected):
        raise ExerciseFailure(f"{where}the check's data should hold {len(expected)} rank(s), got "
                              f"{describe(got)}")
    return got


def judge_here(check, parts, seed: int) -> None:
    """``distkit check``'s way: each part's learner and reference answers collected in the same
    processes, then judged, one part after the other (the first wrong part stops)."""
    for part in parts:
        data = check.collect(part, (LEARNER, REFERENCE), seed)
        check.judge(part, data[LEARNER], data[REFERENCE], seed)


# --- an answer's result as plain data, for a judge that runs no learner's code ---------------
# The grader reads a learner's data with torch.load(weights_only=True): numbers, strings,
# None, tensors, lists, tuples and dicts. Whatever else an answer returns (a generator, a
# numpy array, an object) travels as [FOREIGN, its type's name, its repr], which the judge
# turns back into a stand-in that equals nothing: enough for the message, never a pass.

FOREIGN = "<not plain data>"
_DEEPEST = 12


def outcome(what: str, function, *args, advice=lambda error: "") -> dict:
    """``function(*args)`` as data: ``{"returned": plain(value)}``, or ``{"raised": type name,
    "classes": the names of its classes (a ValueError's subclass lists "ValueError"), "text":
    str(error), "message": what :func:`call_answer` would say}``. A stub's
    ``NotImplementedError`` goes on to read "not solved yet"."""
    try:
        return {"returned": plain(function(*args))}
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the judge decides what an error means
        return {"raised": type(error).__name__, "classes": [c.__name__ for c in type(error).__mro__],
                "text": str(error)[:500], "message": _raised_message(what, error, advice)[:2000]}


def plain(value, depth: int = 0):
    """``value`` as data the grader reads back: Python's numbers (a numpy scalar's too), strings,
    tensors and containers of them; anything else as ``[FOREIGN, type name, repr]``."""
    import numbers

    import torch

    if value is None or type(value) in (bool, int, float, str):
        return value
    if depth > _DEEPEST:
        return [FOREIGN, type(value).__name__, "..."]
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, str)):  # numpy's float64 is a float
        return float(value) if isinstance(value, float) else str.__str__(value)
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        items = [plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    return [FOREIGN, type(value).__name__, repr(value)[:300]]


class Foreign:
    """What an answer returned that is not plain data: its repr, its type's name; equal to nothing."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def unplain(value, depth: int = 0):
    """:func:`plain`'s data back as the judge reads it: each ``[FOREIGN, name, repr]`` a
    :class:`Foreign` whose type is named ``name``."""
    if isinstance(value, list) and len(value) == 3 and value[0] == FOREIGN and \
            all(isinstance(v, str) for v in value[1:]):
        try:
            return type(value[1], (Foreign,), {})(value[2])
        except ValueError:  # a name type() refuses
            return Foreign(value[2])
    if depth > _DEEPEST:
        return Foreign("...")
    if isinstance(value, (list, tuple)):
        items = [unplain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: unplain(v, depth + 1) for k, v in value.items()}
    return value


def returned(result: dict):
    """What an :func:`outcome` returned, or the failure its answer raised."""
    if not isinstance(result, dict) or not ("returned" in result or isinstance(result.get("message"), str)):
        raise ExerciseFailure(f"the check's data should hold what the answer returned, got {describe(result)}")
    if "returned" not in result:
        raise ExerciseFailure(result["message"])
    return unplain(result["returned"])


# Set by distkit grade's plugin: in its sandbox the references are not on disk; they come
# from the grader, guarded against a learner's code that calls them.
REFERENCE_SOURCE = None


def load_reference(number: str) -> ModuleType:
    """Import the reference solution of exercise ``number``, whatever folder is graded: the
    checks run it beside the learner's answer, on the same inputs, and compare."""
    if REFERENCE_SOURCE is not None:
        return REFERENCE_SOURCE(number)
    path = sorted(SOLUTIONS_DIR.glob(f"{number}_*.py"))[0]
    name = f"distkit_reference_{number}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def check_seed() -> int:
    """The seed of a check's random inputs: ``DISTKIT_CHECK_SEED`` if set (to replay a
    failure), else a new one each run. Every failure message names it (:func:`replay`)."""
    import random

    chosen = os.environ.get("DISTKIT_CHECK_SEED", "").strip()
    return int(chosen) if chosen else random.SystemRandom().randrange(1, 10**6)


def replay(seed: int) -> str:
    return f"(random inputs of seed {seed}: DISTKIT_CHECK_SEED={seed} replays them)"


def describe(value) -> str:
    """A short description of any value an answer may return."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}" if len(text) > 80 else text


def difference(expected, got, rtol: float = 0.0, atol: float = 0.0, what: str = "the output"):
    """``None`` when ``got`` equals ``expected`` (within ``rtol``/``atol`` for floating
    point), else one sentence saying how they differ: type, length, shape, dtype, NaN,
    and for numbers the largest difference and where. Never raises, whatever ``got`` is."""
    import math

    import torch

    try:
        if isinstance(expected, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                return f"{what} should be {describe(expected)}, got {describe(got)}"
            if tuple(got.shape) != tuple(expected.shape):
                return f"{what} should have shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
            if got.dtype != expected.dtype:
                return f"{what} should be {describe(expected)}, got {describe(got)}"
            a, b = got.detach().double().cpu(), expected.detach().double().cpu()
            if torch.isnan(a).any() and not torch.isnan(b).any():
                return f"{what} holds NaN at {torch.isnan(a).sum().item()} of {a.numel()} entries"
            bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            if not bad.any():
                return None
            where = tuple(int(i) for i in bad.nonzero()[0])
            err = (a - b).abs().nan_to_num(float("inf"))
            return (f"{what}: {bad.sum().item()} of {a.numel()} entries differ; at index {where} "
                    f"expected {b[where].item():.7g}, got {a[where].item():.7g} (largest difference "
                    f"{err.max().item():.3g}, allowed {atol:.1g} + {rtol:.1g} x |expected|)")
        if isinstance(expected, (list, tuple)):
            if not isinstance(got, (list, tuple)):
                return f"{what} should be {describe(expected)}, got {describe(got)}"
            if len(got) != len(expected):
                return f"{what} should have {len(expected)} items, got {len(got)}"
            for i, (e, g) in enumerate(zip(expected, got)):
                found = difference(e, g, rtol, atol, f"{what}[{i}]")
                if found:
                    return found
            return None
        if isinstance(expected, dict):
            if not isinstance(got, dict) or set(got) != set(expected):
                return f"{what} should be a dict with keys {sorted(expected)}, got {describe(got)}"
            for key in expected:
                found = difference(expected[key], got[key], rtol, atol, f"{what}[{key!r}]")
                if found:
                    return found
            return None
        if isinstance(expected, (int, float)) and not isinstance(expected, bool):
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                return f"{what} should be a number ({expected!r}), got {describe(got)}"
            if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol) or got == expected:
                return None
            return f"{what} should be {expected!r}, got {got!r}"
        return None if got == expected else f"{what} should be {describe(expected)}, got {describe(got)}"
    except Exception as error:  # an answer's object that cannot even be compared
        return f"{what} could not be compared with the expected {describe(expected)}: {error}"


def on_device(log, device) -> str:
    """'' when every tensor of the recorded calls lives on ``device``, else which did not."""
    for call in log:
        for dev in call.get("devices", ()):
            if dev != str(device):
                return (f"{call['op']} was given a tensor on {dev}, not on idist.device() ({device}): "
                        f"on GPUs (nccl) a collective needs its tensors on this rank's device; "
                        f"move them with .to(idist.device())")
    return ""


# --- where the answer puts its tensors, on a machine without a GPU ---------------------

_FACTORIES = ("empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor")


class DeviceStandIn:
    """Inside it ``idist.device()`` returns ``torch.device("cpu", 0)``: the same CPU for
    every tensor, but a device object the check can tell from one named by hand ("cpu",
    ``torch.device("cpu")``) or from none at all, the mistakes that only fail on a GPU.
    ``made`` notes, for every tensor a ``torch`` factory made in the exercise file, the
    device it was asked for; :meth:`placed` reads it back for a tensor."""

    STAND_IN = ("cpu", 0)

    def __init__(self):
        self.made, self._saved = {}, None

    def __enter__(self):
        import ignite.distributed as idist
        import torch
        from torch.overrides import TorchFunctionMode

        import weakref

        stand_in = torch.device(*self.STAND_IN)
        self._saved = idist.device
        idist.device = lambda: stand_in
        factories = {getattr(torch, name) for name in _FACTORIES}
        made = self.made

        class Placement(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                result = func(*args, **kwargs)
                if getattr(func, "__name__", "") == "to" and args and id(args[0]) in made:
                    # moved afterwards: judged by where it went (a device, or a tensor's)
                    entry = made[id(args[0])]
                    target = kwargs.get("device", args[1] if len(args) > 1 else None)
                    if isinstance(target, torch.Tensor):
                        target = stand_in if target.device == torch.device("cpu") else target.device
                    elif not isinstance(target, (str, torch.device, int)):
                        target = entry[3]  # .to(dtype) moves nothing
                    made[id(args[0])] = (*entry[:3], target, entry[4])
                    made[id(result)] = (weakref.ref(result), *entry[1:3], target, entry[4])
                if func in factories and isinstance(result, torch.Tensor):
                    frame = sys._getframe(1)
                    while frame is not None and not _in_exercise_file(frame.f_code.co_filename):
                        frame = frame.f_back
                    if frame is not None and not _given(frame):
                        made[id(result)] = (weakref.ref(result), f"torch.{func.__name__}",
                                            frame.f_lineno, kwargs.get("device"), result.dim())
                return result

        self._mode = Placement()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import ignite.distributed as idist

        self._mode.__exit__(*exc)
        idist.device = self._saved
        return False

    def misplaced(self, tensor) -> str:
        """'' when ``tensor`` was not made by the answer or was made on ``idist.device()``;
        else what the answer did, in the learner's words."""
        import torch

        entry = self.made.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return ""
        _, func, line, device, _ = entry
        if device is not None and torch.device(device) == torch.device(*self.STAND_IN):
            return ""
        how = "with no device" if device is None else f"on device {str(device)!r}, named by hand"
        return (f"made by {func} on line {line} of your file {how}: that is the CPU on every machine, "
                f"so it works here, but under nccl it must be on this rank's GPU. Make it on "
                f"idist.device()")

    def without_device(self) -> list:
        """``(factory, line)`` of every tensor (not a scalar) the answer made with no device:
        on a GPU it is on the CPU, and the first operation that meets a GPU tensor fails."""
        return sorted({(func, line) for _, func, line, device, dim in self.made.values()
                       if device is None and dim > 0}, key=lambda x: x[1])


def _given(frame) -> bool:
    """Whether ``frame`` runs a function the stub gives ready-made (docstring "Given:")."""
    function = frame.f_globals.get(frame.f_code.co_name)
    return (getattr(function, "__doc__", None) or "").startswith("Given:")


_RECORDED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
             "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
             "broadcast", "broadcast_object_list", "reduce", "gather", "scatter", "barrier",
             "send", "recv", "isend", "irecv", "batch_isend_irecv")


class Recorder:
    """Notes, in order, every ``torch.distributed`` call made inside it (``idist``'s
    collectives call those too): ``{"op", "shapes", "devices", "peer", "copy", "time"}``,
    where ``copy`` is a copy of the first tensor as given (before a collective changes it);
    and, with ``compute=True``, every matrix product as ``{"op": "matmul",
    "received_alive"}``: how many of the buffers received so far were still alive then
    (noted as weak references: a buffer the answer let go of is dead). The handles of
    asynchronous calls note ``{"op": "wait", "of": index of the call}`` when waited on."""

    def __init__(self, compute: bool = False):
        self.log, self.compute, self.received = [], compute, []
        self._saved, self._mode, self._inside = {}, None, []

    def _note(self, name, args, kwargs):
        import time

        import torch

        tensors = []
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, (list, tuple)):
                tensors += [t for t in value if isinstance(t, torch.Tensor)]
        peer = kwargs.get("dst", kwargs.get("src", kwargs.get("group_dst", kwargs.get("group_src"))))
        if peer is None and name in ("send", "recv", "isend", "irecv") and len(args) > 1:
            peer = args[1]
        entry = {"op": name, "shapes": [tuple(t.shape) for t in tensors],
                 "devices": [str(t.device) for t in tensors], "peer": peer, "time": time.perf_counter(),
                 "copy": tensors[0].detach().clone() if tensors else None}
        self.log.append(entry)
        if name in ("recv", "irecv") and tensors:
            import weakref

            self.received.append((len(self.log) - 1, weakref.ref(tensors[0])))

    def alive_received(self) -> int:
        return sum(1 for _, ref in self.received if ref() is not None)

    def __enter__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        recorder = self

        class Handle:
            def __init__(self, work, index):
                self._work, self._index = work, index

            def wait(self, *a, **k):
                recorder.log.append({"op": "wait", "of": self._index, "devices": ()})
                return self._work.wait(*a, **k)

            def __getattr__(self, name):
                return getattr(self._work, name)

        def wrap(name, original):
            def recorded(*args, **kwargs):
                # torch's own functions call each other (send may call isend): note the
                # outermost call only, except inside batch_isend_irecv (its isend/irecv are
                # the transfers)
                if recorder._inside and recorder._inside[-1] != "batch_isend_irecv":
                    return original(*args, **kwargs)
                if name != "batch_isend_irecv":
                    recorder._note(name, args, kwargs)
                index = len(recorder.log) - 1
                recorder._inside.append(name)
                try:
                    result = original(*args, **kwargs)
                finally:
                    recorder._inside.pop()
                if (name in ("isend", "irecv") or kwargs.get("async_op")) and result is not None:
                    if not (recorder._inside and recorder._inside[-1] == "batch_isend_irecv"):
                        recorder.log[index]["handle"] = True  # the answer holds it: it must wait
                    return Handle(result, index)
                return result
            recorded.__wrapped__ = original
            return recorded

        for name in _RECORDED:
            original = getattr(dist, name, None)
            if original is None:
                continue
            # one wrapper in both modules: P2POp compares its op with distributed_c10d's isend
            recorded = wrap(name, original)
            for module in (dist, c10d):
                if getattr(module, name, None) is not None:
                    self._saved[(module, name)] = getattr(module, name)
                    setattr(module, name, recorded)
        if self.compute:
            from torch.utils._python_dispatch import TorchDispatchMode

            class Compute(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    if func.__name__.split(".")[0] in ("mm", "bmm", "addmm", "baddbmm"):
                        recorder.log.append({"op": "matmul", "devices": (),
                                             "received_alive": recorder.alive_received()})
                    return func(*args, **(kwargs or {}))

            self._mode = Compute()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._mode.__exit__(*exc)
        for (module, name), original in self._saved.items():
            setattr(module, name, original)
        return False

    def ops(self) -> list:
        return [e["op"] for e in self.log]

    def data(self, copies: bool = True) -> list:
        """The log as plain data (:func:`plain`), for a judge outside the answer's process:
        each entry's fields but the time, with the copies of the tensors given if asked."""
        drop = {"time"} if copies else {"time", "copy"}
        return [{key: plain(value) if key in ("peer", "copy") else value
                 for key, value in entry.items() if key not in drop} for entry in self.log]

    def unwaited(self) -> list:
        """The asynchronous calls (``isend``, ``irecv``, ``async_op=True``) whose handle the
        answer got but never waited on: until ``wait()`` the tensor may not have left (or
        arrived), and a buffer freed before then is sent as whatever fills it next."""
        waited = {e.get("of") for e in self.log if e["op"] == "wait"}
        return [e for i, e in enumerate(self.log) if e.get("handle") and i not in waited]
