"""The method every measurement shares: settings per mode, interleaved rounds, medians,
ratios, and the machine recorded beside the numbers."""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from distkit.host.facts import threads_per_process

# The kit may cost at most this fraction of the hand-written loop's samples/s; the hang
# records (on in every run the kit starts) at most this fraction of a step.
TARGETS = {"overhead": 0.03, "ddp": 0.03, "gpu": 0.05, "hangs": 0.02}


@dataclass(frozen=True)
class Settings:
    """How big and how often. ``steps`` optimizer steps make one timed run."""

    mode: str
    repeats: int             # rounds of each kit vs hand-written comparison
    warmup: int
    batch_size: int          # CNN global batch (overhead, ddp, scaling)
    steps: int               # steps per timed run (overhead, ddp)
    mlp_hidden: int          # width of the communication-heavy MLP
    scaling_steps: int
    max_world_size: int      # the process pool: min(cores, this), at least 2
    data_batch: int
    data_batches: int        # batches per timed loader run
    data_workers: tuple = (0, 1, 2)
    compute_steps: int = 3   # steps per timed compute run (data measurement)
    overhead_probe_steps: int = 200  # steps of the tiny model that measures per-step cost
    overhead_variants: bool = True   # also time the kit's variants on the real model
    gpu_batch: int = 256
    gpu_steps: int = 30
    study_repeats: int = 5   # rounds of the scaling and data measurements
    peer_rounds: int = 5     # rounds of whole commands (peers), after one warm-up round
    peer_epochs: int = 3
    peer_warmup: int = 1
    peer_names: tuple | None = None  # contenders of the peers measurement (None: all)
    peer_tiny_names: tuple | None = None  # contenders of its tiny steps (None: the kit's two
    #                                       launches, the hand-written loop, plain ignite)
    peer_default_batch: bool = True  # also the default batch (64), not only tiny steps
    hang_rounds: int = 10    # rounds of two launches, recorder off and on (hangs)
    hang_steps: int = 40     # steps per timed block (hangs)
    hang_blocks: int = 4     # blocks per side: with and without one more watcher (hangs)
    hang_polls: int = 2000   # polls of the watcher timed at a 1 ms poll (hangs)


MODES = {
    # For the tests: every code path, seconds of work.
    "tiny": Settings("tiny", repeats=2, warmup=1, batch_size=32, steps=3, mlp_hidden=256,
                     scaling_steps=2, max_world_size=2, data_batch=16, data_batches=2,
                     data_workers=(0, 1), compute_steps=1, gpu_batch=4, gpu_steps=1,
                     overhead_probe_steps=20, study_repeats=2, peer_rounds=1, peer_epochs=1,
                     peer_warmup=0, peer_names=("distkit", "hand-written (torchrun)"),
                     peer_tiny_names=("distkit", "distkit (torchrun)"),
                     hang_rounds=1, hang_steps=3, hang_blocks=1, hang_polls=50),
    # Under 2 minutes on 2 cores: fewer rounds (7 for the ratios, 2 for the studies), and
    # whole commands only at tiny steps (8 samples per process, where the kit's cost
    # shows most), the kit's command and the hand-written loop, one round of 2 epochs
    # (every peer at both batches, 5 rounds after a warm-up: the full mode). Measured on
    # the quiet 2-core VM: the earlier quick mode (9 and 3 rounds, both batches, 2 rounds
    # of 3 epochs, 10 whole commands) 248 s; with 3 contenders at tiny steps only, 129 s;
    # one quick run's ratios scatter by about 6% (0.948 and 1.006 for the same overhead
    # comparison in two runs back to back): the full mode gives the verdict.
    "quick": Settings("quick", repeats=7, warmup=1, batch_size=256, steps=8, mlp_hidden=1024,
                      scaling_steps=6, max_world_size=2, data_batch=128, data_batches=8,
                      compute_steps=2, overhead_variants=False, overhead_probe_steps=300,
                      study_repeats=2, peer_rounds=1, peer_warmup=0, peer_epochs=2,
                      peer_default_batch=False,
                      peer_tiny_names=("distkit", "hand-written (torchrun)"),
                      hang_rounds=3, hang_steps=20, hang_blocks=2, hang_polls=1000),
    "full": Settings("full", repeats=25, warmup=2, batch_size=256, steps=16, mlp_hidden=1024,
                     scaling_steps=16, max_world_size=8, data_batch=128, data_batches=24,
                     data_workers=(0, 1, 2, 4), compute_steps=4, gpu_steps=100,
                     overhead_probe_steps=1000, study_repeats=9),
}


# --------------------------------------------------------------------------------------
# Method: interleaved repeats, medians
# --------------------------------------------------------------------------------------

def interleaved(sides: dict, repeats: int, warmup: int = 1, cpu: dict | None = None) -> dict:
    """Run every side ``warmup`` times (discarded), then ``repeats`` rounds in rotated
    order: round r starts with side r mod n (A B, B A, A B, ... for two sides).

    A side is a callable returning ``(samples, seconds)``, timed by itself, or
    ``(samples, seconds, cpu_seconds)``. Returns ``{name: [samples/s of round 1, round
    2, ...]}``; samples per CPU-second go into ``cpu`` when it is given."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    rates = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples, seconds, *cpu_seconds = sides[name]()
            rates[name].append(samples / seconds)
            if cpu is not None and cpu_seconds:
                cpu.setdefault(name, []).append(samples / cpu_seconds[0])
    return rates


def summarize(rates: list, cpu_rates: list | None = None) -> dict:
    """Median and spread of one side's samples/s (and samples per CPU-second)."""
    out = {"samples_per_s": rates, "median": statistics.median(rates),
           "min": min(rates), "max": max(rates)}
    if cpu_rates:
        out.update(samples_per_cpu_s=cpu_rates, cpu_median=statistics.median(cpu_rates))
    return out


def compare(kit_rates: list, hand_rates: list, target: float, kit_cpu=None, hand_cpu=None) -> dict:
    """Kit vs hand-written samples/s (1.0 = free, 0.97 = the kit costs 3%): the median
    over rounds of each round's ratio. The two sides of a round ran back to back, so a
    slow spell of the machine that spans a round cancels out of its ratio; the ratio of
    the two sides' medians is kept as ``ratio_of_medians``.

    ``cpu_ratio`` is the same in samples per CPU-second: the kit's extra work is CPU
    work, and CPU time moves much less than wall time when other jobs share the cores."""
    ratio = statistics.median([k / h for k, h in zip(kit_rates, hand_rates)])
    out = {"ratio": ratio, "cost": 1.0 - ratio,
           "ratio_of_medians": statistics.median(kit_rates) / statistics.median(hand_rates),
           "target_cost": target, "within_target": ratio >= 1.0 - target}
    if kit_cpu and hand_cpu:
        out["cpu_ratio"] = statistics.median([k / h for k, h in zip(kit_cpu, hand_cpu)])
    return out

def timed(fn):
    """A side for :func:`interleaved`: runs ``fn`` (which returns samples) and times it,
    wall clock and this process's CPU time (all its threads)."""
    def side():
        cpu, start = time.process_time(), time.perf_counter()
        samples = fn()
        return samples, time.perf_counter() - start, time.process_time() - cpu
    return side


@contextlib.contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            memory = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": threads_per_process(1),
            "memory_gib": memory, "cuda": torch.cuda.is_available(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "load_average": load_average()}


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def paired_extra_us(cpu_rates: dict, batch: int, base: str = "hand-written") -> dict:
    """Each side's extra CPU microseconds per step over ``base``: the median over rounds
    of the round's difference (the two ran back to back, so a busy spell of the machine
    that spans a round mostly cancels out). ``cpu_rates``: samples per CPU-second per
    round, as :func:`interleaved` fills ``cpu``; ``batch``: samples per step."""
    us = {name: [1e6 * batch / r for r in rates] for name, rates in cpu_rates.items()}
    return {name: statistics.median(a - b for a, b in zip(us[name], us[base]))
            for name in us if name != base}
