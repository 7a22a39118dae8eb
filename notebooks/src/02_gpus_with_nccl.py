# %% [markdown]
# # 02 · GPUs with nccl
#
# The code of [notebook 01](01_processes_and_ranks.ipynb), unchanged, on NVIDIA GPUs:
# one process per GPU, connected by **nccl** (NVIDIA's collective library, which moves
# data GPU to GPU) instead of gloo. You will see
#
# 1. which device each process gets, and where the model and the batches end up;
# 2. what copying data between host memory and the GPU costs, measured;
# 3. what asking for more processes than GPUs does: a clear error, not a hang.
#
# Hardware: an NVIDIA GPU (in Colab: *Runtime → Change runtime type → GPU*). Without one,
# every cell runs its CPU equivalent (gloo, 2 processes), so the notebook still runs top
# to bottom; the cell below says which one you got.

# %%
import time

import distkit  # first: it makes torch's GPU check safe for the processes forked below
import ignite.distributed as idist
import torch

from distkit.lessons import collectives
from distkit.config import Config
from distkit.errors import DistkitError
from distkit.preflight import preflight
from distkit.runner import run_per_rank

gpus = torch.cuda.device_count()  # asks the driver (NVML); CUDA itself stays untouched here
backend, nproc = ("nccl", gpus) if gpus else ("gloo", 2)
if gpus:
    print(f"{gpus} GPU(s): backend nccl, {nproc} process(es)")
else:
    print("No GPU on this runtime: the cells below run their CPU equivalent (gloo, 2 processes).")

# %% [markdown]
# **One rule first.** In a notebook, `idist.Parallel` starts the processes by *forking*
# this kernel. A forked process cannot use CUDA if its parent already did, so this
# notebook never touches the GPU in the kernel itself: every measurement runs inside the
# processes. (`distkit.runner.run_per_rank` refuses to fork once CUDA is
# initialised here, and says so.)
#
# ## 1. One process per GPU
#
# Same function as in notebook 01; only the backend changed.

# %%
seen = run_per_rank(collectives.process_info, nproc, backend)
for info in seen:
    print({k: info[k] for k in ("rank", "local_rank", "world_size", "backend", "device", "device_name")})
expected_devices = [f"cuda:{r}" for r in range(nproc)] if gpus else ["cpu"] * nproc
assert [i["device"] for i in seen] == expected_devices
assert all(i["backend"] == backend for i in seen)

# %% [markdown]
# With nccl, `idist.device()` is `cuda:<local rank>`: process *k* owns GPU *k*. That is
# why the local rank matters on a multi-GPU machine.
#
# ## 2. Where things live, and what the `auto_*` helpers did
#
# Each process builds a data loader, a model and an optimizer the plain way and passes
# them through ignite's three `auto_*` helpers. The function below is the whole
# experiment; each rank returns what the helpers handed back:

# %%
from distkit.data import synthetic_dataset
from distkit.models import get_model


def place(local_rank):
    data = synthetic_dataset(64)                       # 64 samples in host memory
    loader = idist.auto_dataloader(data, batch_size=16, shuffle=True)  # 16 = the GLOBAL batch
    plain_model = get_model("mlp")
    model = idist.auto_model(plain_model)
    plain_optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = idist.auto_optim(plain_optimizer)
    x, y = next(iter(loader))
    return {
        "rank": idist.get_rank(), "device": str(idist.device()),
        "loader": f"{type(loader).__name__}, sampler {type(loader.sampler).__name__}, "
                  f"{len(loader)} batches of {len(y)}",
        "model": f"{type(plain_model).__name__} -> {type(model).__name__}",
        "param_device": str(next(model.parameters()).device),
        "batch_device": str(x.to(idist.device()).device),
        "optimizer": f"{type(plain_optimizer).__name__} -> {type(optimizer).__name__}, "
                     f"same object: {optimizer is plain_optimizer}",
        "per_process_batch": len(y),
    }


for r in run_per_rank(place, nproc, backend):
    print(r)
    assert r["param_device"] == r["batch_device"] == r["device"]  # model and data on one device
    assert r["per_process_batch"] == 16 // nproc                  # the global batch, divided
    assert r["model"].endswith("DistributedDataParallel" if nproc > 1 else "MLP")
    assert r["optimizer"].endswith("same object: True")

# %% [markdown]
# - `auto_dataloader` gave each process a `DistributedSampler` (its own shard of the
#   data) and divided the **global** batch of 16 by the number of processes.
# - `auto_model` moved the model to this process's device and, with more than one
#   process, wrapped it in `DistributedDataParallel`, which averages the gradients
#   across processes during `backward()`. With a single process there is nothing to
#   average, and it only moves the model.
# - `auto_optim` returned the very same optimizer object (checked above): with gloo and
#   nccl, DDP already did the distributed part (on TPUs it does more: notebook 03).
# - The batch comes out of the loader in host memory; `x.to(idist.device())` moves it.
#
# ## 3. The cost of host ↔ device copies
#
# Every batch starts in host memory and must be copied to the GPU. Each process times
# copies of 1, 16 and 64 MB to its device and back (on CUDA from *pinned*, page-locked,
# memory, which the GPU can read directly, and from ordinary *pageable* memory).

# %%
rows = []
for r in run_per_rank(collectives.rank_copy_bandwidth, nproc, backend):
    for row in r["rows"]:
        rows.append(row)
        print(f"rank {r['rank']} {row['device']:>6} {'pinned' if row['pinned'] else 'pageable':8} "
              f"{row['megabytes']:3d} MB: to device {row['host_to_device_ms']:7.2f} ms "
              f"({row['host_to_device_GBps']:5.1f} GB/s), back {row['device_to_host_ms']:7.2f} ms")
best = max(row["host_to_device_GBps"] for row in rows if row["megabytes"] == 16)
cifar_batch_mb = 256 * 3 * 32 * 32 * 4 / 2**20
print(f"a CIFAR-10 batch of 256 images ({cifar_batch_mb:.0f} MB) takes about "
      f"{cifar_batch_mb / 1024 / best * 1e3:.2f} ms to copy at the best 16 MB rate above")

# %% [markdown]
# On a GPU, the copy is a real cost per step: compare it with the time of a training
# step in notebook 04. That is why `distkit` asks for `pin_memory=True` on CUDA and
# copies with `non_blocking=True`: the copy from pinned memory can overlap with compute.
# On the CPU the "copy" is an ordinary memory copy by one thread, shown only so that
# the cell runs everywhere; it is not a bound on GPU transfers (pinned copies over a
# PCIe Gen4 or Gen5 link can be faster than one CPU thread copying memory).
#
# ## 4. More processes than GPUs: a clear error, not a hang
#
# nccl needs one GPU per process. Asking for one more than there are is refused before
# any process starts, in one line that says what to do:

# %%
start = time.perf_counter()
try:
    preflight(Config(backend="nccl", nproc_per_node=gpus + 1), spawning=True)
    raise AssertionError("preflight should have refused")
except DistkitError as e:
    message = str(e)
print(f"DistkitError after {time.perf_counter() - start:.3f} s: {message}")
assert "\n" not in message and ("GPUs" in message or "CUDA" in message)

# %% [markdown]
# (Without a GPU the message says that nccl needs CUDA at all; with 1 GPU it says that
# `--nproc-per-node 2` needs 2 GPUs.) Without this check the processes would start, and
# each would fail on its own: right after creating the process group ignite calls
# `torch.cuda.set_device(local_rank)` (`ignite/distributed/comp_models/native.py`,
# line 137 in ignite 0.5.5), and local rank 1 on a machine with one GPU fails there
# with CUDA's "invalid device ordinal", after the processes have been started.
#
# ## 5. The collectives, on GPU tensors
#
# Finally, notebook 01's collectives, with the tensors created on each process's device
# (`idist.device()`: `cuda:<local rank>` with nccl). nccl only moves GPU tensors; gloo
# takes CPU tensors. The values you predicted there still hold.

# %%
def exchange(local_rank):
    rank, device = idist.get_rank(), idist.device()
    total = idist.all_reduce(torch.tensor([rank + 1.0], device=device))
    gathered = idist.all_gather(torch.tensor([10.0 * rank], device=device))
    received = idist.broadcast(torch.tensor([100.0 if rank == 0 else -1.0], device=device), src=0)
    idist.barrier()
    return {"rank": rank, "device": str(total.device), "sum": total.item(),
            "gathered": gathered.tolist(), "broadcast": received.item()}


for s in run_per_rank(exchange, nproc, backend):
    print(s)
    assert s["sum"] == nproc * (nproc + 1) / 2 and s["broadcast"] == 100.0
    assert s["gathered"] == [10.0 * r for r in range(nproc)]
    assert s["device"] == (f"cuda:{s['rank']}" if gpus else "cpu")

# %% [markdown]
# ## What you saw
#
# - Going from CPU to GPUs changed one word: the backend. Each process got its own
#   device from its local rank, and the `auto_*` helpers put model and data on it.
# - Host → device copies cost time you can now measure; pinned memory and non-blocking
#   copies hide part of it.
# - Too many processes for the GPUs fails fast with a message, before anything starts.
#
# Next: [03 · TPUs with XLA](03_tpus_with_xla.ipynb).
