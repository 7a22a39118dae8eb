# %% [markdown]
# # 08 · Scaling study: what N processes buy, and what they cost (CPU, gloo)
#
# The same `training` function, unchanged, at 1, 2 and 4 processes. Two ways to add
# processes, which answer different questions:
#
# - **strong scaling** keeps the *global* batch (64): each of N processes computes 64 / N
#   samples per step, and an epoch has as many steps as before. Same maths, less work per
#   process per step: it should be faster.
# - **weak scaling** keeps the batch *per process* (16): the global batch grows to 16 N,
#   so an epoch has N times fewer steps. More data per second, but fewer, larger steps:
#   learning per epoch suffers unless the learning rate grows too. The **linear scaling
#   rule** with warm-up (Goyal et al. 2017: lr x N, reached linearly over the first 5
#   epochs of their 90-epoch runs; this short study warms up over its first epoch) is
#   run beside the unchanged lr.
#
# Every run uses ignite's `EarlyStopping` on the validation loss and runs once (its
# time per epoch is the median over its epochs after the first, which pays for
# warm-up; `repeats=3` below gives medians over 3 repeats too, at 3 times the cost),
# with **one torch thread per process** in every row, the 1-process baseline included
# (the table's `thr` column is `torch.get_num_threads()` as each run measured it). So
# the study compares N one-thread workers with one, as N GPUs with one GPU: on a 2-core
# machine N = 2 has twice the cores of the baseline, and N = 4 shares them. Every number
# is printed.
# Then we take one step apart: compute vs the gradient all-reduce, and the bytes it
# moves.
#
# Hardware: any CPU (2 GPUs or more: nccl on them). The study's wall time is printed
# after it runs.

# %%
import math
import os
import sys
import tempfile

import torch
from ignite.engine import Events
from ignite.handlers import EarlyStopping, PiecewiseLinear

from distkit import plots
from distkit.lessons import cores, scaling
from distkit.config import Config
from distkit.machine import quiet_ignite_logs

quiet_ignite_logs()  # ignite's INFO lines about loader arguments
# This kernel computes on one thread too, as every process of the study will: a kernel
# whose OpenMP pool already runs several threads cannot fork workers that use them (the
# kit would then say so, and pin them to 1 thread itself).
torch.set_num_threads(1)

if torch.cuda.device_count() >= 2:
    backend, sizes = "nccl", [n for n in (1, 2, 4) if n <= torch.cuda.device_count()]
else:
    backend, sizes = "gloo", [1, 2, 4]
    print("fewer than 2 GPUs here: the study runs CPU processes with gloo")
print(f"{scaling.cores()} cores; world sizes {sizes} with {backend}; torch {torch.__version__}")
# Other programs busy on the same cores slow N > 1 most: note how busy the machine is.
print(f"load average (1 min) before the study: {os.getloadavg()[0]:.1f}")

# %% [markdown]
# ## 1. The plan
#
# One line per configuration. A configuration that stands for two curves runs once: at
# N = 4, strong scaling (64 / 4 = 16 per process, lr unchanged) *is* weak scaling with
# the lr unchanged; at N = 1 both weak-scaling curves start from the same baseline.

# %%
STRONG_BATCH, WEAK_BATCH = 64, 16
for job in scaling.plan(sizes, STRONG_BATCH, WEAK_BATCH):
    curves = "; ".join(f"{mode} / {rule}" for mode, rule in job.labels)
    print(f"N={job.world_size}  {job.per_process_batch:3d} per process  global "
          f"{job.per_process_batch * job.world_size:3d}  lr x N: {job.scale_lr!s:5}  -> {curves}")

# %% [markdown]
# ## 2. Run it
#
# Digits (1437 training images), the small CNN, lr 0.05, at most 4 epochs. Two ignite
# handlers shape every run; `distkit.training` builds them from the config, and here
# they are by hand.
#
# **The learning rate**: `PiecewiseLinear(optimizer, "lr", milestones_values=[...])`,
# called on every `ITERATION_STARTED`, interpolates linearly between
# `(iteration, lr)` milestones: from 0 to the peak over the warm-up (with the linear
# scaling rule) or straight from the peak, then down to 0 at the last iteration.
# `PiecewiseLinear.simulate_values` computes the values it would set, without an
# optimizer. For weak scaling at N = 4 (16 per process, global batch 64):

# %%
top = max(sizes)
steps_per_epoch = math.ceil(math.ceil(1437 / top) / WEAK_BATCH)  # each rank's shard, in batches of 16
total = 4 * steps_per_epoch
schedules = {"same lr": [(0, 0.05), (total, 0.0)],
             f"lr x {top} + 1 warm-up epoch": [(0, 0.0), (steps_per_epoch, 0.05 * top), (total, 0.0)]}
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3))
for name, milestones in schedules.items():
    values = PiecewiseLinear.simulate_values(num_events=total, param_name="lr", milestones_values=milestones)
    ax.plot([i for i, _ in values], [v for _, v in values], label=name)
    print(f"{name:28} milestones {milestones}: lr at iterations 0, {steps_per_epoch}, {total - 1}: "
          f"{values[0][1]:.3f}, {values[steps_per_epoch][1]:.3f}, {values[-1][1]:.4f}")
ax.set_xlabel(f"iteration ({steps_per_epoch} per epoch)")
ax.set_ylabel("learning rate")
ax.set_title(f"weak scaling, N = {top}: the lr schedules")
ax.legend()
ax.grid(alpha=0.3)

# %% [markdown]
# **Early stopping**: `EarlyStopping(patience, score_function, trainer, threshold)`
# is called after each validation; it calls `score_function(engine)` (higher is better),
# and after `patience` calls without an improvement of more than `threshold` over the
# best score it calls `trainer.terminate()`. (`threshold` was called `min_delta` before
# ignite 0.5.5; `Config.early_stopping_min_delta` keeps that name.) ignite's idiom
# attaches it to the **evaluator**, scoring the evaluator's own metric. Here on one process, with the kit's
# trainer and evaluator (`distkit.training.create_trainer` is an ignite `Engine` with the
# step written out, `create_evaluator` is `create_supervised_evaluator` with `Accuracy`
# and `Loss`) and the study's settings, `patience=1, threshold=0.1`:

# %%
from distkit.data import get_dataflow
from distkit.training import create_evaluator, create_trainer, initialize

demo = Config(dataset="digits", model="cnn", lr=0.05, batch_size=64, seed=0)
train_loader, val_loader = get_dataflow(demo)  # one process: auto_dataloader returns a plain DataLoader
model, optimizer, criterion = initialize(demo)
trainer = create_trainer(model, optimizer, criterion, demo)
evaluator = create_evaluator(model, criterion, demo)
trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda _: evaluator.run(val_loader))
val_losses = []
evaluator.add_event_handler(Events.COMPLETED, lambda e: val_losses.append(e.state.metrics["loss"]))
stopper = EarlyStopping(patience=1, threshold=0.1, trainer=trainer,
                        score_function=lambda engine: -engine.state.metrics["loss"])
for handler in stopper.logger.handlers:  # its "Stop training" line: to stdout, not a red stderr box
    handler.setStream(sys.stdout)
evaluator.add_event_handler(Events.COMPLETED, stopper)
trainer.run(train_loader, max_epochs=10)
print("validation loss per epoch:", ", ".join(f"{v:.3f}" for v in val_losses))
print(f"stopped after epoch {trainer.state.epoch} of at most 10")
assert trainer.state.epoch == len(val_losses) < 10
assert min(val_losses[:-1]) - val_losses[-1] <= 0.1                     # the last epoch improved by <= 0.1 ...
assert all(a - b > 0.1 for a, b in zip(val_losses[:-2], val_losses[1:-1]))  # ... every earlier one by more

# %% [markdown]
# `distkit.training` stops the same way but wires it differently (see
# `src/distkit/training.py`): from `Config.early_stopping_*` it builds
# `EarlyStopping(patience=..., threshold=..., score_function=..., trainer=trainer)` and
# attaches it to the **evaluator's** `COMPLETED` (as ignite's examples do), scoring the
# negated validation loss in `evaluator.state.metrics`. It also attaches the `PiecewiseLinear` above to the
# trainer's `ITERATION_STARTED`.
#
# Now the study: `scaling.scaling_study` starts each world size once with
# `idist.Parallel` (through `distkit.runner.run_per_rank`), calls
# `distkit.training.training` in those processes for each configuration, then times
# one step with and without DDP's gradient all-reduce (section 3). Its runs go to a
# temporary folder:

# %%
workdir = tempfile.mkdtemp(prefix="distkit-08-")  # this run's folder, removed by the last cell
base = Config(dataset="digits", model="cnn", epochs=4, lr=0.05, seed=0, output_dir=workdir,
              early_stopping_patience=1, early_stopping_min_delta=0.1)
study = scaling.scaling_study(base, world_sizes=sizes, strong_batch=STRONG_BATCH,
                              weak_batch=WEAK_BATCH, repeats=1, warmup_epochs=1.0, backend=backend)
print(scaling.format_table(study["summary"]))
print(f"\n{len(study['runs'])} runs in {study['wall_time_s']:.0f} s on {study['machine']}")
threads = {r["threads_per_process"] for r in study["summary"]}
assert threads == {1}, threads  # every row, the baseline included, on one thread per process

# %%
fig = plots.scaling_curves(study["summary"])

# %% [markdown]
# Read the efficiency panel against the dotted line: 1.0 would mean N processes train N
# times as many samples per second as one. With one thread per process, N = 2 on a
# 2-core machine has a core each, so weak scaling (the same work per process) can come
# close to 1.0 there; strong scaling gives each process half the batch and the same
# all-reduce, and lands lower. The next section measures why.

# %%
row = {(r["mode"], r["lr_rule"], r["world_size"]): r for r in study["summary"]}
for mode, rule in sorted({(m, r) for m, r, _ in row}):
    effs = ", ".join(f"N={n}: {row[(mode, rule, n)]['efficiency']:.2f}" for n in sizes if n > 1)
    print(f"{mode:6} scaling, {rule:17} efficiency {effs}")
print(cores.sharing_sentence(max(sizes), scaling.cores()))

# %% [markdown]
# ## 3. Why scaling is not linear: one step, taken apart
#
# After its runs, each world size times one training step of the same model, three ways:
# forward + backward + update **without** the gradient all-reduce
# (`DistributedDataParallel.no_sync()`), the **same step with** it, and the all-reduce
# **alone** on a buffer of the gradients' size. The bytes all-reduced per step are the
# sum of the gradient sizes: they depend on the model only, not on N or on the batch.

# %%
print(scaling.format_costs(study["costs"]))
fig = plots.step_costs(study["costs"])
moved = {c["bytes_allreduced_per_step"] for c in study["costs"] if c["world_size"] > 1}
grad_bytes = study["costs"][0]["gradient_bytes"]
assert moved == {grad_bytes}, moved  # same bytes at every N > 1, whatever the batch
assert all(c["bytes_allreduced_per_step"] == 0 for c in study["costs"] if c["world_size"] == 1)
print(f"\nevery step of N > 1 processes all-reduces {grad_bytes:,} bytes "
      f"({grad_bytes // 4:,} float32 gradients); a single process all-reduces nothing")

# %% [markdown]
# What the table should show on a quiet machine; check it against this run's numbers,
# which the cell below prints (other programs on the same cores distort them, most of
# all for N > 1, and the load average printed at the top says how busy it was):
#
# - **Compute per step** follows the batch per process: strong scaling shrinks it
#   (64 → 32 → 16 per process); weak scaling keeps it. Unless processes outnumber the
#   cores: then they share cores, and each one's compute takes longer (the sentence
#   printed after the efficiencies above says whether they do on this machine).
# - **Communication per step** does not shrink: the same bytes every step, and with a
#   ring all-reduce each process sends 2 (N-1)/N of them, *more* as N grows.
# - So the share of a step spent communicating grows with N, most of all in strong
#   scaling, where compute shrinks. On this small model and a CPU it is a large share.

# %%
for c in sorted(study["costs"], key=lambda c: (c["world_size"], -c["per_process_batch"])):
    if c["world_size"] > 1:
        print(f"N={c['world_size']}, {c['per_process_batch']:2d} per process: compute "
              f"{1e3 * c['compute_s']:.2f} ms + all-reduce not hidden "
              f"{1e3 * max(0, c['step_s'] - c['compute_s']):.2f} ms -> "
              f"{c['communication_share']:.0%} of the step is communication")

# %% [markdown]
# ## 4. Weak scaling needs the learning rate to scale
#
# Weak scaling with 4 processes takes 4 times fewer steps per epoch, each on a 4 times
# larger batch. With the lr unchanged, the same epochs learn less. The linear scaling
# rule gives each step 4 times the lr, after a warm-up epoch. These losses do not depend
# on timing: the same seed gives the same numbers on every run of this notebook.

# %%
top = max(sizes)
for n in sizes:
    same, scaled = row[("weak", scaling.PLAIN, n)], row[("weak", scaling.SCALED, n)]
    print(f"N={n}: global batch {same['global_batch']:3d}  final val loss: same lr "
          f"{same['final_val_loss']:.4f} (peak lr {same['peak_lr']:.2f}), lr x N + warm-up "
          f"{scaled['final_val_loss']:.4f} (peak lr {scaled['peak_lr']:.2f})")
if top > 1:
    assert row[("weak", scaling.SCALED, top)]["final_val_loss"] < row[("weak", scaling.PLAIN, top)]["final_val_loss"]
    print(f"at N={top} the linear scaling rule ends with the lower validation loss")

# %% [markdown]
# Strong scaling does not change the maths, so it needs no lr change. Two facts make
# that exact, up to the last batch of an epoch:
#
# - `DistributedSampler` draws **one** permutation of the dataset for any N (seeded by
#   `seed + epoch`) and gives rank r every N-th index of it. With B / N samples per
#   process per step, step k covers the same samples whether 2 or 4 processes share
#   it. Only the last batch differs: the sampler pads the dataset to a multiple of N by
#   repeating samples. The cell below checks this for the first epoch. (With **one**
#   process `auto_dataloader` adds no sampler at all, `ignite/distributed/auto.py`
#   line 75: a plain `DataLoader(shuffle=True)` draws another order from torch's
#   global generator, so N = 1 sees the same samples per epoch in other batches.)
# - This CNN has no BatchNorm and no dropout, so a sample's gradient does not depend on
#   which other samples share its process; DDP averages the per-process mean gradients
#   of equal-sized shards, which is the mean gradient of the global batch.
#
# What is left is the order of the floating-point additions, that padded last batch,
# and at N = 1 the other sample order.

# %%
from torch.utils.data.distributed import DistributedSampler

from distkit.data import digits_dataset, split

train_set, _ = split(digits_dataset())


def global_batches(n, batch=STRONG_BATCH):
    """The samples of each global step of epoch 1, with n processes (strong scaling)."""
    shards = [list(DistributedSampler(train_set, num_replicas=n, rank=r, shuffle=True)) for r in range(n)]
    per = batch // n
    return [sorted(i for shard in shards for i in shard[k * per:(k + 1) * per])
            for k in range(math.ceil(len(shards[0]) / per))]


two = global_batches(2)
for n in sizes[1:]:
    steps = global_batches(n)
    same = sum(a == b for a, b in zip(steps, two))
    print(f"N={n}: {len(steps)} steps per epoch, {same} of them on exactly the samples of N=2's step")
    assert len(steps) == len(two) and steps[:-1] == two[:-1]  # all but the padded last step
strong = [row[("strong", scaling.PLAIN, n)]["final_val_loss"] for n in sizes]
print("strong scaling, final val loss per N:", ", ".join(f"{v:.4f}" for v in strong))
print(f"spread: {max(strong) - min(strong):.4f}")

# %% [markdown]
# ## 5. EarlyStopping in the study
#
# Each run's epochs and validation losses; a run with fewer than 4 epochs was stopped by
# `EarlyStopping` because its last epoch improved the validation loss by no more than
# 0.1 (in a real study: a larger patience, a smaller min_delta, and more epochs).

# %%
for r in sorted(study["runs"], key=lambda r: (r["world_size"], r["per_process_batch"], r["scale_lr"])):
    if r["repeat"] == 0:
        stopped = "stopped early" if r["epochs_completed"] < base.epochs else "ran all epochs"
        print(f"N={r['world_size']} {r['per_process_batch']:2d}/proc lr x N {r['scale_lr']!s:5}: "
              f"val loss {' '.join(f'{v:.3f}' for v in r['val_losses'])}  ({stopped})")
print(f"{sum(r['epochs_completed'] < base.epochs for r in study['runs'])} of {len(study['runs'])} "
      "runs stopped early")

# %% [markdown]
# ## What to take away
#
# - Adding processes adds throughput only while the work per step outweighs the gradient
#   all-reduce, whose size is fixed by the model. Bigger models per byte of gradient, or
#   bigger batches per process, scale better; so does communication that overlaps
#   backward (DDP's buckets) on hardware with fast links.
# - Strong scaling keeps the maths and shrinks the work per step; weak scaling keeps the
#   work per step and changes the maths, so it needs the learning rate to follow (linear
#   scaling rule + warm-up).
# - Measure on your own hardware: the same code runs there unchanged, e.g.
#   `scaling.scaling_study(base, world_sizes=[1, 2, 4, 8], backend="nccl")` on 8 GPUs.

# %% [markdown]
# ## Cleaning up
#
# Every run of this notebook wrote into its own temporary folder (`workdir`). The last cell
# removes it; skip it to keep the files and look at them.

# %%
import shutil

shutil.rmtree(workdir)
print(f"removed {workdir}")
