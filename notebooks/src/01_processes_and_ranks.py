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
# 4. what changes when the same code is a script instead of a notebook cell;
# 5. what happens when processes outnumber the cores, measured on this runtime;
# 6. the other backends `idist` speaks (Horovod, MPI), and why this notebook does not run them.
#
# Hardware: any CPU. Backend: `gloo`, PyTorch's CPU backend.

# %%
import logging
import os
import time

import ignite
import ignite.distributed as idist
import torch

from distkit import plots
from distkit.machine import cpu_only_processes, free_port
from distkit.lessons import collectives
from distkit.runner import run_per_rank

logging.getLogger("ignite.distributed.launcher.Parallel").setLevel(logging.WARNING)  # its INFO lines
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
built = idist.available_backends()  # compiled into this torch (and torch_xla), not all usable here
usable = [b for b in built if b != "nccl" or torch.cuda.device_count() > 0]  # nccl needs a visible GPU
print(f"torch {torch.__version__}, ignite {ignite.__version__}, {cores} CPU cores, "
      f"backends built in: {built}, usable here: {usable} (`distkit doctor` lists both)")

# %% [markdown]
# ## 1. Starting processes with `idist.Parallel`
#
# `idist.Parallel(backend, nproc_per_node=N)` starts N processes on this machine, connects
# them with the backend, and calls your function in each one with its **local rank** as
# first argument. In a notebook the processes are *forked* from this kernel, so the
# function may be defined right here; their `print`s appear below the cell.
#
# Every launch in this kit passes `master_port`: the processes meet on that TCP port.
# ignite's default is a fixed 2222, which fails when anything else on this machine
# (another notebook, another user) holds it; `distkit.machine.free_port()` asks the
# operating system for a free one.
#
# And every gloo launch here runs inside `cpu_only_processes()` (from `distkit.machine`),
# which hides any GPU from the processes it starts. ignite puts each process on GPU
# *local rank* whenever CUDA is available, gloo included (`torch.cuda.set_device` in
# `ignite/distributed/comp_models/native.py`): on a runtime with one GPU, the process of
# local rank 1 would fail with "invalid device ordinal" (notebook 02 explains it). These are
# CPU lessons; on a CPU-only machine the block changes nothing.

# %%
def hello(local_rank):
    # one write per line (end=""), so lines of different processes do not interleave
    print(f"I am rank {idist.get_rank()} of {idist.get_world_size()} (local rank {local_rank}, "
          f"backend {idist.backend()}, device {idist.device()})\n", end="", flush=True)


with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=2, master_port=free_port()) as parallel:
    parallel.run(hello)

# %% [markdown]
# The lines may come in any order: the processes run at the same time. `parallel.run`
# returns nothing: a spawned process cannot hand a value back through it. To *use* what
# each process computed, `distkit.runner.run_per_rank(fn, N)` makes the same
# `idist.Parallel(backend, nproc_per_node=N, master_port=free_port())` call, has each
# rank pickle `fn`'s return value into a file, and reads the files back in rank order.
# Here is what 1, 2 and 4 processes report about themselves (`collectives.process_info`
# calls `idist.get_rank()`, `get_world_size()`, `get_nproc_per_node()`, `backend()` and
# `device()`):

# %%
for n in (1, 2, 4):
    seen = run_per_rank(collectives.process_info, nproc_per_node=n)
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
# input. In the function below rank *r* contributes:
#
# | collective | rank r gives | every rank gets, with N ranks |
# | --- | --- | --- |
# | `idist.all_reduce` (sum) | r + 1 | 1 + 2 + … + N = N(N+1)/2 |
# | `idist.all_reduce(op="MAX")` | r + 1 | N |
# | `idist.all_gather` | 10·r | [0, 10, …, 10(N−1)] |
# | `idist.broadcast(src=0)` | 100 on rank 0, −1 elsewhere | 100 |
# | `idist.barrier()` | rank 0 arrives 0.2 s late | everybody waits for it |
#
# Predict the values for N = 4, then run. Each rank checks its own results with
# `assert`; a failed assertion in any process fails the cell.

# %%
def exchange(local_rank):
    rank, n = idist.get_rank(), idist.get_world_size()
    total = idist.all_reduce(torch.tensor([rank + 1.0]))
    biggest = idist.all_reduce(torch.tensor([rank + 1.0]), op="MAX")
    gathered = idist.all_gather(torch.tensor([10.0 * rank]))
    received = idist.broadcast(torch.tensor([100.0 if rank == 0 else -1.0]), src=0)
    before = time.perf_counter()
    if rank == 0:
        time.sleep(0.2)  # rank 0 is late; the barrier makes everybody wait for it
    idist.barrier()
    waited = time.perf_counter() - before
    print(f"rank {rank}: sum {total.item()}, max {biggest.item()}, gathered {gathered.tolist()}, "
          f"broadcast {received.item()}, waited {waited:.2f} s at the barrier\n", end="", flush=True)
    assert total.item() == n * (n + 1) / 2 and biggest.item() == n
    assert gathered.tolist() == [10.0 * r for r in range(n)] and received.item() == 100.0
    assert rank == 0 or waited > 0.15, "the barrier waited for rank 0"
    return {"rank": rank, "sum": total.item(), "gathered": gathered.tolist(), "waited_s": waited}


N = 4
with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=N, master_port=free_port()) as parallel:
    parallel.run(exchange)

# %% [markdown]
# The same function, through `run_per_rank`, hands its return values to this kernel:

# %%
seen = run_per_rank(exchange, N)
for s in seen:
    print(s)
assert [s["sum"] for s in seen] == [N * (N + 1) / 2] * N

# %% [markdown]
# Beyond tensors and numbers, the two differ. `idist.all_gather` takes any Python object
# that pickles (a dict here; `all_gather_object` underneath) and returns the list of every
# rank's. `idist.broadcast` takes a tensor, a number or a string (training uses a string
# to share a run folder's name), but not a dict: it raises `TypeError`.

# %%
def objects(local_rank):
    rank = idist.get_rank()
    everyone = idist.all_gather({"rank": rank})  # a dict from every rank, as a list
    folder = idist.broadcast("runs/ddp-gloo-2" if rank == 0 else "", src=0)  # a string: fine
    try:
        idist.broadcast({"folder": folder}, src=0)
        refused = None
    except TypeError as error:
        refused = f"{type(error).__name__}: {error}"
    return everyone, folder, refused


for rank, (everyone, folder, refused) in enumerate(run_per_rank(objects, 2)):
    print(f"rank {rank}: all_gather -> {everyone}, broadcast of a string -> {folder!r}, "
          f"broadcast of a dict -> {refused}")
    assert everyone == [{"rank": 0}, {"rank": 1}] and folder == "runs/ddp-gloo-2"
    assert refused == "TypeError: Unhandled input type <class 'dict'>"

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


def download_once(local_rank, folder):
    path = os.path.join(folder, "dataset.bin")
    with idist.one_rank_first():  # rank 0 first; the others after its block (a barrier)
        entered = time.time()
        found = os.path.exists(path)
        if not found:
            time.sleep(0.3)  # "downloading"
            with open(path + ".tmp", "wb") as f:
                f.write(b"\0" * 1024)
            os.replace(path + ".tmp", path)  # appears whole, or not at all
        left = time.time()
    return {"rank": idist.get_rank(), "found_file_already": found, "entered_at": entered, "left_at": left}


with tempfile.TemporaryDirectory() as folder:
    seen = run_per_rank(download_once, 4, "gloo", folder)
t0 = seen[0]["entered_at"]
for s in seen:
    print(f"rank {s['rank']}: in the block from +{s['entered_at'] - t0:.2f} s to "
          f"+{s['left_at'] - t0:.2f} s, found the file already: {s['found_file_already']}")
assert seen[0]["found_file_already"] is False                      # rank 0 downloaded
assert all(s["found_file_already"] for s in seen[1:])              # the others found it
assert all(s["entered_at"] >= seen[0]["left_at"] for s in seen[1:])  # ...after it was done

# %% [markdown]
# `distkit.data` uses `one_rank_first(local=True)` for MNIST and CIFAR-10: local rank 0
# of **each machine** goes first. That is right when every machine downloads into its own
# disk. On a file system shared by the machines (NFS, a cluster's home directory) it is
# wrong: local rank 0 of every node downloads into the same folder at once, the race
# this block exists to prevent. There, use `one_rank_first()` (global rank 0 only), or
# download before launching (exercise 04 is about this race).
#
# ## 4. In a script instead of a notebook
#
# Here `idist.Parallel` forks the kernel, so the children already have `exchange`:
# ignite picks `start_method="fork"` when it finds itself under IPython and `"spawn"`
# everywhere else (`ignite/distributed/comp_models/native.py`, lines 384-388 in ignite
# 0.5.5; Windows has no fork at all). In a script the processes are *spawned*: each
# child starts a fresh Python, imports your file, and looks the function up by name.
# So in a script the function must be defined at the top level of an importable
# module, and the launch must sit under `if __name__ == "__main__":`, or each child
# importing the file would launch again. This one runs the collectives with
# `start_method="spawn"` (its default there, written out):

# %%
import subprocess
import sys
import textwrap

script = textwrap.dedent("""
    import ignite.distributed as idist
    import torch


    def exchange(local_rank):
        total = idist.all_reduce(torch.tensor([idist.get_rank() + 1.0]))
        if idist.get_rank() == 0:
            print(f"sum over {idist.get_world_size()} spawned ranks: {total.item()}")


    if __name__ == "__main__":  # spawned children import this file: they must not launch again
        import sys

        from distkit.machine import cpu_only_processes

        with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=2, start_method="spawn",
                                                  master_port=int(sys.argv[1])) as parallel:
            parallel.run(exchange)
""")
with tempfile.TemporaryDirectory() as folder:
    with open(os.path.join(folder, "collectives_script.py"), "w") as f:
        f.write(script)
    done = subprocess.run([sys.executable, "collectives_script.py", str(free_port())], cwd=folder,
                          capture_output=True, text=True, timeout=180)
print(script)
print("output:", done.stdout.strip())
assert done.returncode == 0 and "sum over 2 spawned ranks: 3.0" in done.stdout, done.stderr[-2000:]

# %% [markdown]
# ## 5. More processes than cores
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
print(f"{cores} processes on {cores} cores: {by_n[cores]['slowdown']:.2f}x the time of one alone")
print(f"{2 * cores} processes instead of {cores}: the same per-process work took {ratio:.2f}x as long")
print(f"{4 * cores} processes instead of {cores}: {gain:.2f}x the total work per second (4x the processes)")
assert ratio > 1.1, "beyond the core count, processes must share the cores"
assert gain < 2.5, "more processes than cores cannot do proportionally more work"

# %% [markdown]
# Beyond the number of cores the processes take turns: each one takes longer (first
# ratio above), and four times the processes do far less than four times the work
# (second ratio); on a quiet machine the total stays flat. Even *at* the core count
# the processes are not free: the printed time for N = cores is already some multiple
# of the time alone (ideally 1.0x), because they share memory bandwidth and caches, and
# because any other program on the machine takes a core away. On a busy shared
# machine extra processes also win a bigger share of the CPU from those other
# programs, so the right-hand curve may still rise a little.
#
# The same holds for **threads**: by default every PyTorch process starts one thread per
# core, so N processes run N × cores threads. That is why `distkit` gives each process
# `cores / N` threads (`torch.set_num_threads`), and why torchrun sets
# `OMP_NUM_THREADS=1`.
#
# ## 6. Horovod and MPI
#
# `idist` speaks two more communication layers than gloo, nccl and xla-tpu. The
# function you pass to `idist.Parallel` does not change; what changes is who starts
# the processes and what must be installed:
#
# - `backend="horovod"`: needs the `horovod` package built against this torch.
#   `idist.Parallel(backend="horovod", nproc_per_node=N)` starts the processes through
#   `horovod.run` instead of `torch.multiprocessing` (`ignite/distributed/comp_models/horovod.py`);
#   across machines you launch with `horovodrun -np 16 -H host1:8,host2:8 python main.py`
#   and `idist.Parallel(backend="horovod")` joins. `idist.all_reduce` becomes
#   `hvd.allreduce`, `all_gather` `hvd.allgather`, `broadcast` `hvd.broadcast` (the
#   same file). There is no DDP: `auto_model` only broadcasts rank 0's weights
#   (`hvd.broadcast_parameters`, `ignite/distributed/auto.py` line 228) and
#   `auto_optim` wraps the optimizer in `hvd.DistributedOptimizer`, which averages the
#   gradients (line 280).
# - `backend="mpi"`: torch's own MPI process group, available only in a torch built
#   from source against an MPI library (the pip and conda wheels are not). The
#   processes are started by `mpirun -np N python main.py`; `idist.Parallel` joins
#   them and does not spawn.
#
# Neither runs here, for the reason this cell prints: neither is installed.

# %%
import importlib.util

import torch.distributed as dist

print(f"idist.available_backends(): {idist.available_backends()}")
print(f"torch built with MPI: {dist.is_mpi_available()}; horovod installed: "
      f"{importlib.util.find_spec('horovod') is not None}")

# %% [markdown]
# ## What you saw
#
# - A distributed job is N copies of one program; `idist.Parallel` starts them and tells
#   each its **rank** (who am I), **world size** (how many are we), backend and device.
# - They cooperate only through collectives, whose results you could predict and which
#   the cells above checked.
# - `one_rank_first` serialises work that must happen once, such as a download; with
#   `local=True`, once per machine, which is once too many on a shared file system.
# - A script spawns instead of forking: an importable function and a `__main__` guard.
# - More busy processes than cores buys no speed on this runtime: the measurement above.
#
# Next: [02 · GPUs with nccl](02_gpus_with_nccl.ipynb), the same code on GPUs.
