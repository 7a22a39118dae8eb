"""The per-step probe of ``distkit bench``'s overhead measurement on its own: the kit's
extra CPU microseconds per step over the hand-written loop (kit's MLP, batch 8, 1 torch
thread), for the kit as training() builds it, create_trainer alone, and with the
progress bar of ``distkit train``; difference of the medians over rounds.

    python benchmarks/step_cost_probe.py [steps per run] [rounds]
"""
import logging, statistics, sys
logging.disable(logging.INFO)
from distkit.bench.overhead import _overhead_sides
from distkit.bench.method import interleaved, torch_threads
from distkit.bench.sides import bench_config
from distkit.bench.method import MODES
s = MODES["quick"]
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
runs = 2 + repeats
small = bench_config(s, model="mlp", batch_size=8, runs=runs, steps=steps)
with torch_threads(1):
    _, sides = _overhead_sides(small, runs)
    cpu = {}
    interleaved(sides, repeats, 2, cpu)
us = {k: 1e6 * 8 / statistics.median(v) for k, v in cpu.items()}
print({k: round(v - us["hand-written"], 1) for k, v in us.items()}, "hand", round(us["hand-written"], 1))
