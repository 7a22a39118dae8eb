"""Where the time goes, on every rank: ignite's profilers and timers attached in one call,
their per-process results gathered into one cross-rank table (min / mean / max).

    profile = attach(trainer)          # before trainer.run, on every rank
    trainer.run(loader, max_epochs=2)
    summary = summarize(profile)       # on every rank (collectives); same dict everywhere
    print(format_summary(summary))
    write_csv(summary, "profile.csv")

What is attached:

- ``HandlersTimeProfiler``: time of each handler, of fetching each batch ("data") and
  of each training step ("compute").
- ``BasicTimeProfiler``: time of all handlers per event, and data / compute again.
- three ``Timer`` s: compute per iteration (resumed on ``ITERATION_STARTED``, paused on
  ``ITERATION_COMPLETED``), data wait per batch (``GET_BATCH_STARTED`` to
  ``GET_BATCH_COMPLETED``) and time per epoch. Their pause handlers run *first* on their
  event, so validation and checkpoints, which run on ``EPOCH_COMPLETED`` too, never leak
  into "epoch time". On CUDA the device is synchronized before a timer is read (kernels
  run asynchronously; without it a timer measures the launch, not the work).

``summarize`` checks that the Timers and the profilers agree (:data:`TOLERANCE`).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import BasicTimeProfiler, HandlersTimeProfiler, Timer

TOLERANCE = 0.05
"""Timer and profiler totals must agree within 5% ..."""
TOLERANCE_PER_ITER_S = 2e-4
"""... or within 0.2 ms per iteration (each reads the clock a few handler calls apart) ..."""
TOLERANCE_ABS_S = 0.025
"""... or within 25 ms in all, whichever is largest: on a busy machine the scheduler can
pause a process for a time slice (several ms) between one instrument's clock reading and
another's, and that lands in one total but not the other."""
DATA_BOUND_SHARE = 0.5
"""Data-bound: the processes wait for data longer than they compute."""

# The other profiler's own bookkeeping, which HandlersTimeProfiler would list as a handler.
_INTERNAL = ("BasicTimeProfiler.",)
# Handler names that do not say what they are. ignite's ProgressBar is the only user of
# a class named _OutputHandler; a handler attached to an event with an event filter is
# timed as ignite's wrapper around it (its own name is lost), and HandlersTimeProfiler
# keeps only its calls of at least 0.1 ms (EVENT_FILTER_THESHOLD_TIME), i.e. those the
# filter let through. distkit's trainer has one: the progress bar, redrawn at most every
# 0.1 s (training.at_most_every).
FILTERED = "handler with an event filter (Engine._handler_wrapper)"
DISPLAY_NAMES = {"_OutputHandler": "ProgressBar (_OutputHandler)",
                 "Engine._handler_wrapper.<locals>.wrapper": FILTERED}


@dataclass
class Profile:
    """What :func:`attach` attached; pass it to :func:`summarize` after the run."""
    handlers: HandlersTimeProfiler
    basic: BasicTimeProfiler
    timers: dict = field(default_factory=dict)
    engine: Engine | None = None


def needs_sync(device: torch.device | None = None) -> bool:
    """True where work runs asynchronously and a timer must wait for it (CUDA)."""
    device = device if device is not None else idist.device()
    return device.type == "cuda" and torch.cuda.is_available()


def synchronize(*_) -> None:
    """Wait for the CUDA device to finish its queued work, so that a timer read next
    measures the work itself and not just its launch. A no-op without CUDA."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def run_first(engine: Engine, event, handler) -> None:
    """Register ``handler`` on ``event`` so that it runs before the handlers already
    there (ignite runs handlers in registration order and has no public "prepend"; its
    own profilers insert into ``engine._event_handlers`` the same way)."""
    engine.add_event_handler(event, handler)
    handlers = engine._event_handlers[event]
    handlers.insert(0, handlers.pop())


def attach_timers(engine: Engine, sync: bool | None = None) -> dict:
    """Attach the three Timers described in the module docstring and return them as
    ``{"compute": ..., "data": ..., "epoch": ...}`` (each ``average=True``: ``value()``
    is the mean per step; ``total`` the sum)."""
    sync = needs_sync() if sync is None else sync
    timers = {}
    for name, resume, pause in (("compute", Events.ITERATION_STARTED, Events.ITERATION_COMPLETED),
                                ("data", Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED),
                                ("epoch", Events.EPOCH_STARTED, Events.EPOCH_COMPLETED)):
        timer = Timer(average=True)
        timer.attach(engine, start=Events.STARTED, resume=resume, pause=pause, step=pause)
        # A Timer runs from its start event on; pause it there, or the first step would
        # also count everything between STARTED and the first resume.
        engine.add_event_handler(Events.STARTED, timer.pause)
        engine.remove_event_handler(timer.pause, pause)
        run_first(engine, pause, timer.pause)  # before validation, checkpoints, logging
        if sync:
            run_first(engine, pause, synchronize)  # ... and the device is waited for first
        timers[name] = timer
    return timers


def attach(trainer: Engine, sync: bool | None = None) -> Profile:
    """Attach ``BasicTimeProfiler``, ``HandlersTimeProfiler`` and the Timers to
    ``trainer`` in one call (on every rank, before ``trainer.run``)."""
    basic = BasicTimeProfiler()
    basic.attach(trainer)
    # Attached second, so it starts first and wraps the handlers before BasicTimeProfiler
    # adds its own (otherwise it would time BasicTimeProfiler's bookkeeping as handlers).
    handlers = HandlersTimeProfiler()
    handlers.attach(trainer)
    return Profile(handlers=handlers, basic=basic, timers=attach_timers(trainer, sync), engine=trainer)


# --------------------------------------------------------------------------------------
# This rank's numbers, then all ranks' numbers in one table
# --------------------------------------------------------------------------------------

def _key(source, kind, event, name):
    return f"{source}|{kind}|{event}|{name}"


def local_rows(profile: Profile) -> dict:
    """This process's totals in seconds, ``{key: (total_s, calls)}``; a key is
    ``source|kind|event|name``."""
    rows = {}
    hp = profile.handlers
    rows[_key("HandlersTimeProfiler", "data", "GET_BATCH", "data (fetch a batch)")] = \
        (float(sum(hp.dataflow_times)), len(hp.dataflow_times))
    rows[_key("HandlersTimeProfiler", "compute", "ITERATION", "compute (training step)")] = \
        (float(sum(hp.processing_times)), len(hp.processing_times))
    for event, per_handler in hp.event_handlers_times.items():
        ename = getattr(event, "name", str(event))
        for name, times in per_handler.items():
            if times and not name.startswith(_INTERNAL):
                label = DISPLAY_NAMES.get(name, name)
                rows[_key("HandlersTimeProfiler", "handler", ename, label)] = (float(sum(times)), len(times))
    bp = profile.basic
    if hasattr(bp, "total_num_iters"):  # the engine has run
        done = int(profile.engine.state.iteration) if profile.engine is not None else bp.total_num_iters
        rows[_key("BasicTimeProfiler", "data", "GET_BATCH", "data (fetch a batch)")] = \
            (float(bp.dataflow_times.sum()), done)
        rows[_key("BasicTimeProfiler", "compute", "ITERATION", "compute (training step)")] = \
            (float(bp.processing_times.sum()), done)
        for event, times in bp.event_handlers_times.items():
            total = float(times.sum())
            if total > 0:
                rows[_key("BasicTimeProfiler", "event", event.name, f"all handlers on {event.name}")] = \
                    (total, int((times > 0).sum()))
    for name, timer in profile.timers.items():
        rows[_key("Timer", name, "", f"Timer: {name}")] = (float(timer.total), int(timer.step_count))
    return rows


def _stats(values):
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return {"min_s": None, "mean_s": None, "max_s": None, "ranks": 0}
    return {"min_s": min(present), "mean_s": sum(present) / len(present), "max_s": max(present),
            "ranks": len(present)}


def summarize(profile: Profile) -> dict:
    """Gather every rank's :func:`local_rows` (``idist.all_gather``; call on EVERY rank)
    into one table: per row the total seconds on each rank and min / mean / max over the
    ranks that ran it (the progress bar, for example, runs on rank 0 only). Also: data
    vs compute, the bottleneck, and the Timer-vs-profiler check. JSON-serialisable."""
    mine = local_rows(profile)
    names = idist.all_gather("\n".join(mine))
    names = names if isinstance(names, list) else [names]
    keys = sorted({k for joined in names for k in joined.split("\n") if k})
    world = idist.get_world_size()
    vec = torch.tensor([[mine[k][0] if k in mine else math.nan for k in keys],
                        [mine[k][1] if k in mine else -1 for k in keys]], dtype=torch.float64)
    gathered = idist.all_gather(vec.to(idist.device())).cpu().reshape(world, 2, len(keys))
    rows = []
    for j, k in enumerate(keys):
        source, kind, event, name = k.split("|", 3)
        per_rank = [None if math.isnan(v) else v for v in gathered[:, 0, j].tolist()]
        calls = [int(c) if c >= 0 else None for c in gathered[:, 1, j].tolist()]
        rows.append({"source": source, "kind": kind, "event": event, "name": name,
                     "per_rank_s": per_rank, "calls": calls, **_stats(per_rank)})
    summary = {"world_size": world, "rows": rows,
               "iterations": int(profile.engine.state.iteration) if profile.engine is not None else None,
               "epochs": int(profile.engine.state.epoch) if profile.engine is not None else None}
    summary.update(_diagnosis(summary))
    summary["timer_check"] = timer_check(summary)
    return summary


def row(summary: dict, name: str, source: str = "HandlersTimeProfiler") -> dict | None:
    """The row of ``summary`` named ``name`` (from ``source``), or None."""
    for r in summary["rows"]:
        if r["name"] == name and r["source"] == source:
            return r
    return None


def handler_rows(summary: dict) -> list[dict]:
    """HandlersTimeProfiler's per-handler rows, costliest (by mean) first."""
    rows = [r for r in summary["rows"] if r["source"] == "HandlersTimeProfiler" and r["kind"] == "handler"]
    return sorted(rows, key=lambda r: -(r["mean_s"] or 0))


def _diagnosis(summary: dict) -> dict:
    data = row(summary, "data (fetch a batch)")
    compute = row(summary, "compute (training step)")
    d, c = (data or {}).get("mean_s") or 0.0, (compute or {}).get("mean_s") or 0.0
    share = d / (d + c) if d + c > 0 else 0.0
    return {"data_s": data and {k: data[k] for k in ("min_s", "mean_s", "max_s")},
            "compute_s": compute and {k: compute[k] for k in ("min_s", "mean_s", "max_s")},
            "data_share": share,
            "bottleneck": "data" if share >= DATA_BOUND_SHARE else "compute"}


def tolerance_s(total_s: float, iterations: int) -> float:
    """The largest difference allowed between two instruments' totals (seconds)."""
    return max(TOLERANCE * total_s, TOLERANCE_PER_ITER_S * iterations, TOLERANCE_ABS_S)


def timer_check(summary: dict) -> dict:
    """Do the Timers, ``BasicTimeProfiler`` and ``HandlersTimeProfiler`` agree on data and
    compute time, rank by rank? Tolerance: :data:`TOLERANCE` relative, or
    :data:`TOLERANCE_PER_ITER_S` per iteration, or :data:`TOLERANCE_ABS_S`, whichever is
    largest."""
    out = {"tolerance": TOLERANCE, "tolerance_per_iteration_s": TOLERANCE_PER_ITER_S,
           "tolerance_abs_s": TOLERANCE_ABS_S}
    agree = True
    for kind, name in (("compute", "compute (training step)"), ("data", "data (fetch a batch)")):
        ref = row(summary, name)
        others = {"timer": row(summary, f"Timer: {kind}", source="Timer"),
                  "basic_profiler": row(summary, name, source="BasicTimeProfiler")}
        if ref is None:
            continue
        entry = {"handlers_profiler_s": ref["mean_s"]}
        worst, ok = 0.0, True
        for label, other in others.items():
            if other is None:
                continue
            entry[f"{label}_s"] = other["mean_s"]
            for a, b, calls in zip(other["per_rank_s"], ref["per_rank_s"], ref["calls"]):
                if a is None or b is None:
                    continue
                diff = abs(a - b)
                ok = ok and diff <= tolerance_s(max(a, b), calls or 0)
                worst = max(worst, diff / max(a, b, 1e-12))
        entry.update(worst_rel_diff=worst, agree=ok)
        out[kind] = entry
        agree = agree and ok
    out["agree"] = agree
    return out


# --------------------------------------------------------------------------------------
# Output: text, CSV
# --------------------------------------------------------------------------------------

def _clip(text: str, width: int) -> str:
    """Keep the end of a long name: ``a.<locals>.validate`` is told apart by its tail."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _fmt(v):
    if v is None:
        return "-"
    return f"{v:.4f}"


def diagnose(summary: dict) -> str:
    """One line: data-bound or compute-bound, with the numbers behind it."""
    d, c = summary["data_s"] or {}, summary["compute_s"] or {}
    verdict = "DATA-BOUND" if summary["bottleneck"] == "data" else "compute-bound"
    return (f"{verdict}: per rank {d.get('mean_s', 0):.3f} s waiting for data vs "
            f"{c.get('mean_s', 0):.3f} s computing (data share {summary['data_share']:.0%}; "
            f"data-bound from {DATA_BOUND_SHARE:.0%})")


def format_summary(summary: dict, top: int = 8) -> str:
    """The cross-rank table as text: data, compute, the costliest handlers, the verdict
    and the Timer check."""
    w = summary["world_size"]
    iters = summary.get("iterations") or 0
    head = f"{'what':46s} {'event':20s} {'min s':>9s} {'mean s':>9s} {'max s':>9s} {'ranks':>5s}"
    lines = [f"profile over {w} rank(s), {iters} iterations (seconds in total per rank; "
             "min / mean / max over ranks)", head, "-" * len(head)]
    shown = [r for r in (row(summary, "data (fetch a batch)"), row(summary, "compute (training step)")) if r]
    shown += handler_rows(summary)[:top]
    for r in shown:
        lines.append(f"{_clip(r['name'], 46):46s} {r['event'][:20]:20s} {_fmt(r['min_s']):>9s} "
                     f"{_fmt(r['mean_s']):>9s} {_fmt(r['max_s']):>9s} {r['ranks']:>5d}")
    lines.append(diagnose(summary))
    tc = summary.get("timer_check") or {}
    if "compute" in tc:
        c, d = tc["compute"], tc["data"]
        lines.append(f"Timer / BasicTimeProfiler / HandlersTimeProfiler: compute {c.get('timer_s', 0):.3f} / "
                     f"{c.get('basic_profiler_s', 0):.3f} / {c['handlers_profiler_s']:.3f} s, data "
                     f"{d.get('timer_s', 0):.3f} / {d.get('basic_profiler_s', 0):.3f} / "
                     f"{d['handlers_profiler_s']:.3f} s: {'agree' if tc['agree'] else 'DISAGREE'} (within "
                     f"{tc['tolerance']:.0%}, {tc['tolerance_per_iteration_s'] * 1e3:.1f} ms/iteration or "
                     f"{tc['tolerance_abs_s'] * 1e3:.0f} ms)")
    return "\n".join(lines)


def write_csv(summary: dict, path: str) -> str:
    """The cross-rank table as CSV: one row per measured thing, total seconds on each
    rank, min / mean / max over ranks, calls on each rank. Returns ``path``."""
    w = summary["world_size"]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["source", "kind", "event", "name", "min_s", "mean_s", "max_s", "ranks",
                      *[f"rank{r}_s" for r in range(w)], *[f"rank{r}_calls" for r in range(w)]])
        for r in summary["rows"]:
            out.writerow([r["source"], r["kind"], r["event"], r["name"], r["min_s"], r["mean_s"],
                          r["max_s"], r["ranks"], *["" if v is None else v for v in r["per_rank_s"]],
                          *["" if c is None else c for c in r["calls"]]])
    return path
