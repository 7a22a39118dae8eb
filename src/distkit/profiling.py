"""Timers and profilers attached in one call; per-rank results gathered into one table."""
from __future__ import annotations

from ignite.handlers import HandlersTimeProfiler


def attach(trainer):
    """Attach a ``HandlersTimeProfiler`` to ``trainer`` and return it."""
    profiler = HandlersTimeProfiler()
    profiler.attach(trainer)
    return profiler


def summarize(profiler) -> dict:
    """This rank's profile as a plain dict (placeholder until the cross-rank table lands)."""
    return {"handlers": profiler.get_results()}
