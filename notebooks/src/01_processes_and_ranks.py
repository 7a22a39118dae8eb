# %% [markdown]
# # 01 · Processes and ranks (CPU, gloo)
#
# Data-parallel training runs **the same program in several processes**. Each process
# trains a full copy of the model on its own slice of the data, and the processes talk
# to each other only through a few *collective* operations. This notebook shows, on
# nothing but a CPU:
#
# 1. how `idist.Parallel` starts N processes and what each one knows about itself
#    (rank, local rank, world size, backend, device);
# 2. the four collectives training relies on (`all_reduce`, `all_gather`, `broadcast`,
#    `barrier`), with values you can predict before you run them;
# 3. `one_rank_first`, so that only one process downloads a dataset;
# 4. what happens when processes outnumber the cores, measured on this runtime.
#
# Hardware: any CPU. Backend: `gloo`, PyTorch's CPU backend.

# %%
import os

import ignite
import ignite.distributed as idist
import torch

from distkit import plots
from distkit.lessons import collectives

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"torch {torch.__version__}, ignite {ignite.__version__}, "
      f"{cores} CPU cores, backends here: {idist.available_backends()}")

# %% [markdown]
# ## 1. Starting processes with `idist.Parallel`
#
# `idist.Parallel(backend, nproc_per_node=N)` starts N processes on this machine, connects
# them with the backend, and calls your function in each one with its **local rank** as
# first argument. In a notebook the processes are *forked* from this kernel, so the
# function may be defined right here; their `print`s appear below the cell.

# %%
def hello(local_rank):
    print(f"I am rank {idist.get_rank()} of {idist.get_world_size()} "
          f"(local rank {local_rank}, backend {idist.backend()}, device {idist.device()})", flush=True)


with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
    parallel.run(hello)

# %% [markdown]
# The lines may come in any order: the processes run at the same time. To *use* what each
# process computed, `distkit.lessons.collectives.run_per_rank(fn, N)` runs `fn` the same way and
# hands back each rank's return value, in rank order. Here is what 1, 2 and 4 processes
# report about themselves:

# %%
for n in (1, 2, 4):
    seen = collectives.run_per_rank(collectives.process_info, nproc_per_node=n)
    for info in seen:
        print({k: info[k] for k in ("rank", "local_rank", "world_size", "backend", "device", "pid")})
    assert [i["rank"] for i in seen] == list(range(n))          # ranks are 0 .. N-1
    assert all(i["world_size"] == n and i["backend"] == "gloo" for i in seen)
    assert len({i["pid"] for i in seen}) == n                   # N separate processes
    print()

# %% [markdown]
# - **rank**: this process's number among *all* processes, 0 to world size − 1. Rank 0
#   usually does the talking (logging, saving files).
# - **local rank**: its number among the processes *on this machine*. Equal to the rank on
#   a single machine; on several machines it picks the GPU a process uses.
# - **world size**: how many processes take part, across all machines.
# - **backend**: how they communicate: `gloo` (CPU), `nccl` (NVIDIA GPUs), `xla-tpu` (TPUs).
# - **device**: where this process computes; `cpu` here.
#
# ## 2. Collectives: the only way processes exchange data
#
# Every rank calls the *same* collective; each gets a result that depends on everybody's
# input. `collectives_demo` has rank *r* contribute:
#
# | collective | rank r gives | every rank gets, with N ranks |
# | --- | --- | --- |
# | `all_reduce` (sum) | r + 1 | 1 + 2 + … + N = N(N+1)/2 |
# | `all_reduce` (max) | r + 1 | N |
# | `all_gather` | 10·r | [0, 10, …, 10(N−1)] |
# | `broadcast(src=0)` | 100 on rank 0, −1 elsewhere | 100 |
# | `barrier` | rank 0 arrives 0.2 s late | everybody waits for it |
#
# Predict the values for N = 4, then run:

# %%
N = 4
seen = collectives.run_per_rank(collectives.collectives_demo, nproc_per_node=N)
expected = collectives.expected_collectives(N)
for s in seen:
    print(s)
    assert {k: s[k] for k in expected} == expected
assert all(s["waited_at_barrier_s"] > 0.15 for s in seen[1:]), "the barrier waited for rank 0"
print("expected on every rank:", expected)

# %% [markdown]
# Training uses exactly these: DistributedDataParallel **all-reduces the gradients**
# (sum, then divide by N) so every replica takes the same step; metrics such as accuracy
# all-reduce their counts so every rank reports the global value; `broadcast` sends
# rank 0's initial weights (or a run folder name) to the others; `barrier` makes the
# processes wait for each other, e.g. before reading a file rank 0 wrote.
#
# ## 3. `one_rank_first`: one download, not N
#
# If N processes download a dataset into the same folder at once, they overwrite each
# other's half-written files. Inside `with idist.one_rank_first():` rank 0 runs the block
# first while the others wait at a barrier; they enter only after it is done and find
# the files in place.

# %%
import tempfile

with tempfile.TemporaryDirectory() as folder:
    seen = collectives.run_per_rank(collectives.one_rank_first_demo, 4, "gloo", folder)
t0 = seen[0]["entered_at"]
for s in seen:
    print(f"rank {s['rank']}: in the block from +{s['entered_at'] - t0:.2f} s to "
          f"+{s['left_at'] - t0:.2f} s, found the file already: {s['found_file_already']}")
assert seen[0]["found_file_already"] is False                      # rank 0 downloaded
assert all(s["found_file_already"] for s in seen[1:])              # the others found it
assert all(s["entered_at"] >= seen[0]["left_at"] for s in seen[1:])  # ...after it was done

# %% [markdown]
# `distkit.data` uses `one_rank_first(local=True)` for MNIST and CIFAR-10: one download
# per machine.
#
# ## 4. More processes than cores
#
# Each process needs a core to run. Below, N processes each do the same fixed work
# (matrix products, one thread each) starting at the same moment; we time the first
# start to the last finish, for N = 1, the number of cores, and 2× and 4× that.

# %%
rows = collectives.oversubscription()
for r in rows:
    print(f"{r['processes']:3d} processes on {r['cores']} cores: {r['seconds']:.3f} s "
          f"({r['slowdown']:.2f}x the time alone), {r['matmuls_per_second']:.0f} products/s in total")
plots.oversubscription_plot(rows);

# %%
by_n = {r["processes"]: r for r in rows}
ratio = by_n[2 * cores]["seconds"] / by_n[cores]["seconds"]
gain = by_n[4 * cores]["matmuls_per_second"] / by_n[cores]["matmuls_per_second"]
print(f"{2 * cores} processes instead of {cores}: the same per-process work took {ratio:.2f}x as long")
print(f"{4 * cores} processes instead of {cores}: {gain:.2f}x the total work per second (4x the processes)")
assert ratio > 1.1, "beyond the core count, processes must share the cores"
assert gain < 2.5, "more processes than cores cannot do proportionally more work"

# %% [markdown]
# Up to the number of cores the processes run side by side. Beyond it they take turns:
# each one takes longer (first ratio above), and four times the processes do far less
# than four times the work (second ratio); on a quiet machine the total stays flat. (On
# a busy shared machine extra processes win a bigger share of the CPU from *other*
# programs, so the right-hand curve may still rise a little.)
#
# The same holds for **threads**: by default every PyTorch process starts one thread per
# core, so N processes run N × cores threads. That is why `distkit` gives each process
# `cores / N` threads (`torch.set_num_threads`), and why torchrun sets
# `OMP_NUM_THREADS=1`.
#
# ## What you saw
#
# - A distributed job is N copies of one program; `idist.Parallel` starts them and tells
#   each its **rank** (who am I), **world size** (how many are we), backend and device.
# - They cooperate only through collectives, whose results you could predict and which
#   the cells above checked.
# - `one_rank_first` serialises work that must happen once, such as a download.
# - More busy processes than cores buys no speed on this runtime: the measurement above.
#
# Next: [02 · GPUs with nccl](02_gpus_with_nccl.ipynb), the same code on GPUs.
