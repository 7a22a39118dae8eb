"""Facts about this machine and this process, and the checks on them that need no torch.

The lowest layer of the kit beside ``distkit.errors``: importing it imports neither torch
nor ignite (those that need ignite import it inside the function), so the command line,
``distkit doctor`` and the launcher's checks can use it before anything heavy loads.

- ports and addresses: :func:`free_port`, :func:`check_port_free`,
  :func:`check_address_resolves`;
- cores: :func:`threads_per_process` (this process's share), :func:`ranks_on_this_host`
  (how many ranks share them), :func:`available_memory`;
- this process's surroundings: :func:`in_ipython`, :func:`tpu_available` (who launched
  it, from torchrun's and SLURM's variables: :mod:`distkit.host.layout`, their one reader);
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
import socket
import sys
import threading
import time
from contextlib import contextmanager

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
# Process state, the interpreter, the TPU
# --------------------------------------------------------------------------------------


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


def stop_processes(processes, sig: int = 15, grace_s: float = 3.0, group: bool = False,
                   tree: bool = False) -> int:
    """Stop these child processes (``multiprocessing.Process`` or ``subprocess.Popen``):
    ``sig`` (SIGTERM by default) to each (``group``: to its process group, which holds
    what it started in its session; ``tree``: also to everything it started, sessions of
    its own included, listed from ``/proc`` first, while they are still its children);
    SIGKILL to any left after ``grace_s``; each reaped. A repeated Ctrl-C meanwhile is ignored, so the cleanup
    cannot be cut short. Returns how many were running. The one way the launchers, the
    harness and the tests' helpers stop processes."""
    import signal

    running = [p for p in processes if _running(p)]
    if not running:
        return 0
    started = {pid for p in running for pid in process_tree(p.pid)} if tree else set()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        for p in running:
            _send(p.pid, sig, group)
        _signal_each(started, sig)
        deadline = time.monotonic() + grace_s
        for p in running:
            _wait(p, max(0.0, deadline - time.monotonic()))
        for p in running:
            if _running(p):
                _send(p.pid, signal.SIGKILL, group)
                _wait(p, 5.0)
        _signal_each([pid for pid in started if process_alive(pid)], signal.SIGKILL)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    return len(running)


def _running(p) -> bool:
    return p.poll() is None if hasattr(p, "poll") else p.is_alive()


def _wait(p, timeout: float) -> None:
    if hasattr(p, "poll"):
        import subprocess

        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    else:
        p.join(timeout)


def _send(pid: int, sig: int, group: bool) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_each(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone already
            pass


# The process that ends a rank whose launcher died: started then, in a session of its own,
# so that it outlives the rank it stops; plain Python, nothing to import.
REAPER = """
import os, signal, sys, time
grace, pids = float(sys.argv[1]), [int(p) for p in sys.argv[2:]]
def signal_all(sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
signal_all(signal.SIGTERM)
deadline = time.monotonic() + grace
while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
    time.sleep(0.1)
signal_all(signal.SIGKILL)
"""


def end_with_parent(grace_s: float = 10.0, parent: int | None = None) -> None:
    """Make this process (a rank) end when its launcher dies, whatever it does: a
    daemon thread sees the launcher go (within half a second) and starts a reaper in a
    session of its own, which sends SIGTERM to this process and every process it started
    (children in sessions of their own included: they are listed first, while they are
    still this process's), then SIGKILL to any left ``grace_s`` seconds later. So a rank
    that ignores SIGTERM, and the children of a rank that does not, end too.
    ``parent``: the launcher's pid (default: the parent now); a launcher that died before
    the call is acted on at once. Linux only (``/proc``); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    parent = parent or os.getppid()
    threading.Thread(target=_reap_after_parent, args=(parent, grace_s), daemon=True,
                     name="distkit-end-with-parent").start()


def _reap_after_parent(parent: int, grace_s: float) -> None:
    import subprocess

    while os.getppid() == parent:
        time.sleep(0.5)
    pids = [*process_tree(os.getpid()), os.getpid()]
    subprocess.Popen([sys.executable, "-c", REAPER, repr(float(grace_s)), *map(str, pids)],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)


def in_ipython() -> bool:
    """True under an IPython shell (a notebook kernel, or ``ipython``)."""
    return "IPython" in sys.modules and \
        getattr(sys.modules["IPython"], "get_ipython", lambda: None)() is not None


def cuda_driver_initialised() -> bool:
    """Whether CUDA's driver was initialised in this process (``cuInit``), after which a
    child it forks cannot use CUDA: asked of the driver library already loaded here, never
    loading or initialising it. ``torch.cuda.is_initialized()`` is not enough: torch's own
    checks initialise the driver and leave it False (an optimizer step's CUDA-graph
    capture check does), and a nccl rank forked from a notebook kernel after such a step
    was killed by SIGSEGV on an H100. A loaded driver alone is harmless: importing torch
    loads it in a kernel whose forked nccl ranks ran there."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcuda.so" in line}
    except OSError:  # no /proc: not Linux, where the kit forks no rank
        return False
    paths = [p for p in paths if os.path.basename(p).startswith("libcuda.so")]
    if not paths:
        return False
    try:
        driver = ctypes.CDLL(paths[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        count = ctypes.c_int()
        not_initialised = 3  # CUDA_ERROR_NOT_INITIALIZED: every call but cuInit's answer before it
        return driver.cuDeviceGetCount(ctypes.byref(count)) != not_initialised
    except (OSError, AttributeError):
        return True  # loaded but not answering: take it as used


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
# on cuda:0 beside data on the CPU (docs/failures.md). The
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
