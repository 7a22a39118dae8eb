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
#   rule** with warm-up (Goyal et al. 2017: lr x N, reached linearly over the first
#   epoch) is run beside the unchanged lr.
#
# Every run uses ignite's `EarlyStopping` on the validation loss, runs twice (medians
# over the repeats; the first epoch of each run is left out of the timings), with **one
# torch thread per process** (pinned), and every number is printed. Then we take one
# step apart: compute vs the gradient all-reduce, and the bytes it moves.
#
# Hardware: any CPU (2 GPUs or more: nccl on them). Runs in about a minute on 2 cores.

# %%
import os

import torch

from distkit import plots
from distkit.lessons import scaling
from distkit.config import Config

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
# Digits (1437 training images), the small CNN, lr 0.05, at most 4 epochs. The lr decays
# linearly to 0 over the run. `EarlyStopping(patience=1, min_delta=0.1)` stops a run
# after the first epoch that lowers the validation loss by less than 0.1.

# %%
base = Config(dataset="digits", model="cnn", epochs=4, lr=0.05, seed=0, output_dir="runs/scaling",
              early_stopping_patience=1, early_stopping_min_delta=0.1)
study = scaling.scaling_study(base, world_sizes=sizes, strong_batch=STRONG_BATCH,
                              weak_batch=WEAK_BATCH, repeats=2, warmup_epochs=1.0, backend=backend)
print(scaling.format_table(study["summary"]))
print(f"\n{len(study['runs'])} runs in {study['wall_time_s']:.0f} s on {study['machine']}")

# %%
fig = plots.scaling_curves(study["summary"])

# %% [markdown]
# Read the efficiency panel against the dotted line: 1.0 would mean N processes train N
# times as many samples per second as one. The next section measures why it is lower.

# %%
row = {(r["mode"], r["lr_rule"], r["world_size"]): r for r in study["summary"]}
for mode, rule in sorted({(m, r) for m, r, _ in row}):
    effs = ", ".join(f"N={n}: {row[(mode, rule, n)]['efficiency']:.2f}" for n in sizes if n > 1)
    print(f"{mode:6} scaling, {rule:17} efficiency {effs}")
print(f"this machine has {scaling.cores()} cores: N=4 processes share them, 2 per core")

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
# What the table says, in general terms (the cell below prints this run's numbers):
#
# - **Compute per step** follows the batch per process: strong scaling shrinks it
#   (64 → 32 → 16 per process); weak scaling keeps it. Unless processes outnumber the
#   cores: then they share cores, and each one's compute takes longer (N=4 on 2 cores).
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
# Strong scaling does not change the maths (the global batch, and so each step's
# average gradient, is the same), so it needs no lr change: its final losses stay close
# across N. The small differences come from which samples share a process, not from the
# number of steps.

# %%
strong = [row[("strong", scaling.PLAIN, n)]["final_val_loss"] for n in sizes]
print("strong scaling, final val loss per N:", ", ".join(f"{v:.4f}" for v in strong))
print(f"spread: {max(strong) - min(strong):.4f}")

# %% [markdown]
# ## 5. EarlyStopping
#
# Each run's epochs and validation losses; a run with fewer than 4 epochs was stopped by
# `EarlyStopping` because its last epoch improved the validation loss by less than 0.1
# (in a real study: a larger patience, a smaller min_delta, and more epochs).

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
