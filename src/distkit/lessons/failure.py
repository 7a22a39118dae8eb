"""Surviving failure: kill a rank on purpose (finding the checkpoint to resume from is
:mod:`distkit.checkpoint.saver`'s job).

A rank that dies mid-run must end the whole job quickly, with a message naming it, and a
restarted job must lose at most the iterations since the last checkpoint:

- Resuming (``--resume-from latest``) and atomic checkpoint writes are explained in
  :mod:`distkit.checkpoint.saver`.
- :func:`worker_pids` and :func:`kill_rank` find the process of a given rank under
  ``distkit train`` (``idist.Parallel``) or torchrun, so a test or a notebook can SIGKILL
  it from outside, as a crash would (Linux only: reads ``/proc``).
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from distkit.errors import DistkitError

from distkit.checkpoint.saver import checkpoint_iteration, checksum_problem, find_checkpoints, latest_checkpoint  # noqa: F401  (re-exported for notebooks)


# --- killing a rank on purpose (Linux: /proc) -------------------------------------------

def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                # "pid (comm) state ppid ...": comm may hold spaces, so split after ')'
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            kids.append(int(entry.name))
    return sorted(kids)


def _environ(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def creation_order(pids: list, parent: int, pid_max: int) -> list:
    """Children's pids in the order they were created: pids are handed out upwards from
    the parent's and wrap around at ``pid_max``, so 5 can be newer than 32760."""
    return sorted(pids, key=lambda p: (p - parent) % pid_max)


def worker_pids(launcher_pid: int, first_rank: int = 0) -> dict[int, int]:
    """``{rank: pid}`` of the training processes started by ``launcher_pid``.

    Under torchrun each worker's environment holds its ``RANK``. Processes spawned by
    ``idist.Parallel`` (``distkit train``) get their rank only after they start; they are
    started in local-rank order, so the n-th child is local rank n and its rank is
    ``first_rank + n`` (``first_rank = node_rank * nproc_per_node``). "n-th" counts pids
    from the launcher's own, modulo ``pid_max``: pids wrap around (at 32768 here)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    kids = creation_order([p for p in _children(launcher_pid)
                           if "resource_tracker" not in _cmdline(p) and "forkserver" not in _cmdline(p)],
                          launcher_pid, pid_max)
    ranks = {}
    for n, pid in enumerate(kids):
        env = _environ(pid)
        ranks[int(env["RANK"]) if "RANK" in env and "TORCHELASTIC_RUN_ID" in env else first_rank + n] = pid
    return ranks


def wait_for_workers(launcher_pid: int, count: int, timeout: float = 60, first_rank: int = 0) -> dict[int, int]:
    """Wait until ``launcher_pid`` has ``count`` training processes; return ``{rank: pid}``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = worker_pids(launcher_pid, first_rank)
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    raise TimeoutError(f"process {launcher_pid} did not start {count} workers within {timeout} s")


def wait_for_checkpoint(output_dir, min_iteration: int, timeout: float = 60, poll: float = 0.02) -> str:
    """Wait until a checkpoint of at least ``min_iteration`` exists under ``output_dir``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in reversed(find_checkpoints(output_dir)):
            # complete: its checksum, written after the file, is there and holds
            if checkpoint_iteration(path) >= min_iteration and checksum_problem(str(path)) is None:
                return str(path)
        time.sleep(poll)
    raise TimeoutError(f"no checkpoint at iteration >= {min_iteration} under {output_dir} within {timeout} s")


def kill_rank(launcher_pid: int, rank: int, sig: int = signal.SIGKILL, first_rank: int = 0) -> int:
    """Send ``sig`` (default SIGKILL: no clean-up, like a crash or the OOM killer) to the
    process of ``rank`` under ``launcher_pid``; return its pid."""
    pids = worker_pids(launcher_pid, first_rank)
    if rank not in pids:
        raise LookupError(f"no rank {rank} under process {launcher_pid} (found ranks {sorted(pids)})")
    os.kill(pids[rank], sig)
    return pids[rank]


def kill_during_save(save, directory, min_bytes: int = 10_000_000, timeout: float = 60) -> dict:
    """Run ``save(i)`` for i = 0, 1, ... in a forked process that writes into
    ``directory``; SIGKILL it while a temporary file of a save (``tmp*``, as
    ``DiskSaver(atomic=True)`` writes) holds at least ``min_bytes``, fewer than a complete
    ``*.pt``. A kill that landed once the write had ended (the file whole, not yet renamed)
    does not count: the file is removed and the saves start again. Return
    ``{"partial": path, "partial_bytes": n, "complete": [paths]}``, ``n`` measured after
    the kill."""
    directory = Path(directory)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        caught = _kill_one_save(save, directory, min_bytes, deadline)
        if caught is not None:
            return caught
    raise TimeoutError(f"no save in progress with >= {min_bytes} bytes caught within {timeout} s")


def _kill_one_save(save, directory: Path, min_bytes: int, deadline: float) -> dict | None:
    """One try of :func:`kill_during_save`: None where the kill came after the write."""
    import multiprocessing as mp

    proc = mp.get_context("fork").Process(target=_save_forever, args=(save,))
    proc.start()
    try:
        while time.monotonic() < deadline and proc.is_alive():
            try:
                complete = sorted(directory.glob("*.pt"), key=lambda p: p.stat().st_mtime)
                whole = complete[-1].stat().st_size if complete else 0
                ready = [p for p in directory.glob("tmp*") if min_bytes <= p.stat().st_size < whole]
            except FileNotFoundError:  # renamed while we looked: that save completed
                ready = []
            if ready:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
                return _mid_write(ready[0], whole, complete)
            time.sleep(0.001)
        return None
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def _mid_write(partial: Path, whole: int, complete: list) -> dict | None:
    """What a kill left: the partial file, if it is still short of a whole save."""
    try:
        size = partial.stat().st_size
    except FileNotFoundError:  # renamed between the look and the kill
        return None
    if size >= whole:  # written to its end before the kill: not a write cut short
        partial.unlink()
        return None
    return {"partial": str(partial), "partial_bytes": size,
            "complete": sorted(str(p) for p in complete)}


def _save_forever(save):
    i = 0
    while True:
        save(i)
        i += 1
