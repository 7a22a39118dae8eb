"""Facts about this machine and this process, and the checks on them that need no torch.

The lowest layer of the kit beside ``distkit.errors``: importing it imports neither torch
nor ignite (those that need ignite import it inside the function), so the command line,
``distkit doctor`` and the launcher's checks can use it before anything heavy loads.

- ports and addresses: :func:`free_port`, :func:`check_port_free`,
  :func:`check_address_resolves`;
- cores: :func:`threads_per_process` (this process's share), :func:`ranks_on_this_host`
  (how many ranks share them), :func:`local_world_size`, :func:`available_memory`;
- who started us: :func:`world_layout` (rank, world size, nodes from torchrun or
  SLURM), :func:`launched_externally`, :func:`inside_launch`, :func:`in_ipython`,
  :func:`tpu_available`;
- ignite's log lines: :class:`quiet_ignite_logs`, :func:`set_ignite_verbosity`;
- GPUs hidden from the processes a gloo launch starts: :func:`cpu_only_processes`;
- processes, from ``/proc`` (Linux): :func:`process_state`, :func:`process_alive`,
  :func:`process_tree` (what the launcher's watchdog, the tests and the benchmarks read).

Example::

    >>> from distkit.host.facts import free_port, threads_per_process
    >>> 1024 <= free_port() <= 65535
    True
    >>> threads_per_process(1) >= threads_per_process(2) >= 1
    True
"""
from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
from contextlib import contextmanager
from typing import NamedTuple

from distkit.errors import DistkitError

# --------------------------------------------------------------------------------------
# Ports and addresses
# --------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """One line if ``--master-port`` is taken on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            raise DistkitError(f"--master-port {port} is already in use on this machine: pick "
                               "another port, or omit --master-port to use a free one") from None


def check_address_resolves(addr: str, timeout_s: float = 10.0) -> None:
    """Resolve ``--master-addr`` now: a name that does not resolve would otherwise make
    every rank wait on the rendezvous until the timeout. getaddrinfo has no timeout of
    its own, so it runs in a daemon thread that we stop waiting for."""
    outcome = {}

    def resolve():
        try:
            socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
            outcome["ok"] = True
        except OSError as e:
            outcome["error"] = e

    thread = threading.Thread(target=resolve, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "ok" in outcome:
        return
    why = outcome["error"].strerror or outcome["error"] if "error" in outcome else \
        f"no answer from the resolver in {timeout_s:g} s"
    raise DistkitError(f"--master-addr {addr!r} does not resolve ({why}): pass the IP address or "
                       "host name of the node with --node-rank 0, as the other nodes can reach it")


# --------------------------------------------------------------------------------------
# Cores and memory
# --------------------------------------------------------------------------------------


def threads_per_process(local_world_size: int) -> int:
    """Cores this process may use, divided by the processes on this node (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def ranks_on_this_host() -> int:
    """The ranks of this run that share this machine's cores, counted by hostname (one
    ``all_gather`` at start-up; call on every rank). Not torchrun's LOCAL_WORLD_SIZE: two
    launches on one machine (two "nodes" on 127.0.0.1) each count only their own ranks,
    and with that count share the cores twice over."""
    import ignite.distributed as idist

    if idist.get_world_size() == 1:
        return 1
    if idist.backend() == "xla-tpu":  # TPU hosts: one launch per host; skip a string collective on XLA
        return idist.get_nproc_per_node()
    me = socket.gethostname()
    names = idist.all_gather(me)
    return sum(name == me for name in (names if isinstance(names, list) else [names]))


def local_world_size() -> int:
    """The processes a torchrun / SLURM launch started on this node (1 outside one)."""
    return world_layout().local_world_size


def available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable``), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # not Linux: cannot tell, do not refuse


# --------------------------------------------------------------------------------------
# Who started this process
# --------------------------------------------------------------------------------------


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


def _tasks_on_this_node(environ, ntasks: int, nnodes: int, node_rank: int) -> int:
    """SLURM's tasks on this node: ``SLURM_NTASKS_PER_NODE`` if given, else this node's
    entry of ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``: 2 tasks on each of 3 nodes, then 1),
    else the tasks spread evenly."""
    if environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return int(environ["SLURM_NTASKS_PER_NODE"])
    counts = []
    for part in environ.get("SLURM_STEP_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE", "")).split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    if node_rank < len(counts):
        return counts[node_rank]
    return max(1, ntasks // max(1, nnodes))


def world_layout(environ=os.environ) -> WorldLayout:
    """Rank, local rank, world size and nodes of this process, from torchrun's variables
    (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) or, in
    an ``srun`` job step, from SLURM's (``SLURM_PROCID``, ``SLURM_LOCALID``,
    ``SLURM_NTASKS``, ``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_NTASKS_PER_NODE`` /
    ``SLURM_TASKS_PER_NODE``); rank 0 of 1 outside any launch. The one reading of the
    launch that preflight, resume checks and the summary share (``srun`` sets no
    ``WORLD_SIZE``: a resume read 1 there and was refused)::

        >>> world_layout({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
        ...               "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
        ...               "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x2)"})[:6]
        (3, 1, 4, 2, 2, 1)
    """
    if "WORLD_SIZE" in environ:
        world = int(environ["WORLD_SIZE"])
        local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
        rank = int(environ.get("RANK", "0"))
        nnodes = max(1, -(-world // max(1, local_world)))
        node_rank = int(environ.get("GROUP_RANK", rank // max(1, local_world)))
        return WorldLayout(rank, int(environ.get("LOCAL_RANK", "0")), world, local_world,
                           nnodes, node_rank, "torchrun")
    if in_slurm_step(environ):
        world = int(environ.get("SLURM_NTASKS", environ.get("SLURM_NPROCS", "1")))
        nnodes = int(environ.get("SLURM_NNODES", environ.get("SLURM_JOB_NUM_NODES", "1")))
        node_rank = int(environ.get("SLURM_NODEID", "0"))
        return WorldLayout(int(environ["SLURM_PROCID"]), int(environ.get("SLURM_LOCALID", "0")),
                           world, _tasks_on_this_node(environ, world, nnodes, node_rank),
                           nnodes, node_rank, "slurm")
    return WorldLayout(0, 0, 1, 1, 1, 0, "none")


def in_slurm_step(environ=os.environ) -> bool:
    """True in a task that ``srun`` started (a job step), not in the batch script itself."""
    return "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ and \
        ("SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ)


def check_not_sbatch_without_srun(environ=os.environ) -> None:
    """Refuse ``distkit train`` run straight from an ``sbatch`` script of several tasks,
    without ``srun``: that one process would wait for the other tasks' rendezvous until
    it timed out (121 s), and they were never started."""
    if "SLURM_JOB_ID" not in environ or in_slurm_step(environ) or "WORLD_SIZE" in environ:
        return
    ntasks = int(environ.get("SLURM_NTASKS", environ.get("SLURM_NPROCS", "1")) or 1)
    if ntasks > 1:
        raise DistkitError(
            f"this is SLURM job {environ['SLURM_JOB_ID']}'s batch script, not a job step: its "
            f"{ntasks} tasks start only under srun: write `srun python -m distkit train ...` "
            "in the sbatch script (as scripts/slurm.sbatch does)")


def launched_externally() -> bool:
    """True inside a torchrun / torch.distributed launch or a SLURM job step."""
    return "WORLD_SIZE" in os.environ or "SLURM_JOB_ID" in os.environ


def inside_launch() -> bool:
    """True in a process that torchrun (WORLD_SIZE) or a several-task ``srun`` started:
    spawning more processes there would start a second, conflicting job per process."""
    return "WORLD_SIZE" in os.environ or int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (R, S, D, T, Z ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, is not alive)."""
    return process_state(pid) not in (None, "Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid``'s descendants, read from ``/proc``: children, their children ..., workers in
    sessions or process groups of their own included (``pgrep -s`` misses those)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        for child in parents.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def in_ipython() -> bool:
    """True under an IPython shell (a notebook kernel, or ``ipython``)."""
    return "IPython" in sys.modules and \
        getattr(sys.modules["IPython"], "get_ipython", lambda: None)() is not None


def tpu_available() -> bool:
    """torch_xla importable and a TPU attached (or asked for with ``PJRT_DEVICE=TPU``)."""
    try:
        import torch_xla.runtime as xr  # noqa: F401

        return os.environ.get("PJRT_DEVICE", "").upper() == "TPU" or bool(os.environ.get("TPU_NAME")) \
            or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
    except Exception:
        return False


# --------------------------------------------------------------------------------------
# ignite's log lines
# --------------------------------------------------------------------------------------

# Every logger ignite's distributed helpers create with ``ignite.utils.setup_logger``.
IGNITE_LOGGERS = ("ignite.distributed.launcher.Parallel", "ignite.distributed.auto.auto_dataloader",
                  "ignite.distributed.auto.auto_model", "ignite.distributed.utils",
                  # "EarlyStopping: Stop training": the run's summary says it instead
                  "ignite.handlers.early_stopping.EarlyStopping")


class quiet_ignite_logs:
    """Hide ignite's INFO lines about spawning processes and wrapping loaders and models
    (warnings still show), and restore the previous levels afterwards.

    As a context manager it restores on exit; called as a plain statement (a notebook's
    first cell) it stays in force for the session::

        >>> import logging
        >>> from distkit.host.facts import quiet_ignite_logs
        >>> parallel = logging.getLogger("ignite.distributed.launcher.Parallel")
        >>> parallel.setLevel(logging.INFO)  # as ignite's setup_logger leaves it
        >>> with quiet_ignite_logs():
        ...     parallel.level == logging.WARNING
        True
        >>> parallel.level == logging.INFO
        True

    Why not just ``setLevel``: ``setup_logger`` keeps the level of a logger that already
    exists but attaches its handler only when it creates one, so each logger is first
    created the way ignite does (``setup_logger(name)``); then restoring its level gives
    back exactly what ignite alone would show."""

    def __init__(self, level: int = logging.WARNING):
        from ignite.utils import setup_logger

        self._previous = {}
        for name in IGNITE_LOGGERS:
            logger = setup_logger(name)  # no-op for a logger that exists
            self._previous[name] = logger.level
            logger.setLevel(level)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()

    def restore(self) -> None:
        for name, level in self._previous.items():
            logging.getLogger(name).setLevel(level)


def set_ignite_verbosity(verbose: bool) -> quiet_ignite_logs:
    """ignite's launcher and ``auto_*`` INFO lines through (``verbose``) or not; warnings
    always. Call in every process that may log them (the launcher, and each rank).
    Returns the switch: ``.restore()`` puts the previous levels back."""
    return quiet_ignite_logs(logging.INFO if verbose else logging.WARNING)


# --------------------------------------------------------------------------------------
# The network interface that routes to the master
# --------------------------------------------------------------------------------------

# The variable each backend reads to choose the interface it binds to.
SOCKET_IFNAME_VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


def interface_addresses() -> dict:
    """``{interface name: IPv4 address}`` of this host's interfaces that have one (Linux:
    ``SIOCGIFADDR``; elsewhere empty)."""
    import fcntl
    import struct

    found = {}
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
                found[name] = socket.inet_ntoa(packed[20:24])
            except OSError:
                continue
    return found


def interface_to(address: str) -> tuple[str, str] | None:
    """``(interface, its address)`` this host would use to reach ``address`` (the kernel's
    route, asked with a UDP ``connect``, which sends nothing); None when no route leads
    there or the address does not resolve."""
    try:
        target = socket.getaddrinfo(address, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(target)
            source = s.getsockname()[0]
    except OSError:
        return None
    for name, ip in interface_addresses().items():
        if ip == source:
            return name, ip
    return None


def socket_interface(backend: str, master_addr: str | None, environ=os.environ) -> dict | None:
    """What the process group of ``backend`` should bind to, to reach ``master_addr``:
    ``{"variable", "interface", "address", "set_by"}`` (``set_by``: ``"you"`` when the
    variable is already set, else ``"distkit"``), or None when nothing needs choosing
    (no master address, or a backend that reads no such variable).

    Why: gloo (and nccl's socket transport) find their own address by resolving this
    host's name; on many clusters and cloud VMs the name resolves to nothing or to
    127.0.0.1, gloo then binds to the loopback, and the other nodes cannot connect. The
    interface whose address the kernel would use to reach the master is the one the
    other nodes can reach us on. Raises a one-line ``DistkitError`` when no interface
    routes there."""
    variable = SOCKET_IFNAME_VARIABLES.get(backend)
    if variable is None or not master_addr:
        return None
    if environ.get(variable):
        return {"variable": variable, "interface": environ[variable], "address": None,
                "set_by": "you"}
    picked = interface_to(master_addr)
    if picked is None:
        have = ", ".join(f"{n} ({ip})" for n, ip in interface_addresses().items()) or "none"
        raise DistkitError(
            f"no network interface of this host routes to the master address {master_addr!r} "
            f"(interfaces: {have}): check the address, or set {variable} to the interface "
            "the other nodes reach this one on")
    return {"variable": variable, "interface": picked[0], "address": picked[1],
            "set_by": "distkit"}


# ignite puts every process it starts on GPU <local rank> whenever CUDA is available,
# gloo included (torch.cuda.set_device in ignite/distributed/comp_models/native.py). So
# on a machine with fewer GPUs than gloo processes (Colab's GPU runtime has one) the
# process of local rank 1 failed with "invalid device ordinal", and rank 0 put its model
# on cuda:0 beside data on the CPU: 12 of the 14 notebooks failed so on an H200 (26 Nov). The
# kit's gloo processes are CPU processes. CUDA_VISIBLE_DEVICES="" hides the GPUs from a
# process that has not initialised CUDA; PYTORCH_NVML_BASED_CUDA_CHECK=1 makes
# torch.cuda.is_available() count them through NVML, which reads CUDA_VISIBLE_DEVICES at
# each call, so a child forked after its parent asked CUDA for the count sees none too.
CPU_ONLY_ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


@contextmanager
def cpu_only_processes(environ=os.environ):
    """Processes started inside this block see no GPU: ``torch.cuda.is_available()`` is
    False there, and ignite's ``idist.device()`` is the CPU. The variables are put back
    when the block ends (this process keeps its GPUs once it has initialised CUDA).

    >>> import os
    >>> with cpu_only_processes():
    ...     os.environ["CUDA_VISIBLE_DEVICES"]
    ''
    """
    previous = {name: environ.get(name) for name in CPU_ONLY_ENVIRONMENT}
    environ.update(CPU_ONLY_ENVIRONMENT)
    try:
        yield
    finally:
        restore_environment(previous, environ)


def restore_environment(previous: dict | None, environ=os.environ) -> None:
    """Put back variables saved as ``{name: value or None}`` (None: it was not set)."""
    for name, value in (previous or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
