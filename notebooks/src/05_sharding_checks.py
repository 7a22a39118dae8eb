# %% [markdown]
# # 05 · Sharding checks: who sees which sample (CPU, gloo)
#
# Data parallelism promises that the N processes split each epoch's data between them:
# every sample seen once, by one process, in a fresh order every epoch. This notebook
# does not take that on trust. It shows, on a CPU:
#
# 1. what `idist.auto_dataloader` did to the loader you asked for, read back from the
#    loader itself: batch size, workers, sampler, `pin_memory`;
# 2. a check that gathers every rank's sample indices with `idist.all_gather` and reports
#    overlap, coverage, the padding `DistributedSampler` adds, what `drop_last` removes,
#    and whether the order changes between epochs, with a picture of it;
# 3. the check on a dataset the kit has never seen, and on a planted bug it must catch;
# 4. the same check from the command line: `distkit shard-check`;
# 5. what the padding does to validation metrics, and the kit's unpadded loader.
#
# Hardware: any CPU. Backend: `gloo`.

# %%
import subprocess
import sys

import ignite.distributed as idist
import torch
from torch.utils.data import Subset

from distkit import plots
from distkit.data import digits_dataset
from distkit.machine import quiet_ignite_logs
from distkit.sharding import (collect_indices, describe_loader, format_report, format_settings,
                              rank_zero_sampler, run_on_ranks, shard_report)

quiet_ignite_logs()  # ignite's INFO lines about every loader's arguments (its warnings still show)
torch.set_num_threads(1)
digits = digits_dataset()
print(f"{len(digits)} digits; torch {torch.__version__}")

# %% [markdown]
# ## 1. What `auto_dataloader` did
#
# Training never builds its `DataLoader` itself: it calls
# `idist.auto_dataloader(dataset, batch_size=B, num_workers=W, ...)` with **global**
# values and lets ignite adapt them to the process it runs in. Each of 2 processes below
# asks for three loaders and reads back what it got: `describe_loader` looks only at the
# loader's own attributes (`batch_size`, `num_workers`, `sampler`, `pin_memory`).

# %%
def loader_settings(local_rank):
    out = []
    for batch_size, num_workers in [(64, 2), (65, 3), (1, 0)]:
        loader = idist.auto_dataloader(digits, batch_size=batch_size, num_workers=num_workers, shuffle=True)
        out.append(describe_loader(loader, batch_size, num_workers))
    return out


b64, b65, b1 = run_on_ranks(loader_settings, 2)
print(format_settings([b64, b65, b1]))

# %% [markdown]
# Read it as a checklist, which the next cell asserts:
#
# - **batch size** is divided by the world size: 64 → 32 per rank. When it does not
#   divide, the remainder is lost: 65 → 32 per rank, a step uses 64 samples. When it is
#   smaller than the world size it is *not* divided at all: 1 → 1 per rank, 2 per step
#   (which is why `distkit train` refuses a global batch below the world size).
# - **workers** are divided among the processes of a node, rounding up: 3 → 2 each,
#   4 in all.
# - a **`DistributedSampler`** was inserted, one per rank, each knowing its rank.
# - **`pin_memory`** is off: ignite turns it on only when the device is a CUDA GPU, and
#   these gloo processes run on the CPU even where there is one (notebook 01 says why).

# %%
assert (b64["per_rank_batch_size"], b64["effective_global_batch_size"]) == (32, 64)
assert (b65["per_rank_batch_size"], b65["effective_global_batch_size"]) == (32, 64)
assert (b1["per_rank_batch_size"], b1["effective_global_batch_size"]) == (1, 2)
assert b64["per_process_num_workers"] == 1 and b65["per_process_num_workers"] == 2
assert b64["sampler"] == "DistributedSampler" and b64["sampler_num_replicas"] == 2
assert b64["pin_memory"] is False  # a CPU process: nothing to pin for
print("checklist holds")

# %% [markdown]
# ## 2. Gather every rank's indices, and check them
#
# `collect_indices` runs in every process. It wraps the dataset in
# `distkit.data.IndexedDataset`, so each batch also carries the index of each sample,
# builds the loader exactly as training does, runs it for a few epochs (calling
# `sampler.set_epoch(epoch)` first, as `distkit.training` does) and gathers every rank's
# indices with `idist.all_gather`. `shard_report` then compares them with what a correct
# sampler must produce.
#
# Epoch numbers: the reports and pictures count epochs from 1, as ignite's
# `engine.state.epoch` does; `set_epoch` takes the sampler's 0-based count, so epoch 1
# is `set_epoch(0)` (and training calls `set_epoch(engine.state.epoch - 1)`).
#
# 101 digits on 2 ranks, global batch 20: 101 does not divide by 2.

# %%
small = Subset(digits, range(101))
record = run_on_ranks(lambda r: collect_indices(small, batch_size=20, epochs=3), 2)
report = shard_report(record)
print(format_report(report))
plots.sharding_map(record);

# %% [markdown]
# `DistributedSampler` gives every rank the **same number** of samples, so that all ranks
# run the same number of steps (a rank that stopped early would leave the others waiting
# in the gradient all-reduce forever). With 101 samples it pads the shuffled list to 102
# by repeating its first index: one sample is seen twice per epoch, once on each rank
# (the black column in the picture). Everything else is disjoint and every sample is
# covered. The right-hand plot puts each sample rank 0 read in two consecutive epochs at
# (its position in the first, its position in the next): the points scatter off the
# diagonal, so the order changed, and the legend counts how few stayed in place.

# %%
first = report["epochs"][0]
assert first["per_rank"] == [51, 51] and report["expected"]["padding"] == 1
assert all(ep["duplicates"] == 1 and ep["coverage"] == 1.0 for ep in report["epochs"])
assert report["order_changes_between_epochs"] == [True, True] and report["ok"]
print("one padding duplicate per epoch, full coverage, new order every epoch")

# %% [markdown]
# ### Forgetting `set_epoch`
#
# `DistributedSampler` shuffles with a seed plus the epoch number it was last given. If
# nobody calls `set_epoch`, every epoch replays epoch 0's order:

# %%
frozen = shard_report(run_on_ranks(lambda r: collect_indices(small, batch_size=20, epochs=3,
                                                             set_epoch=False), 2))
print(format_report(frozen))
assert frozen["order_changes_between_epochs"] == [False, False]

# %% [markdown]
# The shards are still correct, so nothing crashes and accuracy looks fine; the model
# just sees the same sequence of batches every epoch. `distkit.training` calls
# `train_loader.sampler.set_epoch(epoch)` on every `EPOCH_STARTED` for this reason.
#
# ### `drop_last`
#
# Two different things are called `drop_last`, and `auto_dataloader` passes yours to
# only one of them:
#
# - **`DataLoader(drop_last=True)`**: each rank's loader drops its last, incomplete
#   batch. `idist.auto_dataloader(..., drop_last=True)` sets this one (the sampler it
#   builds gets only `num_replicas`, `rank` and `shuffle`: `ignite/distributed/auto.py`,
#   line 103 in ignite 0.5.5).
# - **`DistributedSampler(drop_last=True)`**: the sampler cuts the shuffled list down to
#   a multiple of N instead of padding it.
#
# First the loader's. Each rank has 51 samples in batches of 10 and drops 1, two
# samples in all. But the sampler's padding sits at the *end* of the shuffled list
# (`indices += indices[:padding_size]` in `torch/utils/data/distributed.py`), and the
# last of the 102 positions belongs to rank 1: what rank 1 drops is the repeated
# sample. So per epoch exactly **one** sample goes unseen, and the duplicate is gone:

# %%
dropped = shard_report(run_on_ranks(lambda r: collect_indices(small, batch_size=20, epochs=2,
                                                              drop_last=True), 2))
print(format_report(dropped))
for e, ep in enumerate(dropped["epochs"], 1):
    print(f"epoch {e}: {ep['per_rank']} samples per rank, {ep['missing']} unseen, {ep['duplicates']} seen twice")
assert all(ep["per_rank"] == [50, 50] for ep in dropped["epochs"]) and dropped["ok"]
assert all(ep["missing"] == 1 and ep["duplicates"] == 0 for ep in dropped["epochs"])
assert dropped["expected"]["padding_seen"] == 0 and dropped["expected"]["unseen"] == 1  # as printed

# %% [markdown]
# Then the sampler's, which needs no processes: build the two samplers directly.

# %%
from torch.utils.data.distributed import DistributedSampler

cut = [list(DistributedSampler(small, num_replicas=2, rank=r, drop_last=True)) for r in range(2)]
padded = [list(DistributedSampler(small, num_replicas=2, rank=r)) for r in range(2)]
for name, shards in (("DistributedSampler()", padded), ("DistributedSampler(drop_last=True)", cut)):
    seen = shards[0] + shards[1]
    print(f"{name:35} {[len(s) for s in shards]} per rank, {len(set(seen))} distinct of {len(small)}, "
          f"{len(seen) - len(set(seen))} seen twice")
assert [len(s) for s in cut] == [50, 50] and len(set(cut[0] + cut[1])) == 100
assert [len(s) for s in padded] == [51, 51] and len(set(padded[0] + padded[1])) == 101

# %% [markdown]
# ## 3. Any map-style dataset, and a planted bug
#
# The check needs nothing from the kit's datasets: anything with `__len__` and a
# `__getitem__` returning `(x, y, ...)` works. Here is a dataset the kit has never seen,
# 50 samples on 3 ranks (50 = 3 × 17 − 1: one padding duplicate):

# %%
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i * i


squares = shard_report(run_on_ranks(lambda r: collect_indices(Squares(), batch_size=6, epochs=2), 3))
print(format_report(squares))
assert squares["ok"] and squares["epochs"][0]["per_rank"] == [17, 17, 17]

# %% [markdown]
# Now a classic bug: a hand-made `DistributedSampler` whose rank is hard-coded to 0, so
# every process reads rank 0's shard. ignite notices the mismatch: `auto_dataloader`
# calls `warnings.warn("Found distributed sampler with rank=0, but process rank is 1")`
# on rank 1 (`ignite/distributed/auto.py`, line 94 in ignite 0.5.5). In a training log
# that is one line among many, easy to miss; here the cell catches it and prints it, so
# that the warning you see below is *caused by the planted bug*. The check fails loudly
# instead:

# %%
import warnings


def buggy(local_rank):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = collect_indices(small, batch_size=20, epochs=2, sampler=rank_zero_sampler(small))
    for w in caught:
        print(f"rank {local_rank}: ignite warned: {w.message}")
    return record


bad_record = run_on_ranks(buggy, 2)
bad = shard_report(bad_record)
print(format_report(bad))
assert not bad["ok"] and bad["epochs"][0]["overlap_beyond_padding"] == 50
plots.sharding_map(bad_record);

# %% [markdown]
# Both ranks trained on the same 51 samples, and the other 50 were never seen: the
# picture is all black and white. Nothing else in training would have told you: the loss
# still goes down.
#
# ## 4. From the command line: `distkit shard-check`
#
# The same check, with a dataset of N indices, for a course or a CI job. It exits 1 when
# the shards overlap beyond the padding (or miss samples beyond what `--drop-last`
# explains):

# %%
def shard_check(*args):
    done = subprocess.run([sys.executable, "-m", "distkit", "shard-check", *map(str, args)],
                          capture_output=True, text=True, timeout=180)
    print(f"$ distkit shard-check {' '.join(map(str, args))}   (exit code {done.returncode})")
    print(done.stdout.strip() or done.stderr.strip(), "\n")
    return done.returncode


assert shard_check("--dataset-size", 1001, "--nproc-per-node", 3, "--batch-size", 30, "--drop-last") == 0
assert shard_check("--dataset-size", 100, "--nproc-per-node", 2, "--plant-overlap") == 1

# %% [markdown]
# ## 5. Validation: the padding changes the metrics
#
# For training, one repeated sample per epoch is harmless. For **validation** it is a
# wrong number: ignite's metrics (`Accuracy`, `Loss`) sum over every batch each rank
# saw and all-reduce the sums at `compute()`, so the padded duplicate is counted too, and
# the metric moves with the world size. A small model with BatchNorm, trained for a
# moment in this process, is evaluated on 101 digits: once in this process, then with
# `create_supervised_evaluator` on 2 and 3 processes over `idist.auto_dataloader`'s
# loader, and over the kit's `distkit.data.validation_loader`, which gives each rank
# every N-th sample unpadded (in the same number of batches on every rank, so a DDP
# model's buffer broadcast in `forward` never waits on a rank that has finished). A
# `Metric` with `sync_all_reduce` counts the samples the metrics saw.

# %%
from ignite.engine import create_supervised_evaluator
from ignite.metrics import Accuracy, Loss, Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce

from distkit.data import validation_loader


class SampleCount(Metric):
    @reinit__is_reduced
    def reset(self):
        self._count = torch.tensor(0.0, dtype=torch.float64)

    @reinit__is_reduced
    def update(self, output):
        self._count += len(output[1])

    @sync_all_reduce("_count")
    def compute(self):
        return int(self._count.item())

# %%
torch.manual_seed(0)  # the small model with BatchNorm, trained for a moment in this process
net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32),
                          torch.nn.ReLU(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
train_x = torch.stack([digits[i][0] for i in range(200, 1000)])
train_y = torch.stack([digits[i][1] for i in range(200, 1000)])
for step in range(40):  # a few plain steps: a model that is right about 80-90% of the time
    batch = slice(step % 40 * 20, step % 40 * 20 + 20)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(train_x[batch]), train_y[batch]).backward()
    opt.step()
net.eval()

# %%
val101 = Subset(digits, range(101))


def evaluate(loader_kind):
    loader = (idist.auto_dataloader(val101, batch_size=32, shuffle=False) if loader_kind == "ignite"
              else validation_loader(val101, batch_size=32))
    metrics = {"accuracy": Accuracy(), "loss": Loss(torch.nn.CrossEntropyLoss()), "count": SampleCount()}
    return create_supervised_evaluator(net, metrics=metrics).run(loader).metrics


one = evaluate("kit")  # in this process: no process group, plain loader
rows = {(1, "-"): one}
for world in (2, 3):
    for kind in ("ignite", "kit"):
        rows[(world, kind)] = run_on_ranks(lambda r: evaluate(kind), world)
print(f"{'processes':>9}  {'loader':7} {'samples':>7} {'accuracy':>9} {'loss':>9}  accuracy - 1 process")
for (world, kind), m in rows.items():
    print(f"{world:9d}  {kind:7} {m['count']:7d} {m['accuracy']:9.5f} {m['loss']:9.5f}  "
          f"{m['accuracy'] - one['accuracy']:+.5f}")

# %% [markdown]
# With `auto_dataloader` the metrics count 102 samples on 2 processes and on 3 (101 is
# padded up to a multiple of the world size), and the values differ from one process's
# whenever a repeated sample is scored differently from the average; with the kit's loader
# every world size counts 101 and matches the single process to rounding. `distkit.training`
# validates with `validation_loader`. The next cell checks the table.

# %%
assert one["count"] == 101
for world in (2, 3):
    assert rows[(world, "ignite")]["count"] == 102
    kit = rows[(world, "kit")]
    assert kit["count"] == 101
    assert abs(kit["accuracy"] - one["accuracy"]) < 1e-9 and abs(kit["loss"] - one["loss"]) < 1e-6
print("the kit's loader counts every sample once and matches 1 process; ignite's default counts 102")

# %% [markdown]
# ## What you saw
#
# - `auto_dataloader` divides the global batch and the workers, inserts a
#   `DistributedSampler` per rank and sets `pin_memory` only on CUDA; a global batch that
#   does not divide by the world size silently loses its remainder.
# - Shards are disjoint except for the padding `DistributedSampler` adds to give every
#   rank the same number of steps. The loader's `drop_last` (what `auto_dataloader`
#   sets) drops each rank's incomplete batch; the sampler's `drop_last` trims instead
#   of padding.
# - The order changes between epochs only when `set_epoch` is called.
- In validation the padding is counted: 101 samples scored as 102 on 2 and 3
  processes. `distkit.data.validation_loader` shards without padding and keeps the
  batch count equal on every rank, so the metrics equal one process's.
# - A sampler bug trains on a fraction of the data without any error: the gathered
#   indices show it, and `distkit shard-check` exits non-zero.
#
# Next: [06 · Profiling handlers](06_profiling_handlers.ipynb), where the time goes.
