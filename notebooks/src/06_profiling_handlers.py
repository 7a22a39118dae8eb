# %% [markdown]
# # 06 · Profiling handlers: where the time goes, on every rank (CPU, gloo)
#
# A training loop spends its time in three places: **waiting for data**, **computing**
# (forward, backward, the gradient all-reduce, the optimizer step) and running
# **handlers** (metrics, validation, checkpoints, the progress bar). ignite measures
# all three. This notebook:
#
# 1. profiles a real `distkit` training run on 2 processes, with `HandlersTimeProfiler`,
#    `BasicTimeProfiler` and three `Timer`s attached in one call, and gathers every
#    rank's numbers into one cross-rank table (min / mean / max), a CSV and two charts;
# 2. shows what the progress bar costs;
# 3. makes training **data-bound** on purpose with a slow data pipeline, detects it from
#    the profile, fixes it with `num_workers`, prefetching and `pin_memory`, and measures
#    the speedup.
#
# Hardware: any CPU. Backend: `gloo`.

# %%
import csv
import warnings

import torch

from distkit import plots, profiling
from distkit.config import Config
from distkit.launch import run
from distkit.sharding import quiet_ignite_logs, run_on_ranks
from distkit.lessons.slow_data import profile_pipeline

torch.set_num_threads(1)
quiet_ignite_logs()  # ignite's INFO lines about spawning and loader kwargs
print(f"torch {torch.__version__}")

# %% [markdown]
# ## 1. Profile a real run
#
# `distkit train --profile` (here `Config(profile=True)`) calls `profiling.attach(trainer)`
# in every process before training and `profiling.summarize(...)` after it. `summarize`
# is itself distributed: every rank contributes its totals through `idist.all_gather`, so
# the table shows each handler's cost as min / mean / max over the ranks. (In a notebook
# the progress bar is a widget; it appears below, drawn by rank 0.)

# %%
results = run(Config(nproc_per_node=2, epochs=2, profile=True, output_dir="runs"))
profile = results["profile"]
print(profiling.format_summary(profile, top=10))

# %% [markdown]
# How to read it:
#
# - **data** is the time each rank waited for `next(loader)`; **compute** the time inside
#   the training step (forward, backward with its gradient all-reduce, optimizer step).
# - Each handler row is the total time that handler took *per rank*; `ranks` says how
#   many ranks ran it. A handler that runs a collective (a metric that all-reduces, the
#   validation, which all-reduces its counts) also absorbs the time it waits there for
#   the slowest rank: that is what a gap between min and max often means.
#   `Metric.iteration_completed` is the trainer's only metric, the epoch `Average` of
#   the loss: it only adds the batch loss locally; it all-reduces once, at the epoch's end.
# - The last lines: the verdict (data- or compute-bound) and whether the `Timer`s agree
#   with the profiler (notebook 07 looks at those).
#
# The whole table, per rank, goes to a CSV (ignite's own `write_results` needs pandas;
# this one needs nothing) and into `results.json` under `"profile"`:

# %%
path = profiling.write_csv(profile, "profile.csv")
with open(path) as f:
    table = list(csv.DictReader(f))
print(f"{path}: {len(table)} rows, columns {list(table[0])}")
assert {"min_s", "mean_s", "max_s", "rank0_s", "rank1_s"} <= set(table[0])
plots.profiler_bars(profile);

# %% [markdown]
# ## 2. What the progress bar costs
#
# `ProgressBar` runs on rank 0 only (every rank printing its own bar would be noise) and
# redraws after every iteration. Its row in the profile above is its own cost:

# %%
bar = profiling.row(profile, "ProgressBar (_OutputHandler)")
compute = profiling.row(profile, "compute (training step)")
print(f"progress bar: {bar['per_rank_s'][0] / profile['iterations'] * 1e3:.2f} ms per iteration on "
      f"rank 0, {bar['per_rank_s'][0] / compute['per_rank_s'][0]:.1%} of rank 0's compute time")
assert bar["ranks"] == 1 and bar["per_rank_s"][1] is None   # rank 0 only

# %% [markdown]
# That cost is paid on rank 0 only, so rank 0 arrives a little later at the next gradient
# all-reduce and the other ranks wait for it. In a notebook the bar is a widget redrawn
# through the kernel; in a terminal (`distkit train`) it is text on stderr. Compare the
# number above with the step time: where it matters, `ProgressBar` can redraw less often
# (`event_name=Events.ITERATION_COMPLETED(every=10)`), or be switched off
# (`distkit train --no-progress`).
#
# `distkit train --profile` prints the same table at the end of its summary and writes
# `profile.csv` next to `results.json`; this is its summary for the run above:

# %%
from distkit.commands.train import summary

print(summary(results))

# %% [markdown]
# ## 3. A data-bound run, detected and fixed
#
# `distkit.lessons.slow_data.SlowDataset` wraps the digits so that each sample takes 3 ms to
# load, as if read one by one from slow storage. The loop below is the kit's own trainer
# and CNN (`distkit.training.create_trainer`), on 2 processes, loading in the training
# process itself (`num_workers=0`, the default):

# %%
slow = run_on_ranks(profile_pipeline, 2, delay_s=0.003)
print(profiling.format_summary(slow["profile"], top=3))
print(f"training time: {slow['train_time_s']:.2f} s for 2 epochs")
assert slow["profile"]["bottleneck"] == "data", "the slow pipeline must be data-bound"

# %% [markdown]
# The profile says it plainly: each rank spends more time waiting for batches than
# computing. The model is idle most of the time, and more processes or a faster model
# would not help.
#
# The fix is in the `DataLoader`, through the same `auto_dataloader` call:
#
# - `num_workers=8` (global: 4 worker processes per training process) load batches in
#   parallel with training; loading here is waiting, not computing, so more workers
#   than cores still help;
# - `prefetch_factor=4`: each worker keeps 4 batches ready ahead of time;
# - `persistent_workers=True`: workers survive between epochs instead of restarting;
# - `pin_memory=True` on CUDA (page-locked host memory makes the copy to the GPU faster
#   and lets it overlap compute). Without a GPU it does nothing, so the kit leaves it
#   off here; the cell prints what was used.

# %%
# PyTorch warns when workers outnumber cores; here they mostly sleep on (simulated) I/O.
warnings.filterwarnings("ignore", message="This DataLoader will create")
fast = run_on_ranks(profile_pipeline, 2, delay_s=0.003, num_workers=8, prefetch_factor=4,
                    persistent_workers=True)
print(profiling.format_summary(fast["profile"], top=3))
print(f"pin_memory={fast['loader']['pin_memory']}, {fast['loader']['per_process_num_workers']} "
      f"workers per process")
speedup = slow["train_time_s"] / fast["train_time_s"]
for name, p in [("before", slow["profile"]), ("after", fast["profile"])]:
    print(f"{name}: data wait {p['data_s']['mean_s']:.2f} s, compute {p['compute_s']['mean_s']:.2f} s per rank")
print(f"training time: {slow['train_time_s']:.2f} s -> {fast['train_time_s']:.2f} s for the same "
      f"{fast['samples_per_epoch']} samples per epoch: {speedup:.2f}x faster")

# %%
assert fast["profile"]["data_share"] < slow["profile"]["data_share"]
assert speedup > 1.3, f"the fixed pipeline should be clearly faster, got {speedup:.2f}x"
plots.data_vs_compute([slow["profile"], fast["profile"]], ["num_workers=0", "8 workers + prefetch"]);

# %% [markdown]
# Data wait shrank (the numbers printed above): the workers load the next batches while
# the model trains on the current one. What is left of the wait is mostly the first
# batches of each epoch, requested before the workers have anything ready. Compute may
# grow a little, because the workers share the same cores with training to collate and
# hand over their batches.
#
# ## What you saw
#
# - One call attaches ignite's profilers and timers; one distributed call turns every
#   rank's numbers into a min / mean / max table, a CSV and charts.
# - Handlers that run on one rank only (the progress bar) or that synchronise ranks
#   (metrics, validation) show up as differences between ranks.
# - A data-bound loop is visible in the profile (data wait > compute), and the
#   `DataLoader`'s own knobs fix it; the speedup above was measured in this notebook.
#
# Next: [07 · Timing with Timer](07_timing_with_timer.ipynb), measuring the right thing.
