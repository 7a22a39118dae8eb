"""Measuring props for notebook 11 (pipeline parallel): a layer that takes a known time,
a log of when each stage was busy, and a meter of the activations kept for backward.

The pipelining calls themselves (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``)
are typed in the notebook. Why a layer that *sleeps*: on a shared 2-core machine real
compute time depends on whoever else runs; a sleep takes the same time however busy the
cores are, so the timings measure the *schedule* (who waits for whom), not the CPU.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn

from distkit.observe.tracing import spans

BUSY: list[tuple[float, float]] = []
"""(start, end) of every forward and backward of a :class:`Timed` layer in this process."""


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        _busy(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _busy(ctx.backward_s)
        return grad, None, None


def _busy(seconds):
    start = time.perf_counter()
    time.sleep(seconds)
    BUSY.append((start, time.perf_counter()))


class Timed(nn.Module):
    """Identity whose forward takes ``forward_s_per_row`` × rows seconds and whose
    backward takes ``backward_s_per_row`` × rows: work proportional to the micro-batch."""

    def __init__(self, forward_s_per_row: float, backward_s_per_row: float):
        super().__init__()
        self.forward_s, self.backward_s = forward_s_per_row, backward_s_per_row

    def forward(self, x):
        rows = x.shape[0]
        return _Sleep.apply(x, self.forward_s * rows, self.backward_s * rows)


def busy_fraction(start: float, end: float) -> float:
    """Share of ``[start, end]`` this process spent inside :class:`Timed` layers."""
    busy = sum(min(e, end) - max(s, start) for s, e in BUSY if e > start and s < end)
    return busy / (end - start)


def bubble_model(stages: int, microbatches: int) -> float:
    """The idle share of a GPipe/1F1B step with equal stages and no communication cost:
    (p − 1) / (m + p − 1) (Huang et al. 2019, GPipe)."""
    return (stages - 1) / (microbatches + stages - 1)


class ActivationMeter:
    """``with ActivationMeter(model.parameters()) as meter:`` tracks the bytes of the
    tensors autograd saves for the backward (``torch.autograd.graph.saved_tensors_hooks``)
    while they are alive; ``meter.peak`` is the most held at once. Each storage counts
    once however often it is saved, and the parameters (saved by reference, not copied)
    not at all."""

    def __init__(self, parameters=()):
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self._skip = {_storage(p).data_ptr() for p in parameters}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def _pack(self, tensor):
        return _Held(self, tensor)

    @staticmethod
    def _unpack(held):
        return held.tensor

    def _add(self, storage):
        ptr = storage.data_ptr()
        if ptr in self._skip:
            return None
        ref = self._refs.setdefault(ptr, [0, storage.nbytes()])
        ref[0] += 1
        if ref[0] == 1:
            self.live += ref[1]
            self.peak = max(self.peak, self.live)
        return ptr

    def _remove(self, ptr):
        ref = self._refs[ptr]
        ref[0] -= 1
        if ref[0] == 0:
            del self._refs[ptr]
            self.live -= ref[1]


class _Held:
    """A saved tensor; counted while autograd keeps it (the graph frees it after backward)."""

    def __init__(self, meter, tensor):
        self.meter, self.tensor = meter, tensor
        self.ptr = meter._add(_storage(tensor))

    def __del__(self):
        if self.ptr is not None:
            self.meter._remove(self.ptr)


def _storage(tensor):
    """The storage behind a tensor; for a DTensor, behind this rank's local shard."""
    return getattr(tensor, "_local_tensor", tensor).untyped_storage()


# --- a 2-stage run read from its trace (notebook 15): what each stage ran, and its replay ---
# A piece of work is ("F" | "B", micro-batch); its span is (start_us, end_us) in the trace.

def stage_work(trace, rank):
    """``{(kind, micro-batch): (start, end)}`` of a stage's work, in the order it ran."""
    work = {("F", i): s for i, s in enumerate(spans(trace, rank, "_Sleep"))}
    work |= {("B", i): s for i, s in enumerate(spans(trace, rank, "_SleepBackward"))}
    return dict(sorted(work.items(), key=lambda item: item[1][0]))


def _needs(rank, kind, i):
    """The other stage's work this one waits for: its output (forward) or gradient (backward)."""
    return (0, "F", i) if (rank, kind) == (1, "F") else (1, "B", i) if (rank, kind) == (0, "B") else None


def replay(order, length, delay=0.0):
    """Each stage runs ``order[rank]`` in turn, each piece as soon as it can, plus ``delay``."""
    end, free, todo = {}, [None, None], [list(order[0]), list(order[1])]
    while todo[0] or todo[1]:
        ran = False
        for rank in (0, 1):
            if todo[rank] and _needs(rank, *todo[rank][0]) in (None, *end):
                kind, i = todo[rank].pop(0)
                ready = [t for t in (free[rank], end.get(_needs(rank, kind, i))) if t is not None]
                start = max(ready) + delay if ready else 0.0
                end[(rank, kind, i)] = free[rank] = start + length[(rank, kind, i)]
                ran = True
        if not ran:
            raise ValueError("the order waits on itself")
    return max(end.values())


def stage_delays(work):
    """How late each piece of work started after it could have, as the run went."""
    late = []
    for rank in (0, 1):
        previous = None
        for (kind, i), (start, _) in work[rank].items():
            need = _needs(rank, kind, i)
            ready = [t for t in (previous, work[need[0]][need[1:]][1] if need else None)
                     if t is not None]
            if ready:
                late.append(start - max(ready))
            previous = work[rank][(kind, i)][1]
    return late
