"""Profiler traces of every rank, merged into one timeline: who did what, when.

ignite's profilers (:mod:`distkit.observe.profiling`) give each event's mean time. A trace gives
*when*: the gradient all-reduce running while the backward still computes, a rank that
makes the others wait. This module runs ``torch.profiler`` on every rank for a few steps
after a warm-up, marks the kit's phases with ``record_function`` ranges, and merges the
ranks' Chrome traces into one file in which every rank is its own process row, the clocks
aligned at a barrier::

    tracer = attach(trainer, evaluator, run_dir)    # every rank, before trainer.run
    trainer.run(loader, max_epochs=1)
    paths = tracer.finish()                         # every rank (a collective); paths on rank 0

``distkit train --trace`` does exactly that; the files land in ``<run_dir>/trace/``:
``rank<N>.json`` (one per rank), ``merged.json`` (open it in https://ui.perfetto.dev) and
``timeline.png`` (:func:`timeline`).

How the clocks are aligned (as NTP does): rank 0 and each other rank play ping-pong
:data:`SYNC_ROUNDS` times, each side marking the moments in its own trace with tiny
ranges named :data:`CLOCK_SYNC`: rank 0 sends at A, rank r receives at B and answers,
rank 0 receives at C. Rank r's clock minus rank 0's is ``B - (A + C) / 2``, true within
half the round trip ``(C - A) / 2``; the round with the shortest trip is kept, and its
half trip is written beside the offset as the alignment's error bound. On one host the
ranks share one clock, so the offsets found there are themselves the method's error.

The analysis helpers (:func:`spans`, :func:`union`, :func:`overlap`,
:func:`collective_spans`) read a merged trace; notebook 15 uses them to measure the
overlap of communication and compute.
"""
from __future__ import annotations

import json
import os

import ignite.distributed as idist
import torch

from distkit.host.files import write_json
from ignite.engine import Events

WAIT, WARMUP, ACTIVE = 2, 1, 3
"""The profiler's schedule: skip 2 steps, warm up 1 (recorded, then thrown away), record 3."""
SYNC_ROUNDS = 5
CLOCK_SYNC = "distkit: clock sync"
PHASES = ("data wait", "forward", "backward", "optimizer step", "validation")
"""The kit's phases, as ``record_function`` ranges in the trace (forward, backward and
optimizer step in the kit's own training step; a task's own step shows as one step)."""
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "ncclKernel", "ncclDevKernel")
"""How a collective is named in a torch.profiler trace: ``gloo:all_reduce`` (a range on
gloo's worker thread, from the moment it runs to the moment every peer has answered),
``nccl:all_reduce`` and the NCCL kernels on a GPU."""


def ranged(name: str, fn):
    """``fn`` inside a ``record_function(name)`` range (what the kit's step uses when
    tracing; without ``--trace`` the step calls ``fn`` itself, at no cost)."""
    from torch.profiler import record_function

    def traced(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return traced


class _Range:
    """A ``record_function`` range opened by one engine event and closed by another."""

    def __init__(self, name: str):
        self.name, self.open = name, None

    def start(self, *_):
        from torch.profiler import record_function

        self.stop()  # a fetch that ended the data (StopIteration) never completed
        self.open = record_function(self.name)
        self.open.__enter__()

    def stop(self, *_):
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None


def schedule_for(total_steps: int | None) -> tuple:
    """``(wait, warmup, active)`` that fits a run of ``total_steps`` steps (None: unknown):
    a short run skips fewer steps before recording, and records what it has."""
    if total_steps is None or total_steps >= WAIT + WARMUP + ACTIVE:
        return WAIT, WARMUP, ACTIVE
    active = max(1, min(ACTIVE, total_steps - WARMUP))
    warmup = min(WARMUP, max(0, total_steps - active))
    return 0, warmup, active


def new_profiler(wait: int, warmup: int, active: int, on_trace_ready):
    """torch.profiler over CPU (and CUDA where present) activity, recording ``active``
    steps after ``wait`` skipped and ``warmup`` warming ones, once."""
    from torch.profiler import ProfilerActivity, profile, schedule

    # no kineto lines on stderr: ERROR ones on a CPU-only build, and (torch 2.15) a USDT
    # line at every profiler start and stop, the level above ERROR; 6 is above both
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities, on_trace_ready=on_trace_ready,
                   schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1))


class Tracer:
    """torch.profiler on one rank of a run; made by :func:`attach`."""

    def __init__(self, run_dir: str, total_steps: int | None = None):
        self.run_dir = run_dir
        self.wait, self.warmup, self.active = schedule_for(total_steps)
        self.profiler = None
        self.trace = None  # this rank's Chrome trace (a dict), once recorded
        self.steps = 0
        self.synced = False

    # --- the profiler's life, on the trainer's events ---------------------------------
    def start(self, *_):
        self.profiler = new_profiler(self.wait, self.warmup, self.active, self._keep)
        self.profiler.__enter__()

    def batch_started(self, engine):
        if self.profiler is not None and not self.synced and self.steps == self.wait + self.warmup:
            clock_sync()  # the first recorded step, before its data wait
            self.synced = True

    def step_completed(self, *_):
        if self.profiler is not None:
            self.steps += 1
            self.profiler.step()

    def stop(self, *_):
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.__exit__(None, None, None)

    def _keep(self, profiler):
        import tempfile

        # export_chrome_trace is the only writer of the Chrome format: through a temporary file
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            profiler.export_chrome_trace(path)
            with open(path) as f:
                self.trace = json.load(f)

    # --- after the run ------------------------------------------------------------------
    def finish(self) -> dict | None:
        """Gather every rank's trace on rank 0 (a collective: call on every rank), which
        writes ``trace/rank<N>.json``, ``trace/merged.json`` and ``trace/timeline.png``
        and returns ``{"merged", "per_rank", "png", "clock"}``; None on the other ranks."""
        self.stop()
        traces = gather_to_rank0(self.trace)
        if idist.get_rank() != 0:
            return None
        return write(traces, os.path.join(self.run_dir, "trace"))


def clock_sync():
    """Ping-pong between rank 0 and every other rank, each side marking its moments in
    its own trace (call on every rank, inside a recorded step): what :func:`merge` aligns
    the ranks' clocks by. Plain ``torch.distributed`` on the default group, so it serves
    a group the kit made (``idist``) and one a script made itself (``distkit launch
    --trace``) alike; on nccl the ball is a CUDA tensor, waited for before each mark."""
    import torch.distributed as dist
    from torch.profiler import record_function

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = dist.get_backend() == "nccl"
    ball = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")

    def arrived():
        if on_gpu:
            torch.cuda.synchronize()  # nccl's recv returns before the bytes are there

    whole = record_function(CLOCK_SYNC)  # the whole exchange, left out of the drawing
    whole.__enter__()
    for peer in range(1, world):
        if rank not in (0, peer):
            continue
        for _ in range(SYNC_ROUNDS):
            if rank == 0:
                with record_function(f"{CLOCK_SYNC} {peer}"):  # A
                    pass
                dist.send(ball, dst=peer)
                dist.recv(ball, src=peer)
                arrived()
                with record_function(f"{CLOCK_SYNC} {peer}"):  # C
                    pass
            else:
                dist.recv(ball, src=0)
                arrived()
                with record_function(f"{CLOCK_SYNC} {peer}"):  # B
                    pass
                dist.send(ball, dst=0)
    dist.barrier()
    whole.__exit__(None, None, None)


def attach(trainer, evaluator, run_dir: str, total_steps: int | None = None) -> Tracer:
    """Profile ``trainer`` on this rank: the profiler starts with the run, records
    ``ACTIVE`` steps after ``WAIT + WARMUP`` (fewer on a short run of ``total_steps``),
    and marks data wait and validation as ranges. Call :meth:`Tracer.finish` after the run."""
    tracer = Tracer(run_dir, total_steps)
    trainer.add_event_handler(Events.STARTED, tracer.start)
    trainer.add_event_handler(Events.GET_BATCH_STARTED, tracer.batch_started)
    data_wait = _Range("data wait")
    trainer.add_event_handler(Events.GET_BATCH_STARTED, data_wait.start)
    trainer.add_event_handler(Events.GET_BATCH_COMPLETED, data_wait.stop)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, tracer.step_completed)
    trainer.add_event_handler(Events.COMPLETED, tracer.stop)
    if evaluator is not None:
        validation = _Range("validation")
        evaluator.add_event_handler(Events.STARTED, validation.start)
        evaluator.add_event_handler(Events.COMPLETED, validation.stop)
    return tracer


def gather_to_rank0(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 (a list, index = rank), None elsewhere; one process
    without a process group: ``[obj]``."""
    import torch.distributed as dist

    if idist.get_world_size() == 1 or not dist.is_available() or not dist.is_initialized():
        return [obj]
    out = [None] * idist.get_world_size() if idist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


# --- merging ------------------------------------------------------------------------------

def _absolute_us(trace: dict, event: dict) -> float:
    # kineto writes ts in microseconds since baseTimeNanoseconds (a per-process base)
    return float(event["ts"]) + trace.get("baseTimeNanoseconds", 0) / 1000.0


def sync_marks(trace: dict, peer: int) -> list:
    """The absolute times (us) of a rank's clock-sync marks with ``peer``, in order."""
    return sorted(_absolute_us(trace, e) for e in trace.get("traceEvents", [])
                  if e.get("name") == f"{CLOCK_SYNC} {peer}" and "ts" in e)


def clock_offsets(traces: list) -> dict:
    """``{"offset_us": [...], "error_us": [...]}``: each rank's clock minus rank 0's, from
    the ping-pong round with the shortest trip, and half that trip, the bound on the
    offset's error. A rank without marks (none recorded) gets offset 0 and error None."""
    offsets, errors = [0.0], [0.0]
    for peer in range(1, len(traces)):
        at_0, at_peer = sync_marks(traces[0], peer), sync_marks(traces[peer], peer)
        rounds = [(at_0[2 * i], at_peer[i], at_0[2 * i + 1])
                  for i in range(min(len(at_0) // 2, len(at_peer)))]
        if not rounds:
            offsets.append(0.0)
            errors.append(None)
            continue
        a, b, c = min(rounds, key=lambda r: r[2] - r[0])
        offsets.append(b - (a + c) / 2)
        errors.append((c - a) / 2)
    return {"offset_us": offsets, "error_us": errors}


def merge(traces: list) -> dict:
    """One Chrome trace from every rank's (index = rank): rank r's events under process
    ``pid = r`` named "rank r", shifted by the rank's clock offset; time 0 is the first
    recorded event. The offsets and their error bounds are under ``"distkit"``."""
    clock = clock_offsets(traces)
    shifted = []
    for rank, trace in enumerate(traces):
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_labels",
                                                         "process_sort_index"):
                continue  # replaced by the rank's own below
            e = dict(e)
            if "ts" in e:
                e["ts"] = _absolute_us(trace, e) - clock["offset_us"][rank]
            e["pid"] = rank
            shifted.append(e)
    start = min((e["ts"] for e in shifted if "ts" in e and e.get("ph") == "X"), default=0.0)
    for e in shifted:
        if "ts" in e:
            e["ts"] = round(e["ts"] - start, 3)
    names = []
    for rank in range(len(traces)):
        names.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                      "args": {"name": f"rank {rank}"}})
        names.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                      "args": {"sort_index": rank}})
    return {"traceEvents": names + shifted, "displayTimeUnit": "ms",
            "distkit": {"world_size": len(traces), "clock": clock}}


def write(traces: list, folder: str) -> dict:
    """Write every rank's trace, the merged trace and its drawing into ``folder``; return
    their paths and the clock alignment."""
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    per_rank = []
    for rank, trace in enumerate(traces):
        path = os.path.join(folder, f"rank{rank}.json")
        write_json(path, trace or {"traceEvents": []})
        per_rank.append(path)
    merged = merge([t or {"traceEvents": []} for t in traces])
    merged_path = os.path.join(folder, "merged.json")
    write_json(merged_path, merged)
    fig = timeline(merged)
    png = os.path.join(folder, "timeline.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return {"merged": merged_path, "per_rank": per_rank, "png": png,
            "clock": merged["distkit"]["clock"],
            "bytes": sum(os.path.getsize(p) for p in per_rank + [merged_path, png])}


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# --- reading a merged trace -----------------------------------------------------------------

def spans(trace: dict, rank: int, match) -> list:
    """``[(start_us, end_us)]`` of rank ``rank``'s complete events whose name ``match``
    accepts (a name, a tuple of names, or a function of the name), sorted by start."""
    if isinstance(match, str):
        match = (match,)
    accept = match if callable(match) else (lambda name, names=tuple(match): name in names)
    return sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                  for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("pid") == rank and accept(e.get("name", "")))


def is_collective(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES)


def collective_spans(trace: dict, rank: int, kind: str | None = None) -> list:
    """Rank ``rank``'s collectives (``kind``: e.g. ``"all_reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``; None: all), sorted by start."""
    return spans(trace, rank, lambda n: is_collective(n) and (kind is None or kind in n))


def union(intervals) -> list:
    """Overlapping intervals merged: the time covered, as disjoint sorted intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [tuple(x) for x in out]


def total(intervals) -> float:
    return sum(b - a for a, b in union(intervals))


def overlap(a, b) -> float:
    """Time covered by both sets of intervals."""
    a, b = union(a), union(b)
    i = j = 0
    both = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        both += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both


def steps(trace: dict, rank: int) -> list:
    """The recorded steps of rank ``rank`` (the profiler's ``ProfilerStep#N`` ranges)."""
    return spans(trace, rank, lambda n: n.startswith("ProfilerStep#"))


# --- drawing ----------------------------------------------------------------------------

TRACE_PHASE_COLOURS = {"data wait": "#bbbbbb", "forward": "#4c72b0", "backward": "#dd8452",
                       "optimizer step": "#55a868", "validation": "#8172b3"}
TRACE_COLLECTIVE_COLOURS = {"all_reduce": "#c44e52", "all_gather": "#937860",
                            "reduce_scatter": "#da8bc3", "broadcast": "#8c8c8c",
                            "barrier": "#222222", "send": "#ccb974", "recv": "#64b5cd"}


def timeline(trace, phases=None, window_ms=None, title=None):
    """A merged trace (:func:`merge`) drawn as one row per rank: the phases
    (``record_function`` ranges named in ``phases``, default the kit's) on top, the
    collectives where they ran below, the recorded steps' boundaries dotted. ``window_ms``:
    ``(start, end)`` to show (default: the recorded steps)."""
    from matplotlib.patches import Patch

    import matplotlib.pyplot as plt
    phases = phases or TRACE_PHASE_COLOURS
    colours = {name: TRACE_PHASE_COLOURS.get(name, plt.cm.tab10(i % 10))
               for i, name in enumerate(phases)}
    ranks = sorted({e["pid"] for e in trace["traceEvents"] if isinstance(e.get("pid"), int)})
    fig, ax = plt.subplots(figsize=(13, 1.0 + 1.1 * len(ranks)))
    used, all_steps = set(), []
    for row, rank in enumerate(ranks):
        y = (len(ranks) - 1 - row) * 2.4  # rank 0 on top
        for name, colour in colours.items():
            found = [(a / 1e3, (b - a) / 1e3) for a, b in spans(trace, rank, name)]
            if found:
                ax.broken_barh(found, (y + 1.0, 0.9), facecolors=colour)
                used.add(("phase", name))
        for e in trace["traceEvents"]:
            if e.get("ph") != "X" or e.get("pid") != rank or not is_collective(e.get("name", "")):
                continue
            kind = next((k for k in TRACE_COLLECTIVE_COLOURS if k.replace("_", "") in
                         e["name"].replace("_", "").lower()), "other")
            colour = TRACE_COLLECTIVE_COLOURS.get(kind, "#999999")
            # an edge line keeps a collective of a few microseconds visible at any width
            ax.broken_barh([(e["ts"] / 1e3, e.get("dur", 0.0) / 1e3)], (y + 0.05, 0.8),
                           facecolors=colour, edgecolors=colour, linewidth=0.8, alpha=0.75)
            used.add(("collective", kind))
        rank_steps = steps(trace, rank)
        all_steps += rank_steps
        for a, b in rank_steps:
            ax.vlines([a / 1e3], y, y + 2.0, colors="black", linestyles="dotted", linewidth=0.8)
    ax.set_yticks([(len(ranks) - 1 - row) * 2.4 + off for row in range(len(ranks)) for off in (1.45, 0.45)],
                  [f"rank {r} {lane}" for r in ranks for lane in ("phases", "collectives")])
    if window_ms is None and all_steps:
        # from the end of the clock sync (see clock_sync) to the last recorded step's end
        synced = [max(b for _, b in found) for found in
                  (spans(trace, r, CLOCK_SYNC) for r in ranks) if found]
        start = min(synced) if synced else min(a for a, _ in all_steps)
        window_ms = (start / 1e3, max(b for _, b in all_steps) / 1e3)
    if window_ms is not None:
        pad = 0.01 * (window_ms[1] - window_ms[0])
        ax.set_xlim(window_ms[0] - pad, window_ms[1] + pad)
    ax.set_xlabel("time (ms), the ranks' clocks aligned; dotted: a step starts")
    ax.set_title(title or f"{len(ranks)} ranks, {len(all_steps) // max(len(ranks), 1)} recorded step(s)")
    handles = [Patch(color=colours[n], label=n) for kind, n in sorted(used) if kind == "phase"]
    handles += [Patch(color=TRACE_COLLECTIVE_COLOURS.get(n, "#999999"), label=f"collective: {n}")
                for kind, n in sorted(used) if kind == "collective"]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
