"""What each process sees and what processes cost: the helpers behind notebooks 01 and 02.

- :func:`process_info`: what ``idist`` tells a process about itself. The collectives,
  ``one_rank_first`` and the ``auto_*`` helpers are typed in the notebooks' own cells.
- :func:`oversubscription`: the cost of more busy processes than cores, measured.
- :func:`copy_bandwidth`: the cost of host <-> device copies, measured.

Example::

    from distkit.lessons.collectives import process_info
    from distkit.launch.runner import run_per_rank
    seen = run_per_rank(process_info, nproc_per_node=2)
    assert [s["rank"] for s in seen] == [0, 1]
"""
from __future__ import annotations

import os
import statistics
import time

import ignite.distributed as idist
import torch



# --------------------------------------------------------------------------- per rank

def process_info(local_rank: int) -> dict:
    """Who am I? The five numbers every distributed process can ask ``idist`` for."""
    return {
        "rank": idist.get_rank(),
        "local_rank": local_rank,
        "world_size": idist.get_world_size(),
        "nproc_per_node": idist.get_nproc_per_node(),
        "backend": idist.backend(),
        "device": str(idist.device()),
        "device_name": torch.cuda.get_device_name(idist.device()) if idist.device().type == "cuda"
        else "CPU",
        "pid": os.getpid(),
    }


# --------------------------------------------------------------------------- measurements

def _busy_worker(threads, iters, size, barrier, queue):
    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    for _ in range(3):  # warm-up
        a @ a
    barrier.wait()  # released together; the clock is system-wide, so times compare
    start = time.perf_counter()
    for _ in range(iters):
        a @ a
    queue.put((start, time.perf_counter()))


def oversubscription(process_counts=None, threads: int = 1, iters: int = 100, size: int = 256,
                     repeats: int = 3) -> list[dict]:
    """Start N processes that each do the same fixed work (``iters`` matrix products of
    ``size`` x ``size``, ``threads`` torch threads each) at the same moment, for each N in
    ``process_counts`` (default: 1, cores, 2 x cores, 4 x cores). Return, per N, the
    median over ``repeats`` of the time from the first start to the last finish, its
    ratio to N=1, and the total work done per second. The rounds are interleaved (every
    N once per round), so a load from outside that comes and goes weighs on every N
    alike rather than on the N measured while it lasted.

    With N <= cores each process has a core and the time stays flat; beyond, the
    processes share the cores and each takes about N / cores times longer, while the
    total throughput stays flat: more processes than cores buy nothing."""
    import multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if process_counts is None:
        process_counts = sorted({1, cores, 2 * cores, 4 * cores})
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    times = {n: [] for n in process_counts}
    for _ in range(repeats):
        for n in process_counts:
            barrier, queue = ctx.Barrier(n), ctx.Queue()
            procs = [ctx.Process(target=_busy_worker, args=(threads, iters, size, barrier, queue))
                     for _ in range(n)]
            for p in procs:
                p.start()
            spans = [queue.get(timeout=120) for _ in procs]
            for p in procs:
                p.join()
            # first start to last finish: a process the scheduler left waiting counts too
            times[n].append(max(end for _, end in spans) - min(start for start, _ in spans))
    rows = []
    for n in process_counts:
        seconds = statistics.median(times[n])
        rows.append({"processes": n, "cores": cores, "threads_per_process": threads, "size": size,
                     "seconds": seconds, "matmuls_per_second": n * iters / seconds})
    for r in rows:
        r["slowdown"] = r["seconds"] / rows[0]["seconds"]
    return rows


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # GPU copies are asynchronous: wait before reading the clock


def copy_bandwidth(device=None, sizes_mb=(1, 16, 64), repeats: int = 5, pin_memory: bool | None = None) -> list[dict]:
    """Median time and bandwidth of copying ``sizes_mb`` megabytes host -> device and back.

    On a CPU-only runtime ``device`` is the CPU and the copy is a plain memory copy by
    one thread (not a bound on GPU copies: pinned PCIe Gen4/Gen5 copies can be faster).
    On CUDA the host tensor is pinned by default
    (page-locked memory: the GPU can copy it directly)."""
    device = torch.device(device) if device is not None else idist.device()
    if pin_memory is None:
        pin_memory = device.type == "cuda"
    rows = []
    for mb in sizes_mb:
        n = int(mb * 2**20 // 4)
        host = torch.randn(n)
        if pin_memory:
            host = host.pin_memory()
        on_device = torch.empty(n, device=device)
        back = torch.empty(n).pin_memory() if pin_memory else torch.empty(n)
        timings = {"h2d": [], "d2h": []}
        for i in range(repeats + 1):  # the first round is a warm-up
            _sync(device)
            t0 = time.perf_counter()
            on_device.copy_(host, non_blocking=pin_memory)
            _sync(device)
            t1 = time.perf_counter()
            back.copy_(on_device, non_blocking=pin_memory)
            _sync(device)
            t2 = time.perf_counter()
            if i:
                timings["h2d"].append(t1 - t0)
                timings["d2h"].append(t2 - t1)
        assert torch.equal(back, host.cpu())  # the round trip is exact
        h2d, d2h = statistics.median(timings["h2d"]), statistics.median(timings["d2h"])
        rows.append({"megabytes": mb, "device": str(device), "pinned": bool(pin_memory),
                     "host_to_device_ms": 1e3 * h2d, "device_to_host_ms": 1e3 * d2h,
                     "host_to_device_GBps": mb / 1024 / h2d, "device_to_host_GBps": mb / 1024 / d2h})
    return rows


def rank_copy_bandwidth(local_rank: int, sizes_mb=(1, 16, 64), repeats: int = 5) -> dict:
    """:func:`copy_bandwidth` on this rank's device; on CUDA from pinned and from ordinary
    (pageable) host memory."""
    device = idist.device()
    pinned_options = (True, False) if device.type == "cuda" else (False,)
    rows = [row for pinned in pinned_options
            for row in copy_bandwidth(device, sizes_mb, repeats, pin_memory=pinned)]
    return {"rank": idist.get_rank(), "device": str(device), "rows": rows}
