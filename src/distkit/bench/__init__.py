"""Benchmarks: what the kit's abstractions cost, what scaling buys, and where the limit is.

``distkit bench --quick`` (under 2 minutes on 2 cores) or ``distkit bench`` (the full
mode) measures, in one run, one module each:

1. **overhead** (:mod:`.overhead`) -- the kit's trainer vs a minimal hand-written
   PyTorch loop, 1 process, and the kit's fixed cost per step;
2. **ddp** (:mod:`.processes`) -- the kit vs a hand-written ``torch.distributed`` DDP
   loop, in the same gloo processes;
3. **scaling** (:mod:`.processes`) -- world sizes 1 and N for a communication-heavy MLP
   and the compute-heavy CNN, strong and weak, with the bytes all-reduced per step and
   the scaling study's split of a step into compute and all-reduce; and the
   oversubscribed case (threads not pinned);
4. **data** (:mod:`.data`) -- loader throughput vs ``num_workers`` (and ``pin_memory``
   with CUDA) against the models' compute throughput: when is training data-bound?
5. **gpu** (:mod:`.gpu`) -- CIFAR-shaped ResNet-18, bf16 autocast and channels_last, kit
   vs hand-written loop (only with a CUDA device; otherwise reported as skipped).
6. **peers** (:mod:`.peers`) -- whole commands side by side: ``distkit train``, a
   hand-written torchrun DDP script, plain ignite, and (when installed) HF accelerate and
   Lightning Fabric on the same task: time to first step, command wall time, throughput,
   peak memory per process; and tiny steps under the kit's own launch vs torchrun.
7. **hangs** (:mod:`.hangs`) -- what the hang records on in every run the kit starts
   (torch's Flight Recorder, the kit's watcher thread) cost, as a fraction of a step.

Method, for every measurement: all sides run in the same run, on the same data, with the
same number of threads. Each side runs ``warmup`` times first (discarded); then come
``repeats`` rounds in which the sides take turns in a rotated order (A B, B A, ...), so
drift on a busy machine hits every side alike. A side's result is its median over the
rounds; a ratio is the median of the rounds' ratios (:mod:`.method`).

The core (``distkit.train.training`` and friends) never imports this package.

From Python::

    from distkit.bench import run_benchmarks
    results = run_benchmarks("quick", output_dir="benchmarks/results")
"""
from __future__ import annotations

import importlib

MEASUREMENTS = ("overhead", "ddp", "scaling", "data", "gpu", "peers", "hangs")

# What ``from distkit.bench import X`` finds, and where; imported on first use, so that
# ``distkit bench --help`` (and every other sub-command) does not import torch for it.
_EXPORTS = {
    "run_benchmarks": "run", "write_outputs": "run",
    "table": "report", "targets_missed": "report",
    "MODES": "method", "TARGETS": "method", "Settings": "method", "interleaved": "method",
    "summarize": "method", "compare": "method", "machine": "method",
    "KitRun": "sides", "handwritten_epochs": "sides", "handwritten_setup": "sides",
    "linear_decay": "sides",
    "measure_overhead": "overhead", "measure_processes": "processes", "measure_data": "data",
    "measure_gpu": "gpu", "measure_peers": "peers", "measure_hangs": "hangs",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"distkit.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'distkit.bench' has no attribute {name!r}")
