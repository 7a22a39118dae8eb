"""The one reader of the variables a launcher sets: torchrun's (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``TORCHELASTIC_*``) and SLURM's (``SLURM_*``). No other module of the kit
reads them (``tests/package/test_layout.py`` checks), so "inside an ``srun`` step", SLURM's tasks
per node and the master's address mean one thing everywhere.

- :func:`world_layout`: rank, world size, nodes, master address and port of this process,
  checked: a value no launcher would set (``WORLD_SIZE=abc``, ``RANK`` >= ``WORLD_SIZE``,
  ``MASTER_PORT=70000``, ``LOCAL_RANK`` missing ...) raises :class:`LayoutError`, one line
  naming the variable and the fix, before any process waits on a rendezvous;
- :func:`in_slurm_step`, :func:`launched_externally`, :func:`inside_launch`,
  :func:`check_not_sbatch_without_srun`: who started us;
- :func:`elastic`: torchrun's own facts (restart count, error file, shared store);
- :func:`claimed_rank`, :func:`slurm_job`, :func:`launcher_variables`: what an error
  report or ``distkit doctor`` shows, read without checking (they run when the checks
  have already failed, or to show what is set).

Imports nothing heavy (no torch): the command line reads it before torch loads.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from distkit.errors import DistkitError

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for every worker (``distkit launch`` sets the same)."""

MAX_PORT = 65535


PER_RANK = ("RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


class LayoutError(DistkitError):
    """A launcher variable holds a value no launcher sets: ``variable`` names it. A value
    every rank shares is refused alike by all: one line per run, from rank 0; a rank's
    own (``RANK``, ``SLURM_PROCID`` ...) by that rank."""

    def __init__(self, variable: str, message: str):
        super().__init__(message)
        self.variable = variable
        self.every_rank = variable not in PER_RANK


class WorldLayout(NamedTuple):
    """Where this process stands in the launch that started it (:func:`world_layout`)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    nnodes: int
    node_rank: int
    launcher: str
    """``"torchrun"`` (or any launcher that sets ``WORLD_SIZE``), ``"slurm"`` (an ``srun``
    job step) or ``"none"`` (this process alone: rank 0 of 1)."""
    master_addr: str | None = None
    master_port: int | None = None
    """Set by torchrun; in a SLURM step ``MASTER_ADDR``/``MASTER_PORT`` if given, else the
    step's first host and 15000 + the job id's last 4 digits (ignite's rule)."""


# --------------------------------------------------------------------------------------
# Reading one variable, checked
# --------------------------------------------------------------------------------------

def _fix(name: str) -> str:
    if name.startswith("SLURM_"):
        return ("srun sets it for every task of a job step: run the command under srun "
                "(scripts/slurm.sbatch), or unset the SLURM_* variables to run outside SLURM")
    return ("torchrun sets it for every worker: launch with torchrun, or unset WORLD_SIZE, RANK, "
            "LOCAL_RANK and the other torchrun variables to let distkit start the processes")


ASCII_SPACE = " \t\n\r\f\v"


def _whole(environ, name: str, low: int = 0, high: int | None = None, default=None,
           what: str = "") -> int:
    """``environ[name]`` as a whole number in ``[low, high)`` (high: None for no bound);
    ``default`` where it is missing (None: missing is an error)."""
    raw = environ.get(name)
    text = None if raw is None else raw.strip(ASCII_SPACE)  # str.strip() also eats "\x85"
    if not text:
        if default is not None:
            return default
        raise LayoutError(name, f"{name} is {'empty' if raw is not None else 'not set'}, but the "
                                f"other launch variables are: {_fix(name)}")
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):  # int() would take "1_000" and "٣"
        raise LayoutError(name, f"{name}={raw!r} is not a whole number: {_fix(name)}")
    value = int(text)
    if value < low or (high is not None and value >= high):
        bound = f"from {low} to {high - 1}" if high is not None else f"at least {low}"
        raise LayoutError(name, f"{name}={raw!r} is out of range (must be {bound}{what}): {_fix(name)}")
    return value


def _port(environ, name: str, default: int | None) -> int | None:
    if environ.get(name) is None and default is None:
        return None
    return _whole(environ, name, 1, MAX_PORT + 1, default=default, what=", a TCP port")


def _address(environ, name: str, default: str | None) -> str | None:
    raw = environ.get(name)
    if raw is None:
        return default
    if not raw.strip() or any(c.isspace() for c in raw):
        raise LayoutError(name, f"{name}={raw!r} is not a host name or address: set it to the "
                                "address of the node of rank 0 (torchrun's --master-addr), or unset it")
    return raw


# --------------------------------------------------------------------------------------
# The layout
# --------------------------------------------------------------------------------------

def in_slurm_step(environ=os.environ) -> bool:
    """True in a task that ``srun`` started (a job step), not in the batch script itself:
    ``SLURM_PROCID`` and a step's own variable (``SLURM_STEP_ID``, ``SLURM_STEPID`` or
    ``SLURM_STEP_NUM_TASKS``) set."""
    return "SLURM_PROCID" in environ and any(
        name in environ for name in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"))


def _tasks_on_this_node(environ, ntasks: int, nnodes: int, node_rank: int) -> int:
    """SLURM's tasks on this node, the step's own count first: ``SLURM_STEP_TASKS_PER_NODE``
    (``"2(x3),1"``: 2 tasks on each of 3 nodes, then 1), else the job's
    ``SLURM_NTASKS_PER_NODE``, else the job's ``SLURM_TASKS_PER_NODE``, else the tasks
    spread evenly."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        spec = environ.get(name, "").strip(ASCII_SPACE)
        if not spec:
            continue
        counts = []
        for part in spec.split(","):
            m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip(ASCII_SPACE))
            if not m or int(m.group(1)) < 1:
                raise LayoutError(name, f"{name}={spec!r} is not a task count per node (like "
                                        f"'2' or '2(x3),1'): {_fix(name)}")
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        if name == "SLURM_NTASKS_PER_NODE":  # the same on every node
            return counts[0]
        if node_rank < len(counts):
            return counts[node_rank]
    return max(1, ntasks // nnodes)


def _first(environ, *names: str) -> str:
    """The first of ``names`` that is set (the last name when none is: its error names it)."""
    return next((n for n in names if environ.get(n) is not None), names[-1])


def _slurm_nodes(environ) -> tuple[str, int, int, int]:
    """``(the variable of the task count, tasks, nodes, this node)`` of the step, checked."""
    ntasks_name = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    world = _whole(environ, ntasks_name, 1, default=1)
    nnodes = _whole(environ, _first(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
                                     "SLURM_JOB_NUM_NODES"), 1, world + 1, default=1,
                    what=f", at most the {world} tasks")
    node_rank = _whole(environ, "SLURM_NODEID", 0, nnodes, default=0,
                       what=f", one of the step's {nnodes} nodes")
    return ntasks_name, world, nnodes, node_rank


def tasks_on_node(environ=os.environ) -> int:
    """This node's tasks in the SLURM step (the count only; :func:`world_layout` checks
    this task's place among them)."""
    _, world, nnodes, node_rank = _slurm_nodes(environ)
    return _tasks_on_this_node(environ, world, nnodes, node_rank)


def _slurm_layout(environ) -> WorldLayout:
    ntasks_name, world, nnodes, node_rank = _slurm_nodes(environ)
    rank = _whole(environ, "SLURM_PROCID", 0, world, what=f", below {ntasks_name}={world}")
    local_world = _tasks_on_this_node(environ, world, nnodes, node_rank)
    local_rank = _whole(environ, "SLURM_LOCALID", 0, local_world, default=0,
                        what=f", below this node's {local_world} tasks")
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", "0")).strip(ASCII_SPACE)
    if not job.isdigit():
        raise LayoutError("SLURM_JOB_ID", f"SLURM_JOB_ID={job!r} is not a job number: "
                                          f"{_fix('SLURM_JOB_ID')}")
    port = _port(environ, "MASTER_PORT", 15000 + int(job[-4:] or 0))  # checked before ignite loads
    return WorldLayout(rank, local_rank, world, local_world, nnodes, node_rank, "slurm",
                       _address(environ, "MASTER_ADDR", None) or _first_host(environ), port)


def _first_host(environ) -> str:
    """The step's first host, where ignite's SLURM rendezvous puts the master."""
    from ignite.distributed.comp_models.native import _expand_hostlist

    name = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
    nodelist = environ.get(name) or "localhost"
    try:
        return _expand_hostlist(nodelist)[0]
    except Exception:  # ignite's parser: IndexError, ValueError ... on a list SLURM never writes
        raise LayoutError(name, f"{name}={nodelist!r} is not a host list: {_fix(name)}") from None


def _torchrun_layout(environ) -> WorldLayout:
    world = _whole(environ, "WORLD_SIZE", 1, what=", the number of processes")
    rank = _whole(environ, "RANK", 0, world, what=f", below WORLD_SIZE={world}")
    local_world = _whole(environ, "LOCAL_WORLD_SIZE", 1, world + 1, default=world,
                         what=f", at most WORLD_SIZE={world}")
    local_rank = _whole(environ, "LOCAL_RANK", 0, local_world,
                        what=f", below LOCAL_WORLD_SIZE={local_world}")
    nnodes = _whole(environ, "GROUP_WORLD_SIZE", 1, world + 1,
                    default=max(1, -(-world // local_world)), what=f", at most WORLD_SIZE={world}")
    node_rank = _whole(environ, "GROUP_RANK", 0, nnodes, default=min(rank // local_world, nnodes - 1),
                       what=f", below the {nnodes} nodes")
    return WorldLayout(rank, local_rank, world, local_world, nnodes, node_rank, "torchrun",
                       _address(environ, "MASTER_ADDR", None), _port(environ, "MASTER_PORT", None))


def world_layout(environ=os.environ) -> WorldLayout:
    """Rank, local rank, world size, nodes and master of this process, from torchrun's
    variables (``WORLD_SIZE`` set) or, in an ``srun`` job step, from SLURM's; rank 0 of 1
    outside any launch. Every value is checked (:class:`LayoutError`)::

        >>> world_layout({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
        ...               "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
        ...               "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x2)"})[:6]
        (3, 1, 4, 2, 2, 1)
        >>> try:
        ...     world_layout({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
        ... except LayoutError as e:
        ...     print(str(e)[:71])
        RANK='2' is out of range (must be from 0 to 1, below WORLD_SIZE=2): tor
    """
    if "WORLD_SIZE" in environ:
        return _torchrun_layout(environ)
    if in_slurm_step(environ):
        return _slurm_layout(environ)
    for name in TORCHRUN_VARIABLES[:2]:  # RANK / LOCAL_RANK alone: a launch half set up
        if name in environ:
            raise LayoutError(name, f"{name} is set but WORLD_SIZE is not: {_fix(name)}")
    return WorldLayout(0, 0, 1, 1, 1, 0, "none")


def local_world_size(environ=os.environ) -> int:
    """The processes a torchrun / SLURM launch started on this node (1 outside one)."""
    return world_layout(environ).local_world_size


def launched_externally(environ=os.environ) -> bool:
    """True inside a torchrun / torch.distributed launch or a SLURM job (its batch script
    included); the layout is checked on the way."""
    return world_layout(environ).launcher != "none" or "SLURM_JOB_ID" in environ


def inside_launch(environ=os.environ) -> bool:
    """True in a process that torchrun or a several-task ``srun`` step started: spawning
    more processes there would start a second, conflicting job per process."""
    layout = world_layout(environ)
    return layout.launcher == "torchrun" or (layout.launcher == "slurm" and layout.world_size > 1)


def check_not_sbatch_without_srun(environ=os.environ) -> None:
    """Refuse ``distkit train`` run straight from an ``sbatch`` script of several tasks,
    without ``srun``: that one process would wait for the other tasks' rendezvous until
    it timed out, and they were never started."""
    if "SLURM_JOB_ID" not in environ or world_layout(environ).launcher != "none":
        return
    ntasks = _whole(environ, _first(environ, "SLURM_NTASKS", "SLURM_NPROCS"), 1, default=1)
    if ntasks > 1:
        raise DistkitError(
            f"this is SLURM job {environ['SLURM_JOB_ID']}'s batch script, not a job step: its "
            f"{ntasks} tasks start only under srun: write `srun python -m distkit train ...` "
            "in the sbatch script (as scripts/slurm.sbatch does)")


# --------------------------------------------------------------------------------------
# torchrun's own facts, and what reports show
# --------------------------------------------------------------------------------------

class Elastic(NamedTuple):
    """What torchrun's agent tells its workers about the run (:func:`elastic`)."""

    run_id: str | None
    """``TORCHELASTIC_RUN_ID``: set only under torchrun (not under ``distkit launch``)."""
    restart_count: int
    max_restarts: int
    agent_store: bool
    """The workers meet in the agent's TCP store (``TORCHELASTIC_USE_AGENT_STORE=True``)."""
    error_file: str | None
    """``TORCHELASTIC_ERROR_FILE``: where ``@record`` writes a worker's failure."""
    one_node: bool
    """``LOCAL_WORLD_SIZE`` equals ``WORLD_SIZE`` (unset counts as equal)."""
    store: tuple | None
    """``(MASTER_ADDR, MASTER_PORT, WORLD_SIZE)`` of the agent's store, None without a port."""


def _lenient(environ, name: str, default: int = 0) -> int:
    try:
        return int(environ.get(name, default) or default)
    except ValueError:
        return default


def elastic(environ=os.environ) -> Elastic:
    """torchrun's agent variables, read without raising (they only shape messages and
    the choice of a store; the layout itself is checked by :func:`world_layout`)."""
    return Elastic(environ.get("TORCHELASTIC_RUN_ID"), _lenient(environ, "TORCHELASTIC_RESTART_COUNT"),
                   _lenient(environ, "TORCHELASTIC_MAX_RESTARTS"),
                   environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                   environ.get("TORCHELASTIC_ERROR_FILE"),
                   environ.get("LOCAL_WORLD_SIZE") == environ.get("WORLD_SIZE"),
                   (environ.get("MASTER_ADDR", "127.0.0.1"), _lenient(environ, "MASTER_PORT"),
                    _lenient(environ, "WORLD_SIZE", 1)) if "MASTER_PORT" in environ else None)


def claimed_rank(environ=os.environ) -> str:
    """The rank this process was given (torchrun's ``RANK``, else ``SLURM_PROCID``, else
    ``"0"``), unchecked: for the line that reports a failure, the checks' own included."""
    return environ.get("RANK", environ.get("SLURM_PROCID", "0"))


def slurm_job(environ=os.environ) -> str | None:
    """The SLURM job id (``SLURM_JOB_ID``), None outside SLURM."""
    return environ.get("SLURM_JOB_ID")


def slurm_step_key(environ=os.environ) -> str | None:
    """``slurm<job>-<step>-<node>``, a name the tasks of one node of one step share; None
    outside a SLURM job."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return (f"slurm{environ['SLURM_JOB_ID']}-{environ.get('SLURM_STEP_ID', '0')}-"
            f"{environ.get('SLURM_NODEID', '0')}")


def slurm_cpus_per_task(environ=os.environ) -> str | None:
    """``SLURM_CPUS_PER_TASK`` as given, None where SLURM did not say."""
    return environ.get("SLURM_CPUS_PER_TASK")


LAUNCHER_VARIABLES = ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def launcher_variables(environ=os.environ, names=LAUNCHER_VARIABLES) -> dict:
    """The launcher variables set here, and every ``SLURM_*`` one, as they are (for
    ``distkit doctor``)."""
    shown = [n for n in names if n in environ] + sorted(n for n in environ if n.startswith("SLURM_"))
    return {n: environ[n] for n in shown}


def launched_by(environ=os.environ) -> str | None:
    """``"torchrun"``, ``"slurm"`` or None: who started this process, as a person would say."""
    return "torchrun" if "TORCHELASTIC_RUN_ID" in environ else \
        "slurm" if "SLURM_JOB_ID" in environ else None
