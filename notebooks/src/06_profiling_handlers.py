# %% [markdown]
# # 06 · Profiling handlers: where the time goes, on every rank (CPU, gloo)
#
# A training loop spends its time in three places: **waiting for data**, **computing**
# (forward, backward, the gradient all-reduce, the optimizer step) and running
# **handlers** (metrics, validation, checkpoints, the progress bar). ignite measures
# all three. This notebook:
#
# 1. attaches ignite's `HandlersTimeProfiler` and `BasicTimeProfiler` to a trainer you
#    write, reads them with `get_results` / `print_results`, and uses them to measure
#    what a `RunningAverage` costs compared with an `Average`;
# 2. profiles a real `distkit` training run on 2 processes the same way, and gathers
#    every rank's numbers into one cross-rank table (min / mean / max), a CSV and two
#    charts;
# 3. shows what the progress bar costs;
# 4. makes training **data-bound** on purpose with a slow data pipeline, detects it from
#    the profile, fixes it with `num_workers`, prefetching and `pin_memory`, and measures
#    the speedup.
#
# Hardware: any CPU. Backend: `gloo`.

# %%
import csv
import os
import tempfile
import warnings

import ignite.distributed as idist
import torch
from ignite.engine import Engine, Events
from ignite.handlers import BasicTimeProfiler, HandlersTimeProfiler
from ignite.metrics import Average, RunningAverage

from distkit import plots, profiling
from distkit.config import Config
from distkit.launch import run
from distkit.machine import quiet_ignite_logs
from distkit.sharding import run_on_ranks
from distkit.lessons.slow_data import profile_pipeline

torch.set_num_threads(1)
quiet_ignite_logs()  # ignite's INFO lines about spawning and loader kwargs
workdir = tempfile.mkdtemp(prefix="distkit-06-")  # this notebook's files; never the repository
print(f"torch {torch.__version__}; files of this notebook go to {workdir}")

# %% [markdown]
# ## 1. ignite's two profilers, attached by hand
#
# `BasicTimeProfiler` times, per event, *all* the handlers of that event together, and
# the data fetch and the training step. `HandlersTimeProfiler` times *each* handler on
# its own. Both are attached with `.attach(trainer)` before `trainer.run`, and read
# after it with `get_results()` (numbers) and `print_results(...)` (a table).
#
# The trainer below carries one metric for the training loss, either a
# `RunningAverage` (a smoothed loss after every iteration) or an `Average` (the mean over
# the epoch). The difference matters under data parallelism: `RunningAverage.update`
# calls `idist.all_reduce` on **every** iteration (`ignite/metrics/running_average.py`,
# line 153 in ignite 0.5.5), while `Average` accumulates locally and all-reduces once,
# when the epoch's value is computed. The profiler measures what that costs.

# %%
from distkit.data import digits_dataset, split
from distkit.training import initialize


def profiled_training(local_rank, metric, show):
    config = Config(epochs=2, batch_size=32)
    train_set, _ = split(digits_dataset())
    loader = idist.auto_dataloader(train_set, batch_size=config.batch_size, shuffle=True)
    model, optimizer, criterion = initialize(config)  # idist.auto_model / auto_optim, as in notebook 04

    def train_step(engine, batch):
        loss = criterion(model(batch[0]), batch[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    trainer = Engine(train_step)
    trainer.add_event_handler(Events.EPOCH_STARTED, lambda e: loader.sampler.set_epoch(e.state.epoch - 1))
    if metric == "RunningAverage":
        RunningAverage(output_transform=lambda loss: loss).attach(trainer, "train_loss")
    else:
        Average(output_transform=lambda loss: loss).attach(trainer, "train_loss")

    basic = BasicTimeProfiler()
    basic.attach(trainer)
    handlers = HandlersTimeProfiler()  # attached last, so it does not time the other profiler's bookkeeping
    handlers.attach(trainer)
    trainer.run(loader, max_epochs=config.epochs)

    if show and idist.get_rank() == 0:
        BasicTimeProfiler.print_results(basic.get_results())
        HandlersTimeProfiler.print_results(handlers.get_results())
    return {"handlers": handlers.get_results(), "iterations": trainer.state.iteration,
            "train_loss": trainer.state.metrics["train_loss"]}


running = run_on_ranks(profiled_training, 2, "RunningAverage", True, backend="gloo")  # rank 0's return value

# %% [markdown]
# Rank 0's two tables, printed by the profilers themselves. In `HandlersTimeProfiler`'s
# table each row is one handler on one event. A metric's handlers are listed by the
# name of the method, which every metric inherits from the base class:
# `Metric.iteration_completed` (calls `update`) and `Metric.completed` (calls
# `compute`); `Processing` is the training step and `Dataflow` the wait for batches.
# Now the same run with an `Average`, and the metric's rows of both runs, from
# `get_results()` (each run has one metric, so the `Metric.*` rows are its own):

# %%
def metric_seconds(results):
    """Total seconds of the metric's handlers on rank 0 (rows: name, event, total, ...)."""
    return sum(r[2] for r in results["handlers"] if str(r[0]).startswith("Metric.") and isinstance(r[2], float))


def step_seconds(results):
    return next(r[2] for r in results["handlers"] if r[0] == "Processing")


average = run_on_ranks(profiled_training, 2, "Average", False, backend="gloo")
for name, res in (("RunningAverage", running), ("Average", average)):
    for r in res["handlers"]:
        if str(r[0]).startswith("Metric."):
            print(f"{name:15} {r[0]:28} {r[1]:20} total {r[2]} s")
running_s, average_s = metric_seconds(running), metric_seconds(average)
iters = running["iterations"]
print(f"per iteration on rank 0: RunningAverage {running_s / iters * 1e3:.3f} ms, Average "
      f"{average_s / iters * 1e3:.3f} ms ({running_s / average_s:.0f}x); the training step itself "
      f"{step_seconds(running) / iters * 1e3:.2f} ms")
assert running_s > 2 * average_s, "an all-reduce per iteration must cost more than a local sum"

# %% [markdown]
# On rank 0 the `RunningAverage` cost the multiple of the `Average` printed above, per
# iteration, to show a smoothed loss (every rank makes the same all-reduce); compare it
# with the training step printed beside it. That is why `distkit.training` logs the
# epoch mean, all-reduced once per epoch, rather than a running average.
#
# ## 2. Profile a real run, on every rank
#
# `distkit train --profile` (here `Config(profile=True)`) calls `profiling.attach(trainer)`
# in every process before training, which makes the same `BasicTimeProfiler().attach`
# and `HandlersTimeProfiler().attach` calls as above, plus three ignite `Timer`s
# (notebook 07); after training it calls `profiling.summarize(...)`, which reads each
# profiler's `event_handlers_times`, `dataflow_times` and `processing_times` (the
# arrays `get_results` summarises) and is itself distributed: every rank contributes
# its totals through `idist.all_gather`, so the table shows each handler's cost as
# min / mean / max over the ranks. (In a notebook the progress bar is a widget, drawn by
# rank 0 below; without the `ipywidgets` package tqdm could only write every frame of a
# text bar into the cell, so the kit prints one line per epoch instead.)

# %%
results = run(Config(backend="gloo", nproc_per_node=2, epochs=2, profile=True,
                     output_dir=os.path.join(workdir, "runs")))
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
#   the slowest rank: that is what a gap between min and max often means. The trainer
#   has no ignite metric: `create_trainer` sums the batch losses itself and, once per
#   epoch, in `mean_train_loss` at the epoch's end, makes two all-reduces: the number
#   of steps and the sum of the losses (`src/distkit/training.py`; what an `Average`
#   computes, as section 1 measured, without its per-step bookkeeping).
# - The last lines: the verdict (data- or compute-bound) and whether the `Timer`s agree
#   with the profiler (notebook 07 looks at those).
#
# The whole table, per rank, goes to a CSV (ignite's own `write_results` needs pandas;
# this one needs nothing) and into `results.json` under `"profile"`:

# %%
path = profiling.write_csv(profile, os.path.join(workdir, "profile.csv"))
with open(path) as f:
    table = list(csv.DictReader(f))
print(f"{path}: {len(table)} rows, columns {list(table[0])}")
assert {"min_s", "mean_s", "max_s", "rank0_s", "rank1_s"} <= set(table[0])
plots.profiler_bars(profile);

# %% [markdown]
# ## 3. What the progress bar costs
#
# `ProgressBar` runs on rank 0 only (every rank printing its own bar would be noise).
# `distkit.training` attaches it with an event filter,
# `Events.ITERATION_COMPLETED(event_filter=at_most_every(0.1))`, so it redraws at most
# every 0.1 s and at each epoch's last step. ignite times a filtered handler as its
# filter wrapper, `Engine._handler_wrapper.<locals>.wrapper` (the bar's own name is
# lost), and `HandlersTimeProfiler` keeps only the calls of at least 0.1 ms
# (`ignite/handlers/time_profilers.py`, line 517 in ignite 0.5.5), that is, the
# redraws; the skipped calls cost well under that. It is the only filtered handler in
# the kit's trainer, so its row is the bar's cost:

# %%
import importlib.util

bar = profiling.row(profile, profiling.FILTERED)
compute = profiling.row(profile, "compute (training step)")
if bar is None:  # no bar was drawn: a kernel without ipywidgets
    assert importlib.util.find_spec("ipywidgets") is None
    print("no progress bar in this run (no ipywidgets in this kernel: pip install ipywidgets, "
          "restart the kernel and run the notebook again to measure it)")
else:
    print(f"progress bar: {bar['calls'][0]} redraws of {profile['iterations']} iterations, "
          f"{bar['per_rank_s'][0] / profile['iterations'] * 1e3:.2f} ms per iteration on rank 0, "
          f"{bar['per_rank_s'][0] / compute['per_rank_s'][0]:.1%} of rank 0's compute time")
    assert bar["ranks"] == 1 and bar["per_rank_s"][1] is None   # rank 0 only
    assert bar["event"] == "ITERATION_COMPLETED"

# %% [markdown]
# That cost is paid on rank 0 only, so rank 0 arrives a little later at the next gradient
# all-reduce and the other ranks wait for it. In a notebook the bar is a widget redrawn
# through the kernel; in a terminal (`distkit train`) it is text on stderr. Compare the
# number above with the step time: where it matters, redraw less often (a larger
# interval in the filter, or `Events.ITERATION_COMPLETED(every=10)`), or switch the
# bar off (`distkit train --no-progress`).
#
# `distkit train --profile` prints the same table at the end of its summary and writes
# `profile.csv` next to `results.json`; this is its summary for the run above:

# %%
from distkit.reporting import run_summary

print(run_summary(results))

# %% [markdown]
# ## 4. A data-bound run, detected and fixed
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
# the model trains on the current one. What is left of the wait includes the first
# batches of each epoch, requested before the workers have anything ready. Compute may
# grow a little, because the workers share the same cores with training to collate and
# hand over their batches.
#
# ## What you saw
#
# - `HandlersTimeProfiler` and `BasicTimeProfiler` are attached with `.attach(trainer)`
#   and read with `get_results()` / `print_results()`; they showed that a
#   `RunningAverage` pays an all-reduce per iteration that an `Average` does not.
# - `distkit.profiling` attaches the same profilers plus timers in one call, and one
#   distributed call turns every rank's numbers into a min / mean / max table, a CSV
#   and charts.
# - Handlers that run on one rank only (the progress bar) or that synchronise ranks
#   (metrics, validation) show up as differences between ranks.
# - A data-bound loop is visible in the profile (data wait > compute), and the
#   `DataLoader`'s own knobs fix it; the speedup above was measured in this notebook.
#
# Next: [07 · Timing with Timer](07_timing_with_timer.ipynb), measuring the right thing.

# %% [markdown]
# ## Cleaning up
#
# Every run of this notebook wrote into its own temporary folder (`workdir`). The last cell
# removes it; skip it to keep the files and look at them.

# %%
import shutil

shutil.rmtree(workdir)
print(f"removed {workdir}")
