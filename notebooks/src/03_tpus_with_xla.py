# %% [markdown]
# # 03 · TPUs with XLA
#
# The same code again, now with the **`xla-tpu`** backend on Google TPUs. A TPU does not
# run PyTorch operations one by one: **torch-xla** records them lazily into a graph,
# which the XLA compiler compiles and the TPU runs, when the program asks for a result
# or marks a step (`torch_xla.sync()`, also known as `xm.mark_step()`).
#
# Hardware: a TPU runtime (in Colab: *Runtime → Change runtime type → TPU*). On any other
# runtime this notebook still runs: it explains each TPU step, shows the evidence that
# needs no TPU (ignite's own source, and the same effect with gloo on the CPU), and
# skips each TPU cell with a one-line reason.
#
# The next cell installs torch-xla, only on a TPU runtime that lacks it, the way
# torch-xla's own instructions say today (2.9: `pip install torch==2.9.0
# 'torch_xla[tpu]==2.9.0'`; the `[tpu]` extra brings `libtpu` from PyPI).

# %%
import importlib
import importlib.util
import subprocess
import sys

from distkit.compat import tpu_chips  # reads the PCI bus: no torch, no torch_xla needed

chips = tpu_chips()
if chips and importlib.util.find_spec("torch_xla") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "torch==2.9.0", "torchvision==0.24.0",
                    "torch_xla[tpu]==2.9.0"], check=True)
    importlib.invalidate_caches()
    print("Installed torch 2.9.0 + torch-xla 2.9.0. If torch was already imported in this session, "
          "restart it (Runtime → Restart session) and run the notebook again.")
HAS_XLA = importlib.util.find_spec("torch_xla") is not None
ON_TPU = bool(chips) and HAS_XLA
print(f"TPU chips on this machine: {chips or 'none'}; torch_xla installed: {HAS_XLA}")
if not ON_TPU:
    print("No TPU on this runtime: the TPU cells below skip, each saying so; the other cells run.")

# %% [markdown]
# **Older tutorials** (and ignite's upstream TPU examples) set `XRT_TPU_CONFIG` or
# `COLAB_TPU_ADDR` and download `pytorch-xla-env-setup.py`. That is XRT, torch-xla's old
# runtime, last shipped in torch-xla 2.1. Today's runtime is **PJRT**, selected with
# `PJRT_DEVICE=TPU` (torch-xla sets it itself when it finds a TPU); none of the XRT
# variables does anything any more.
#
# **ignite 0.5.5 and torch-xla 2.9 need four repairs**, which `import distkit` applies
# (`distkit.compat`, each only where the problem is present, so they switch themselves
# off once fixed upstream):
#
# | shim | what breaks without it |
# | --- | --- |
# | `xla_rank_and_world_size` | ignite calls `xm.xrt_world_size()` / `xm.get_ordinal()`, removed in torch-xla 2.7: with torch_xla merely installed, every `idist` call fails |
# | `xla_optimizer_init` | `idist.auto_optim` fails with `TypeError: super(type, obj)` |
# | `xla_pjrt_spawn` | `idist.Parallel(backend="xla-tpu", nproc_per_node=8)` fails: PJRT's `xmp.spawn` takes 1 or *all* devices (`nprocs=None`), and no master address/port |
# | `xla_lazy_context` | ignite's first `idist.get_rank()` starts the XLA runtime in the launching process, which then holds the TPU, and `xmp.spawn` refuses to start the replicas |

# %%
import os

if ON_TPU:
    os.environ.setdefault("PJRT_DEVICE", "TPU")

import distkit
from distkit.lessons import xla_pitfalls
from distkit.lessons.collectives import process_info
from distkit.runner import run_per_rank

print("shims applied by import distkit:", distkit.compat.APPLIED)
if ON_TPU:
    from distkit.preflight import default_nproc

    nproc = default_nproc("xla-tpu")  # every XLA device of this host, counted without opening the TPU
    print(f"{nproc} XLA device(s) on this host: {nproc} replica(s)")

# %% [markdown]
# ## 1. The same code on TPU cores
#
# What `idist.Parallel` needs for PJRT on a TPU (checked in torch-xla 2.9's
# `xmp.spawn`): `nproc_per_node` must be 1 (one device) or the number of XLA devices on
# the host (every device: torch-xla starts one process per chip, and on TPU v2/v3,
# which have two cores per chip, one thread per core); no `master_addr` / `master_port`
# (PJRT finds its peers itself); and the launching process must not use the TPU first.
# `distkit.preflight.default_nproc("xla-tpu")` counts the devices, and any other count is
# refused in one line before anything starts.

# %%
if not ON_TPU:
    print("skipped: needs a TPU runtime (Runtime → Change runtime type → TPU)")
else:
    import ignite.distributed as idist
    from distkit.lessons.multinode import show_env

    # The ignite call itself: one replica per XLA device, each printing what idist tells it.
    # No master_port: PJRT finds its peers itself (ignite's gloo/nccl launches need one).
    with idist.Parallel(backend="xla-tpu", nproc_per_node=nproc) as parallel:
        parallel.run(show_env, "tpu")
    # The same launch by distkit.runner.run_per_rank, which also hands each replica's
    # answers back here, so they can be checked:
    seen = run_per_rank(process_info, nproc, "xla-tpu")
    for info in seen:
        print({k: info[k] for k in ("rank", "local_rank", "world_size", "backend", "device")})
    assert [i["rank"] for i in seen] == list(range(nproc))
    assert all(i["world_size"] == nproc and i["device"].startswith("xla") for i in seen)

# %% [markdown]
# ## 2. Pitfall: replicas must start from the same weights
#
# Data parallelism assumes every replica holds the *same* model; the gradients are
# averaged, so replicas that start equal stay equal. A common habit breaks this:
# seeding each rank differently (`manual_seed(seed + rank)`, for varied data
# augmentation) *before* building the model. On gloo and nccl `auto_model` wraps the
# model in DistributedDataParallel, which copies rank 0's weights to everybody, and
# hides the mistake. Here it is on the CPU, with 2 gloo processes:

# %%
seen = run_per_rank(xla_pitfalls.initial_weights, 2, "gloo")
for s in seen:
    print(s)
assert seen[0]["before_auto_model"] != seen[1]["before_auto_model"]  # different models...
assert seen[0]["after_auto_model"] == seen[1]["after_auto_model"]    # ...made equal by DDP

# %% [markdown]
# On XLA, `auto_model` only moves the model to the device. ignite's source says which
# backends get DistributedDataParallel (read from the ignite installed here):

# %%
evidence = xla_pitfalls.ignite_source_evidence()
ddp_line = evidence["auto_model wraps in DDP (which broadcasts weights) only for these backends"]
print("\n".join(ddp_line))
assert ddp_line and "GLOO" in ddp_line[0] and "XLA" not in ddp_line[0]

# %%
if not ON_TPU:
    print("skipped: needs a TPU runtime; above, ignite's source shows that XLA gets no DDP")
else:
    for per_rank in (True, False):
        seen = run_per_rank(xla_pitfalls.initial_weights, nproc, "xla-tpu", seed_per_rank=per_rank)
        sums = [s["after_auto_model"] for s in seen]
        print(f"seed + rank: {per_rank}; auto_model returned {seen[0]['auto_model_returned']}; "
              f"weight checksums per replica after auto_model: {sums}")
        if nproc > 1:
            assert (len(set(sums)) == nproc) if per_rank else (len(set(sums)) == 1)

# %% [markdown]
# `distkit.training.initialize` therefore seeds **the same** generator on every rank
# right before building the model; seed per rank *after* that if you want varied
# augmentation. `distkit train` also records a SHA-256 of every replica's weights at the
# start and the end of a run (`results.json`, `replicas_identical`).
#
# ## 3. Pitfall: `create_supervised_trainer` + `auto_optim` reduce the gradients twice
#
# On XLA, ignite's `create_supervised_trainer` steps with `xm.optimizer_step`, which
# all-reduces the gradients and then calls `optimizer.step()`. The optimizer
# `auto_optim` returns on XLA does the same inside its own `step()`. Together, every
# step all-reduces the gradients twice. The values stay right (the mean of N equal means
# is that mean), but the step pays the communication twice. The two lines:

# %%
for what in ("create_supervised_trainer's step on XLA", "the optimizer auto_optim returns on XLA"):
    print(f"{what}:\n  " + "\n  ".join(evidence[what]))
    assert evidence[what] and "xm.optimizer_step(" in evidence[what][0]

# %%
if not ON_TPU:
    print("skipped: needs a TPU runtime (the CI runs this count on XLA:CPU: tests/test_xla.py)")
else:
    for s in run_per_rank(xla_pitfalls.gradient_reductions_per_step, nproc, "xla-tpu"):
        print(s)
        assert s["create_supervised_trainer"] == 2.0 and s["distkit.training.create_trainer"] == 1.0

# %% [markdown]
# `distkit.training.create_trainer` writes its step out: `optimizer.step()` (the
# `auto_optim` optimizer: one reduction) and `xm.mark_step()`. Use `auto_optim` *or*
# `xm.optimizer_step`, never both.
#
# ## 4. Pitfall: `MpDeviceLoader` moves graph dispatch into "data" time
#
# With more than one replica, `auto_dataloader` wraps the loader in torch-xla's
# `MpDeviceLoader`, which copies batches to the device in the background and, when it
# hands out the next batch, cuts the lazy graph (`torch_xla.sync()`). If the step itself
# did not cut it (torch-xla's own recipe: `xm.optimizer_step(optimizer)` without
# `barrier=True`), the previous step's graph is compiled and dispatched inside the
# *fetch* of the next batch, and a profiler reports compute as data-loading time.

# %%
print("\n".join(evidence["auto_dataloader on XLA with several replicas"]))
assert evidence["auto_dataloader on XLA with several replicas"]

# %%
if not ON_TPU:
    print("skipped: needs a TPU runtime (the CI measures this split on XLA:CPU: tests/test_xla.py)")
else:
    split = {mp: run_per_rank(xla_pitfalls.data_time_split, nproc, "xla-tpu", mp)[0] for mp in (True, False)}
    for mp, s in split.items():
        print(f"{'MpDeviceLoader' if mp else 'DataLoader + sync in the step':30}: data {s['data_ms']:.2f} ms, "
              f"step {s['compute_ms']:.2f} ms per iteration ({100 * s['data_share']:.0f}% in 'data')")
    assert split[True]["data_share"] > split[False]["data_share"]

# %% [markdown]
# distkit's step ends with `xm.mark_step()` and reads `loss.item()`, so the graph runs
# inside the step and the profiler's "data" time is data.
#
# ## 5. Training on the TPU
#
# The call of notebook 04, with the backend named (`auto` picks `xla-tpu` on a TPU).

# %%
if not ON_TPU:
    print("skipped: needs a TPU runtime; notebook 04 runs the same call on this runtime's backend")
else:
    from distkit.config import Config
    from distkit.launch import run
    import tempfile

    from distkit.reporting import run_summary

    results = run(Config(backend="xla-tpu", nproc_per_node=nproc, epochs=5, progress_bar=False,
                         output_dir=tempfile.mkdtemp(prefix="distkit-03-")))  # never into the repository
    print(run_summary(results))
    assert results["world_size"] == nproc and results["final"]["val_accuracy"] > 0.8

# %% [markdown]
# ## Several replicas need a real TPU
#
# torch-xla can also simulate devices on the CPU (`PJRT_DEVICE=CPU`). One replica works,
# and the CI proves the whole XLA path with it: `distkit train --backend xla-tpu
# --nproc-per-node 1` trains on XLA:CPU, and the counts and timings of sections 3 and 4
# are checked there (`tests/test_xla.py`). Several replicas on XLA:CPU
# (`CPU_NUM_DEVICES=2`) hang at their first all-reduce inside torch-xla itself (seen
# with torch-xla 2.9, even in a plain torch-xla program without ignite: the replicas
# wait for each other at two different all-reduces, and torch-xla aborts after 10 s).
# So everything with more than one replica is shown only on a real TPU, in the cells
# above.
#
# ## What you saw
#
# - The training code did not change: `xla-tpu` is one more backend for `idist`, and
#   `auto_model`, `auto_optim`, `auto_dataloader` adapt the objects to it.
# - What does change on XLA, and bites: nobody broadcasts the initial weights; gradient
#   reduction lives in the optimizer step, so do not add a second one; the lazy graph
#   runs where it is cut, which moves time between "data" and "compute".
#
# Next: [04 · The first distributed training](04_first_distributed_training.ipynb).
