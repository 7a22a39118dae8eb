"""Tokens per second and model FLOPs utilisation (MFU), as nanoGPT and the scaling
papers report them.

MFU = the FLOP/s the model's arithmetic needs at the measured speed / the machine's peak
FLOP/s. The model's FLOPs per token come from the model itself
(:meth:`distkit.builtin.models.GPT.flops_per_token`: ``6 N + 12 L T d``); the peak is either given
(``--peak-flops``) or measured once at the start of a run: every process multiplies two
large matrices at the same time, and their FLOP/s are summed. A measured peak is what
this machine reaches with these processes and threads, so MFU against it is higher than
against a datasheet's figure; say which one a number used (results.json does).

    clock = attach(trainer, model, config)   # every rank (measuring the peak is a collective)
    trainer.run(loader)
    report(clock)                            # tokens/s, FLOP/s and MFU of the run
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import ignite.distributed as idist
import torch
from ignite.engine import Events

WARMUP_STEPS = 1
"""Steps left out of the timing: the first pays for allocations and lazy set-up."""


def matmul_flops_per_second(n: int | None = None, seconds: float = 0.3, device=None,
                            dtype=torch.float32) -> float:
    """FLOP/s of ``n x n`` matrix products on ``device`` with this process's threads:
    ``2 n^3`` FLOPs a product, timed over at least ``seconds`` after one warm-up."""
    device = torch.device(device) if device is not None else idist.device()
    n = n or (4096 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        sync()  # kernels run asynchronously: time the work, not the launch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n ** 3 * count / elapsed


def measure_peak_flops(seconds: float = 0.3, dtype=torch.float32) -> float:
    """The run's peak: every process measures :func:`matmul_flops_per_second` at the same
    time (they share the machine's cores as training does), summed over the processes.
    A collective: call it on every rank."""
    idist.barrier()
    return float(idist.all_reduce(matmul_flops_per_second(seconds=seconds, dtype=dtype)))


def mfu(flops_per_token: float, tokens_per_second: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOP/s at this speed over the peak."""
    return flops_per_token * tokens_per_second / peak_flops


@dataclass
class StepClock:
    """Time spent in training steps (from ``ITERATION_STARTED`` to ``ITERATION_COMPLETED``:
    data loading, validation and checkpoints are left out) and the samples they took."""

    flops_per_token: float
    tokens_per_sample: int
    peak_flops: float
    peak_source: str
    seconds: float = 0.0
    samples: int = 0
    steps: int = 0
    _start: float = field(default=0.0, repr=False)
    _seen: int = field(default=0, repr=False)

    def started(self, engine):
        self._start = time.perf_counter()

    def completed(self, engine):
        elapsed = time.perf_counter() - self._start  # the step ended in loss.item(): synced
        self._seen += 1
        if self._seen > WARMUP_STEPS:
            self.seconds += elapsed
            self.samples += engine.state.output["batch_size"]
            self.steps += 1


def attach(trainer, model, config) -> StepClock | None:
    """A :class:`StepClock` on ``trainer`` if the model counts its FLOPs (has
    ``flops_per_token()`` and ``block_size``, as :class:`~distkit.builtin.models.GPT`), else
    ``None``. Measures the peak unless ``config.peak_flops`` gives it (a collective)."""
    raw = getattr(model, "module", model)  # DDP keeps the user's model in .module
    if not (hasattr(raw, "flops_per_token") and hasattr(raw, "block_size")):
        return None
    if getattr(config, "peak_flops", None):
        peak, source = float(config.peak_flops), "--peak-flops"
    else:
        dtype = torch.bfloat16 if config.amp and idist.device().type == "cuda" else torch.float32
        peak = measure_peak_flops(dtype=dtype)
        source = (f"measured: {str(dtype).replace('torch.', '')} matmul on "
                  f"{idist.get_world_size()} process(es) at once, summed")
    clock = StepClock(float(raw.flops_per_token()), int(raw.block_size), peak, source)
    trainer.add_event_handler(Events.ITERATION_STARTED, clock.started)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, clock.completed)
    return clock


def report(clock: StepClock | None) -> dict:
    """Tokens/s (all processes), model FLOP/s and MFU of the timed steps (rank 0's clock;
    every rank steps in lock-step under ddp and fsdp). Empty without a clock."""
    if clock is None:
        return {}
    world = idist.get_world_size()
    if clock.steps == 0 or clock.seconds <= 0:
        tokens_per_second = None
    else:
        tokens_per_second = clock.samples * world * clock.tokens_per_sample / clock.seconds
    model_flops = None if tokens_per_second is None else clock.flops_per_token * tokens_per_second
    return {
        "tokens_per_second": tokens_per_second,
        "mfu": None if model_flops is None else model_flops / clock.peak_flops,
        "throughput": {
            "flops_per_token": clock.flops_per_token,
            "tokens_per_sample": clock.tokens_per_sample,
            "model_flops_per_second": model_flops,
            "peak_flops": clock.peak_flops,
            "peak_flops_source": clock.peak_source,
            "timed_steps": clock.steps,
            "warmup_steps_left_out": WARMUP_STEPS,
            "step_time_s": clock.seconds / clock.steps if clock.steps else None,
        },
    }


def format_report(results: dict) -> str | None:
    """One line for the end-of-run summary, or None without a measurement."""
    if not results.get("tokens_per_second"):
        return None
    t = results["throughput"]
    return (f"{results['tokens_per_second']:.0f} tokens/s  "
            f"{t['model_flops_per_second'] / 1e9:.2f} GFLOP/s of model arithmetic  "
            f"MFU {100 * results['mfu']:.1f}% of {t['peak_flops'] / 1e9:.1f} GFLOP/s "
            f"({'given' if t['peak_flops_source'] == '--peak-flops' else 'measured'} peak)")
