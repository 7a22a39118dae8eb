"""1. Overhead, one process: the kit's trainer vs the hand-written loop, and the kit's
fixed cost per step measured on a model so small that a step is almost all overhead."""
from __future__ import annotations

import statistics

import ignite.distributed as idist
from torch.utils.data import DataLoader

from distkit.bench.method import (TARGETS, Settings, compare, interleaved, paired_extra_us, summarize,
                                  timed, torch_threads)
from distkit.bench.sides import KitRun, bench_config, handwritten_epochs, handwritten_setup, linear_decay
from distkit.builtin.data import get_dataflow
from distkit.host.facts import threads_per_process
from distkit.train.training import initialize

def _overhead_sides(config, runs, variants=True):
    """The sides of the overhead measurement, on the kit's own loader's tensors."""
    train_loader, _ = get_dataflow(config)  # the kit's loader: the same tensors for all

    def kit(**kwargs):
        model, optimizer, criterion = initialize(config)
        return KitRun(model, optimizer, criterion, train_loader, config, **kwargs)

    hand_model, hand_opt, hand_loss = handwritten_setup(config, idist.device())
    hand_loader = DataLoader(train_loader.dataset, batch_size=config.batch_size, shuffle=True)
    hand_sched = linear_decay(hand_opt, runs * len(hand_loader))
    sides = {
        "hand-written": timed(lambda: handwritten_epochs(hand_model, hand_opt, hand_loss, hand_loader,
                                                          scheduler=hand_sched)),
        "kit": timed(kit()),
    }
    if variants:
        sides["kit: create_trainer only"] = timed(kit(handlers=False))
        sides["kit + progress bar"] = timed(kit(progress_bar=True))
    return len(train_loader), sides


def measure_overhead(settings: Settings, threads: int | None = None) -> dict:
    """The kit's trainer vs the hand-written loop, 1 process, all cores' threads (the
    kit's rule for one process), the same data tensors. Variants of the kit isolate what
    each layer costs: ``create_trainer`` alone; as ``training()`` builds it (the
    headline); and with the progress bar that ``distkit train`` shows by default.
    ``threads`` overrides the thread count (both sides alike).

    ``per_step_us`` measures the same sides on a model so small (the kit's MLP, batch 8)
    that the step is almost all overhead: the kit's fixed cost per step in
    microseconds of CPU, which divided by a real step's time predicts the ratio."""
    runs = settings.warmup + settings.repeats
    config = bench_config(settings, runs=runs)
    threads = threads or threads_per_process(1)
    with torch_threads(threads):
        steps, sides = _overhead_sides(config, runs, settings.overhead_variants)
        cpu = {}
        rates = interleaved(sides, settings.repeats, settings.warmup, cpu)
    # The kit's own cost is Python on one thread; a tiny step run on several OpenMP
    # threads only adds their synchronisation's scatter (1.2-1.8 ms a step on 2 threads
    # here vs ~0.5 ms on one), which hid a 50 us difference. Hence one thread, and runs
    # long enough that engine.run()'s per-run set-up is spread thin.
    with torch_threads(1):
        small = bench_config(settings, model="mlp", batch_size=8, runs=runs,
                             steps=settings.overhead_probe_steps)
        _, small_sides = _overhead_sides(small, runs)
        small_cpu = {}
        interleaved(small_sides, settings.repeats, settings.warmup, small_cpu)
    hand, hand_cpu = rates["hand-written"], cpu["hand-written"]
    us = {name: 1e6 * small.batch_size / statistics.median(r) for name, r in small_cpu.items()}
    return {
        "model": config.model, "dataset": "synthetic 1x8x8", "batch_size": config.batch_size,
        "steps_per_run": steps, "threads": threads, "processes": 1, "device": str(idist.device()),
        "sides": {name: summarize(r, cpu[name]) for name, r in rates.items()},
        **compare(rates["kit"], hand, TARGETS["overhead"], cpu["kit"], hand_cpu),
        "variants": {name: compare(r, hand, TARGETS["overhead"], cpu[name], hand_cpu)
                     for name, r in rates.items() if name != "hand-written"},
        "per_step_us": {
            "model": "mlp, batch 8", "steps_per_run": settings.overhead_probe_steps, "threads": 1,
            "cpu_us_per_step": us,
            "cpu_us_per_step_rounds": {name: [1e6 * small.batch_size / r for r in rates]
                                       for name, rates in small_cpu.items()},
            # median over rounds of (kit - hand-written) in the same round
            "kit_extra_cpu_us_per_step": paired_extra_us(small_cpu, small.batch_size),
            "hand_written_step_ms_of_the_real_model": 1000 * config.batch_size / statistics.median(hand),
        },
    }
