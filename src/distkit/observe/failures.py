"""A rank that fails: one line that keeps the cause, the full traceback in a file.

Every worker the kit starts (spawned by its launcher, or joined to a torchrun / SLURM
launch) runs its training function through :func:`run_reporting`. When the function
raises, the rank:

- writes its full traceback to ``<run folder>/tracebacks/rank<R>.txt`` (a temporary
  folder when there is no run folder, as under ``launch_function``);
- turns the exception into one line: its type, the first line of its message and the
  ``file:line`` in the user's code where it was raised (the innermost frame outside the
  standard library, site-packages and the kit; the kit's own frame if none), the
  traceback's path and the last complete checkpoint::

      rank 1 (local rank 1) raised ValueError: bad shape (at course.py:18); full
      traceback in runs/.../tracebacks/rank1.txt; last complete checkpoint: ...

  A collective that timed out or lost its connection on a run of several nodes names
  the node(s) this rank lost instead (``rank 0 (local rank 0, node 0 of 2) lost node 1
  (rank 1): no answer within --timeout 15 s ...``): a cut link and a dead peer look
  alike from here, and the line says both;
- raises :class:`RankFailed` with that line. The kit's launcher reports it as the
  job's ``distkit: error:`` line. Under torchrun the worker itself prints it, only the
  first failing rank of each node, and records it in ``TORCHELASTIC_ERROR_FILE`` in the
  format of ``torch.distributed.elastic.multiprocessing.errors.record``, so torchrun's
  summary names it as the root cause; the exit stays non-zero (``--max-restarts``).

A :class:`~distkit.errors.DistkitError` raised in a rank is already one line that names
its fix: it passes through unchanged, with no traceback file.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import sysconfig
import tempfile
import time
import traceback

from distkit.host.files import write_json_quietly, write_text
from distkit.errors import DistkitError
from distkit.host.layout import elastic, local_world_size, slurm_job, slurm_step_key, world_layout

TRACEBACKS = "tracebacks"  # the folder inside the run folder

_run_dir: str | None = None


def training_in(run_dir: str | None) -> None:
    """Say which run folder this process trains in (None: no run now). Training says it
    when it starts and when it returns; a failure in between is reported with that run's
    last checkpoint and its traceback in that folder, which is how torchrun's ranks and
    node 1, whose launcher made no folder, know it."""
    global _run_dir
    _run_dir = run_dir


def run_dir_of_this_process() -> str | None:
    """The run folder this process trains in, or last trained in before it failed."""
    return _run_dir


class RankFailed(DistkitError):
    """A rank's training function raised; the message is the one line that says so.

    ``traceback_path``: where the full traceback is; ``reported``: the line was already
    printed (under torchrun the worker prints it itself); ``kind``: its record's
    (:attr:`FailureRecord.kind`: ``"lost"`` for a rank that only lost a peer)."""

    def __init__(self, message: str, traceback_path: str | None = None, kind: str = "raised"):
        super().__init__(message)
        self.traceback_path = traceback_path
        self.reported = False
        self.kind = kind


def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


KIT_ROOT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # src/distkit


def raise_site(error: BaseException) -> tuple[str, int] | None:
    """``(file, line)`` where ``error`` was raised in the user's code: the innermost frame
    of its traceback outside the standard library, site-packages and distkit; else the
    innermost frame of distkit; else the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    libraries = _library_roots()

    def where(frame):
        path = os.path.realpath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(libraries):
            return "library"
        return "kit" if path.startswith(KIT_ROOT) else "user"

    kinds = [where(f) for f in frames]
    for wanted in ("user", "kit"):
        for frame, kind in zip(reversed(frames), reversed(kinds)):
            if kind == wanted:
                return frame.filename, frame.lineno
    return frames[-1].filename, frames[-1].lineno


def shown_path(path: str) -> str:
    """A path as a learner reads it: relative to the current folder when inside it,
    ``distkit/...`` inside the kit, else as is."""
    real = os.path.realpath(path)
    cwd = os.path.realpath(os.getcwd()) + os.sep
    if real.startswith(cwd):
        return real[len(cwd):]
    if real.startswith(KIT_ROOT):
        return "distkit/" + real[len(KIT_ROOT):]
    return path


def first_line(error: BaseException) -> str:
    """The first non-empty line of the message (a C++ error's ``[file.cc:123] `` prefix
    dropped)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return re.sub(r"^\[[^\]\s]+\.(?:cc|cpp|h):\d+\]\s*", "", line)


def cause(error: BaseException) -> str:
    """``Type: first line (at file.py:12)``: what went wrong and where, in one line."""
    text = first_line(error)
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    site = raise_site(error)
    if site is not None:
        line += f" (at {shown_path(site[0])}:{site[1]})"
    return line


# --------------------------------------------------------------------------------------
# The failure record: what a rank says about its own failure, as data
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class FailureRecord:
    """What a rank that failed or stopped writes about itself (``rank<R>.json`` beside its
    traceback), and its supervisor reads: never recovered from traceback text."""

    rank: int
    local_rank: int
    kind: str
    """``"raised"`` (the user's code or a library raised), ``"refused"`` (a
    :class:`~distkit.errors.DistkitError`: its line names the fix), ``"stopped"`` (a
    signal stopped the rank at an iteration) or ``"lost"`` (a collective lost a peer or
    timed out: this rank is a witness, not the cause)."""
    type: str
    """The exception's qualified type (``builtins.ValueError``)."""
    first_line: str
    site: str | None
    """``file:line`` in the user's code where it was raised (:func:`raise_site`)."""
    traceback: str | None
    """The full traceback's file, None where it could not be written."""
    last_checkpoint: str | None
    message: str
    """The one line the launcher prints for it."""
    node: int = 0
    signum: int | None = None
    """For ``"stopped"``: the signal."""
    time: float = 0.0
    """When it was written (``time.time()``): the first record is the first failure."""

    @property
    def what(self) -> str:
        """``Type: first line``."""
        name = self.type.rsplit(".", 1)[-1]
        return f"{name}: {self.first_line}" if self.first_line else name


def record_of(error: BaseException, rank: int, local_rank: int, message: str, *, kind: str | None = None,
              traceback_path: str | None = None, last_checkpoint: str | None = None,
              node: int = 0) -> FailureRecord:
    """The record of ``error`` raised in ``rank``."""
    if kind is None:
        kind = "stopped" if hasattr(error, "signum") else "refused" if isinstance(error, DistkitError) \
            else "lost" if peer_lost(error) else "raised"
    site = raise_site(error)
    return FailureRecord(rank, local_rank, kind, f"{type(error).__module__}.{type(error).__qualname__}",
                         first_line(error), f"{shown_path(site[0])}:{site[1]}" if site else None,
                         traceback_path, last_checkpoint or getattr(error, "checkpoint", None), message,
                         node, getattr(error, "signum", None), time.time())


def write_record(folder: str | None, record: FailureRecord) -> str | None:
    """``folder/rank<R>.json``, written whole then renamed (a reader never sees half)."""
    if not folder:
        return None
    # None on a full disk: the supervisor falls back to the exit code
    return write_json_quietly(os.path.join(folder, f"rank{record.rank}.json"), dataclasses.asdict(record))


def read_records(folder: str | None) -> dict[int, FailureRecord]:
    """Every rank's record in ``folder``, by rank: the one place a supervisor reads them."""
    records = {}
    try:
        names = os.listdir(folder) if folder else []
    except OSError:
        names = []
    fields = {f.name for f in dataclasses.fields(FailureRecord)}
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            record = FailureRecord(**{k: v for k, v in data.items() if k in fields})
        except (OSError, ValueError, TypeError):
            continue
        records[record.rank] = record
    return records


def write_traceback(folder: str, rank: int, error: BaseException) -> str | None:
    """The full traceback (its chained causes included) in ``folder/rank<R>.txt``."""
    path = os.path.join(folder, f"rank{rank}.txt")
    try:
        os.makedirs(folder, exist_ok=True)
        return write_text(path, "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    except OSError:  # a full disk: no file rather than an empty or cut one a reader would trust
        return None


def launch_tag() -> str | None:
    """A name every rank of a torchrun or SLURM launch gives it alike (torchrun's run id,
    the SLURM job); None for a launch the kit spawned (its launcher names it)."""
    job = slurm_job()
    return elastic().run_id or (f"slurm{job}" if job else None)


def traceback_folder(run_dir: str) -> str:
    """Where a rank's traceback goes in a run that has a folder: ``<run>/tracebacks``."""
    return os.path.join(run_dir, TRACEBACKS)


def default_folder() -> str:
    """Where tracebacks go when the run has no folder: one per launch (its
    :func:`launch_tag`, else this process), under the system's temporary folder."""
    tag = launch_tag() or f"{os.getpid()}-{int(time.time())}"
    return traceback_folder(os.path.join(tempfile.gettempdir(), f"distkit-{tag}"))


class Reporter:
    """What a worker needs to report its failure: the run folder the launcher made (if
    any; else the folder training said, :func:`run_dir_of_this_process`), a folder for
    runs without one, ``verbose`` (print the traceback too) and the launch's
    ``timeout_s`` (named when a peer is lost)."""

    def __init__(self, run_dir: str | None = None, folder: str | None = None,
                 verbose: bool = False, timeout_s: float | None = None, records: str | None = None):
        self.run_dir, self.folder, self.verbose, self.timeout_s = run_dir, folder, verbose, timeout_s
        self.records = records
        """A folder of this launch's own where each rank's :class:`FailureRecord` also goes,
        for the supervisor that started the ranks (None when nobody supervises them here)."""

    def record(self, record: FailureRecord) -> None:
        """Leave ``record`` where the supervisor reads it, and beside its traceback."""
        write_record(self.records, record)
        if record.traceback:
            write_record(os.path.dirname(record.traceback), record)

    def traceback_folder(self, run_dir: str | None = None) -> str:
        if run_dir and os.path.isdir(run_dir):
            return traceback_folder(run_dir)
        return self.folder or default_folder()

    @staticmethod
    def newest_checkpoint(run_dir: str | None) -> str | None:
        if not run_dir or not os.path.isdir(run_dir):
            return None
        from distkit.checkpoint.saver import latest_checkpoint_in

        return latest_checkpoint_in(run_dir)

    @classmethod
    def checkpoint_words(cls, run_dir: str | None) -> str:
        if not run_dir:
            return ""
        newest = cls.newest_checkpoint(run_dir)
        return (f"; last complete checkpoint: {newest}" if newest
                else "; no checkpoint had been written yet")

    def failure(self, error: Exception, rank: int, local_rank: int) -> RankFailed:
        run_dir = self.run_dir or run_dir_of_this_process()
        path = write_traceback(self.traceback_folder(run_dir), rank, error)
        if self.verbose:
            sys.stderr.write("".join(traceback.format_exception(type(error), error,
                                                                error.__traceback__)))
            sys.stderr.flush()
        where = f"; full traceback in {path}" if path else ""
        lost = lost_nodes(error, self.timeout_s)
        words = last_words(os.path.dirname(path), rank) if lost and path else None
        if words is not None:  # the rank that died first, in its own words; then who saw it
            message = (f"rank {words.rank}{_node_of(words.rank)} raised {words.what} "
                       f"(its traceback: {words.traceback}); rank {rank} (local rank {local_rank}"
                       f"{_node_words()}) then lost it{self.checkpoint_words(run_dir)}")
            path = words.traceback
        else:
            what = f"{lost}: {cause(error)}" if lost else f"raised {cause(error)}"
            message = (f"rank {rank} (local rank {local_rank}{_node_words()}) {what}{where}"
                       f"{self.checkpoint_words(run_dir)}")
        record = record_of(error, rank, local_rank, message, traceback_path=path if words is None else None,
                           last_checkpoint=self.newest_checkpoint(run_dir), node=(_topology() or (0,))[0])
        self.record(record)
        return RankFailed(message, path, record.kind)


# What torch's gloo / nccl / store errors say when a peer went away or did not answer.
PEER_LOST_WORDS = ("timed out", "connection closed by peer", "connection reset by peer",
                   "broken pipe")


def peer_lost(error: BaseException) -> bool:
    """True for an exception that says a peer went away or did not answer in time: the
    rank that raised it is a witness of another's failure, not its cause."""
    message = str(error).lower()
    return any(words in message for words in PEER_LOST_WORDS)


def _topology() -> tuple[int, int, int] | None:
    """``(this node, nodes, processes per node)`` of the process group, or None."""
    try:
        import ignite.distributed as idist

        return idist.get_node_rank(), idist.get_nnodes(), idist.get_nproc_per_node()
    except Exception:
        return None


def _node_words() -> str:
    topology = _topology()
    if topology is None or topology[1] < 2:
        return ""
    return f", node {topology[0]} of {topology[1]}"


def _node_of(rank: int) -> str:
    topology = _topology()
    if topology is None or topology[1] < 2:
        return ""
    return f" (node {rank // topology[2]} of {topology[1]})"


def last_words(folder: str, me: int, wait_s: float = 2.0) -> FailureRecord | None:
    """The record of another rank that failed first and wrote it into ``folder`` (the
    run's ``tracebacks/``, on a file system every node sees), or None. Waits up to
    ``wait_s`` for one: the rank that raised writes it before it exits, and this rank
    noticed the exit by its closed connection. A rank that only lost a peer is no cause;
    another node's rank that was killed leaves none: the caller then names the node."""
    deadline = time.monotonic() + wait_s
    while True:
        causes = [r for r in read_records(folder).values() if r.rank != me and r.kind != "lost"]
        if causes:
            return min(causes, key=lambda r: r.time)  # the first to write: the first to fail
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def lost_nodes(error: BaseException, timeout_s: float | None) -> str | None:
    """For a collective that timed out or lost its connection on a run of several nodes:
    which node(s) this rank lost, in words (``lost node 1 (rank 1), no answer within
    --timeout 15 s``); None for any other failure. This rank cannot tell a cut link from
    a dead or stopped process over there: the words name both."""
    topology = _topology()
    if topology is None or not peer_lost(error):
        return None
    node, nodes, per_node = topology
    if nodes < 2:
        return None
    others = [n for n in range(nodes) if n != node]

    def ranks(n):
        first, last = n * per_node, (n + 1) * per_node - 1
        return f"rank {first}" if first == last else f"ranks {first}-{last}"

    named = ", ".join(f"node {n} ({ranks(n)})" for n in others)
    if "timed out" in str(error).lower():
        within = f" within --timeout {timeout_s:g} s" if timeout_s else ""
        why = f"no answer{within} (a cut link, or its processes stopped or died)"
    else:
        why = "its connection closed (its processes died, or the link was reset)"
    return f"lost {'' if len(others) == 1 else 'one of '}{named}: {why}"


# ignite's engines log the exception they end on (``Current run is terminating due to
# exception: <the whole message>``) before re-raising it: the one line says it instead.
ENGINE_LOGGERS = ("ignite.engine.engine.Engine", "ignite.engine.engine.Trainer",
                  "ignite.engine.engine.DeterministicEngine")


class _DropTerminationLog(logging.Filter):
    def filter(self, record):
        message = str(record.msg)
        return not (message.startswith("Current run is terminating due to exception")
                    or message.startswith("Engine run is terminating due to exception"))


def quiet_engine_errors() -> None:
    """Drop ignite's "run is terminating due to exception" lines in this process."""
    for name in ENGINE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTerminationLog) for f in logger.filters):
            logger.addFilter(_DropTerminationLog())


def run_reporting(reporter: Reporter, fn, local_rank: int, *args):
    """``fn(local_rank, *args)``; an exception it raises becomes :class:`RankFailed`."""
    if not reporter.verbose:
        quiet_engine_errors()
    training_in(None)  # an earlier run in this process (a notebook's) is not this one
    try:
        return fn(local_rank, *args)
    except RankFailed:
        raise
    except DistkitError as e:  # a line that names its fix, or a stop at an iteration
        rank = _rank()
        reporter.record(record_of(e, rank, local_rank, str(e)))
        raise
    except Exception as e:
        raise reporter.failure(e, _rank(), local_rank) from None


def _rank() -> int:
    try:
        import ignite.distributed as idist

        return idist.get_rank()
    except Exception:
        return world_layout().rank


# --- under torchrun / SLURM: the worker reports itself ---------------------------------

def first_on_this_node() -> bool:
    """True for the first worker of this node (and this start of the job) to fail: only
    it prints, so a node prints one line however many of its ranks fail after it."""
    torchrun = elastic()
    error_file = torchrun.error_file
    if error_file and torchrun.run_id:
        # .../attempt_<k>/<local rank>/error.json: the attempt's folder is this agent's
        # (this node's, this start's) own, and torchrun removes it at the end
        marker = os.path.join(os.path.dirname(os.path.dirname(error_file)), "distkit-reported")
        return _create_once(marker)
    key = slurm_step_key()
    if key is None:
        return True
    return _create_once(os.path.join(tempfile.gettempdir(), f"distkit-failed-{os.getuid()}-{key}"))


def _create_once(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True


def write_error_file(line: str) -> None:
    """Record ``line`` in torchrun's per-worker error file, in the format
    ``torch.distributed.elastic.multiprocessing.errors.record`` writes; torchrun's
    summary prints its ``py_callstack`` as the root cause's "traceback"."""
    torchrun = elastic()
    path = torchrun.error_file
    if not path or not torchrun.run_id:
        return
    # Written whole, then renamed into place: torchrun reads the file as soon as it sees a
    # worker fail, and it may SIGTERM this worker mid-write (a rank killed first); an
    # empty or half-written file made torchrun's own agent crash in json.load (seen in CI).
    write_json_quietly(path, {"message": {"message": line, "extraInfo": {
        "py_callstack": line, "timestamp": str(int(time.time()))}}})


# How long a rank that only lost a peer waits for torchrun's agent to stop it (see
# report_from_worker). The agent looks at its workers every 0.1 s (--monitor-interval) and
# SIGTERMs the rest as soon as one has failed; 10 s leaves room for a loaded machine and
# is the whole delay where the agent never comes (the lost peer was on another node).
WITNESS_WAIT_S = 10.0


def report_from_worker(error: RankFailed, witness_waits: bool = True) -> RankFailed:
    """Under torchrun / SLURM: print the line (first failing rank of the node only),
    record it for torchrun's summary, and mark it reported.

    A rank that only lost a peer (``kind == "lost"``) is a witness: under torchrun, with
    other workers on its node, it first waits (up to :data:`WITNESS_WAIT_S`) for the
    agent to stop it, saying nothing. torchrun names as root cause the failure with the
    earliest timestamp, in whole seconds, the first worker it saw end winning a tie; a
    witness that wrote its error file and exited at once beat a killed peer (it notices
    the closed connection before the agent's next look), and torchrun named the witness.
    Stopped by the agent, the witness leaves the cause to the peer the agent saw first.
    ``witness_waits`` False: this rank reports at once (it prints the hang doctor's lines,
    which name the cause, after this one)."""
    if witness_waits and getattr(error, "kind", None) == "lost":
        _wait_for_the_agent()
    line = f"distkit: error: {error}"
    if first_on_this_node():
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    write_error_file(line)
    error.reported = True
    return error


def _wait_for_the_agent(wait_s: float = WITNESS_WAIT_S) -> None:
    """Under torchrun with other workers on this node: wait up to ``wait_s`` for the
    agent's SIGTERM, which then ends this process at once (the default action: the
    training's handler would only ask for a checkpoint at the next iteration)."""
    import signal

    if not elastic().run_id or local_world_size() < 2:
        return
    try:
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread: no handler of ours to wait under
        return
    try:
        time.sleep(wait_s)
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- messages of launch_function: its parameters, not distkit train's flags --------------

_FLAG_TO_PARAMETER = {"backend": "backend", "nproc-per-node": "nproc_per_node",
                      "nnodes": "nnodes", "node-rank": "node_rank",
                      "master-addr": "master_addr", "master-port": "master_port",
                      "timeout": "timeout_s", "threads-per-process": "threads_per_process"}


def for_function_callers(message: str) -> str:
    """Reword a message for a caller of ``launch_function``: parameters instead of
    ``distkit train`` flags, and no advice about ``--resume-from`` (a function has its
    own checkpoints, if any)."""
    message = re.sub(r"[.;]?\s*[Rr]esume (?:from the last complete checkpoint )?with --resume-from"
                     r" \S+(?: \([^)]*\))?", "", message)
    message = message.replace("or run distkit train without torchrun",
                              "or call launch_function outside torchrun")

    def parameter(m):
        name, value = _FLAG_TO_PARAMETER[m.group(1)], m.group(2)
        if value is None:
            return name
        if not re.fullmatch(r"-?[\d.]+", value):
            value = repr(value.strip("'\""))
        return f"{name}={value}"

    flags = "|".join(map(re.escape, sorted(_FLAG_TO_PARAMETER, key=len, reverse=True)))
    values = r"'[^']*'|-?\d+(?:\.\d+)?\b|gloo\b|nccl\b|auto\b|none\b|xla-tpu\b"
    message = re.sub(rf"--({flags})\b(?: ({values}))?", parameter, message)
    return message.rstrip()
