# %% [markdown]
# # 04 · The first distributed training run
#
# Everything so far, put to work. First **you write the training function**:
# `training(local_rank, config)`, with ignite's `auto_dataloader`, `auto_model` and
# `auto_optim`, an `Engine`, the sampler's `set_epoch`, an evaluator with metrics and a
# best-model `Checkpoint`, run on 2 processes by `idist.Parallel`. Then the kit's own
# `distkit.training.training`, which is the same function grown up, under
# `idist.Parallel` and under **`torchrun`**; then one process, to compare accuracy and
# time per epoch.
#
# Hardware: any. The function you write runs on gloo with 2 CPU processes; the kit's
# runs use the best backend of this runtime (gloo on a CPU, nccl with one process per
# GPU, xla-tpu on a TPU). Dataset: scikit-learn's handwritten digits (1797 8×8 images,
# shipped inside scikit-learn: no download).

# %%
import os
import sys
import tempfile

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Engine, Events, create_supervised_evaluator
from ignite.handlers import Checkpoint, DiskSaver, global_step_from_engine
from ignite.metrics import Accuracy, ConfusionMatrix, Loss
from ignite.utils import manual_seed, setup_logger

import distkit
from distkit import plots
from distkit.data import digits_dataset, split
from distkit.lessons import cores
from distkit.launch import openmp_pool_forks_cleanly
from distkit.machine import cpu_only_processes, free_port, quiet_ignite_logs, threads_per_process
from distkit.models import get_model

quiet_ignite_logs()  # ignite's INFO lines about spawning and loader arguments
workdir = tempfile.mkdtemp(prefix="distkit-04-")  # every run of this notebook writes here, never into the repository
EPOCHS = 4
print(f"runs of this notebook go to {workdir}")

# %% [markdown]
# ## 1. The sampler: disjoint shards, padding, and `set_epoch`
#
# `idist.auto_dataloader(dataset, shuffle=True)` on N processes builds a
# `DistributedSampler(dataset, num_replicas=N, rank=rank, shuffle=True)`
# (`ignite/distributed/auto.py`, line 103 in ignite 0.5.5). Two facts about that
# sampler decide what each process trains on; here they are on the 1437 training
# images, for ranks 0 and 1, without starting any process:

# %%
from torch.utils.data.distributed import DistributedSampler

train_set, val_set = split(digits_dataset())
samplers = [DistributedSampler(train_set, num_replicas=2, rank=r, shuffle=True) for r in range(2)]
shards = [list(s) for s in samplers]
every = shards[0] + shards[1]
print(f"{len(train_set)} images, {len(shards[0])} per rank: {len(every)} drawn, "
      f"{len(set(every))} distinct, {len(every) - len(set(every))} drawn twice (padding)")
assert len(set(every)) == len(train_set) and len(every) - len(set(every)) == 1

again = list(samplers[0])  # a second epoch, nobody called set_epoch
samplers[0].set_epoch(1)
reshuffled = list(samplers[0])
print(f"rank 0, epoch 2 without set_epoch: same order as epoch 1: {again == shards[0]}")
print(f"rank 0, epoch 2 after set_epoch(1): same order: {reshuffled == shards[0]}, "
      f"{sum(a == b for a, b in zip(reshuffled, shards[0]))} of {len(reshuffled)} positions agree")
assert again == shards[0] and reshuffled != shards[0]

# %% [markdown]
# - The shards are disjoint **except for padding**: 1437 is odd, so the sampler repeats
#   one image to give both ranks 719 (the count printed above). Every image is seen.
# - The order is a permutation drawn from `seed + epoch`, and `epoch` changes only when
#   *you* call `sampler.set_epoch(epoch)`. ignite's `Engine` never calls it: the only
#   `set_epoch` in ignite 0.5.5 is in the optional helper
#   `setup_common_training_handlers(train_sampler=...)` of ignite's contrib package
#   (`ignite/contrib/engines/common.py`, line 280). Without it, every epoch repeats the
#   same order on every rank.
#
# ## 2. `training(local_rank, config)`, written out
#
# This is the whole program every process runs, in the shape of ignite's own examples:
# the data, the model and the validation each get a function, and `training` puts them
# together. The distributed part is the three `auto_*` calls, `set_epoch`, and
# `rank == 0` around what only one process should do.
#
# First the data and the model. `idist.auto_dataloader` gives each process a
# `DistributedSampler` over its shard, `idist.auto_model` wraps the model in
# `DistributedDataParallel` (with more than one process) and `idist.auto_optim` returns
# the optimizer as it is on CPUs and GPUs (on a TPU it would wrap it).

# %%
def get_dataflow(config):
    train_set, val_set = split(digits_dataset())  # a fixed split: identical in every process
    train_loader = idist.auto_dataloader(train_set, batch_size=config["batch_size"], shuffle=True)
    val_loader = idist.auto_dataloader(val_set, batch_size=2 * config["batch_size"], shuffle=False)
    return train_loader, val_loader


def initialize(config):
    manual_seed(config["seed"])  # same initial weights in every process
    model = idist.auto_model(get_model("cnn"))
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    return model, optimizer, nn.CrossEntropyLoss()


# %% [markdown]
# Validation after every epoch. The evaluator's metrics all-reduce their counts, so
# every rank gets the global accuracy; the best-model `Checkpoint` keeps the weights of
# the epoch with the best validation accuracy (its `score_function`); `DiskSaver` writes
# on rank 0 only. `setup_logger(distributed_rank=rank)` (in `training` below) gives rank
# 0 a handler and every other rank a `NullHandler`, so one process logs. Its lines go to
# `stream=sys.stdout`: the default, stderr, is shown by Jupyter in a red box, as if
# something had failed.

# %%
def attach_validation(trainer, model, criterion, val_loader, config, logger):
    metrics = {"accuracy": Accuracy(), "loss": Loss(criterion), "confusion": ConfusionMatrix(num_classes=10)}
    evaluator = create_supervised_evaluator(model, metrics=metrics, device=idist.device())
    history = []

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine):
        m = evaluator.run(val_loader).metrics
        history.append({"epoch": engine.state.epoch, "val_accuracy": m["accuracy"], "val_loss": m["loss"],
                        "epoch_time_s": engine.state.times["EPOCH_COMPLETED"]})
        logger.info(f"epoch {engine.state.epoch}: val accuracy {m['accuracy']:.4f}, val loss {m['loss']:.4f}")

    best = Checkpoint({"model": model}, DiskSaver(config["output_dir"], require_empty=False),
                      filename_prefix="best", n_saved=1, score_name="val_accuracy",
                      score_function=Checkpoint.get_default_score_fn("accuracy"),
                      global_step_transform=global_step_from_engine(trainer))
    evaluator.add_event_handler(Events.COMPLETED, best)
    return evaluator, history, best


# %% [markdown]
# And the program itself: the training step, the `Engine` that runs it, the reshuffle
# at every epoch, and the run. Spawned processes cannot *return* anything to the
# notebook through `idist.Parallel`, so rank 0 writes its results into
# `config["results"]`, a dict held by a `multiprocessing.Manager` process that the
# notebook reads afterwards.

# %%
def training(local_rank, config):
    rank = idist.get_rank()
    logger = setup_logger("training", distributed_rank=rank, stream=sys.stdout)
    torch.set_num_threads(config["threads"])
    train_loader, val_loader = get_dataflow(config)
    model, optimizer, criterion = initialize(config)
    device = idist.device()

    def train_step(engine, batch):
        model.train()
        x, y = batch[0].to(device), batch[1].to(device)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DistributedDataParallel all-reduces (averages) the gradients here
        optimizer.step()
        return loss.item()

    trainer = Engine(train_step)

    @trainer.on(Events.EPOCH_STARTED)
    def reshuffle(engine):
        train_loader.sampler.set_epoch(engine.state.epoch - 1)  # ignite's Engine never does this

    evaluator, history, best = attach_validation(trainer, model, criterion, val_loader, config, logger)
    trainer.run(train_loader, max_epochs=config["epochs"])

    if rank == 0:  # hand the results back to the notebook
        plain = getattr(model, "module", model)  # the model inside DDP: no collective on one rank
        x, y = next(iter(val_loader))
        with torch.no_grad():
            predicted = plain.eval()(x[:16].to(device)).argmax(1)
        config["results"].update(
            history=history, confusion=evaluator.state.metrics["confusion"].tolist(),
            best_checkpoint=str(best.last_checkpoint), world_size=idist.get_world_size(),
            per_rank_train_batches=len(train_loader), per_rank_val_images=len(val_loader.sampler),
            images=x[:16].tolist(), labels=y[:16].tolist(), predicted=predicted.tolist())

# %% [markdown]
# Run it on 2 processes. `idist.Parallel` starts them (here by forking this kernel, so a
# function defined in a cell works), initialises the gloo process group on
# `master_port`, and calls `training(local_rank, config)` in each. The port is a free
# one: ignite's default, 2222, fails if anything else on this machine holds it.

# %%
import multiprocessing

manager = multiprocessing.Manager()
# The processes are forked from this kernel: several threads each only if the kernel's
# OpenMP thread pool survives a fork (a forked child waits forever for pool threads that
# were not copied); distkit's own launcher applies the same rule (`launch.fork_threads`).
threads = threads_per_process(2) if openmp_pool_forks_cleanly() else 1
config = {"seed": 0, "batch_size": 64, "lr": 0.05, "epochs": EPOCHS, "threads": threads,
          "output_dir": os.path.join(workdir, "mine"), "results": manager.dict()}
# (cpu_only_processes: gloo processes on the CPU, even where a GPU is; notebook 01 says why)
with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=2, master_port=free_port()) as parallel:
    parallel.run(training, config)
mine = dict(config["results"])
manager.shutdown()
print(f"world size {mine['world_size']}: {mine['per_rank_train_batches']} training batches and "
      f"{mine['per_rank_val_images']} validation images per rank")
print("best checkpoint:", os.path.relpath(mine["best_checkpoint"], workdir), "->", os.listdir(config["output_dir"]))
assert len(os.listdir(config["output_dir"])) == 1  # n_saved=1: only the best epoch's file is kept

# %% [markdown]
# The log lines came from rank 0 only. The checkpoint's file name carries the epoch
# (`global_step_from_engine(trainer)`) and the score it was kept for.
#
# The validation metrics were computed over **all** ranks: each rank evaluated its own
# half of the 360 validation images, and `ConfusionMatrix`, like `Accuracy` and `Loss`,
# all-reduces its counts before `compute()`. The matrix below, from rank 0, counts
# every validation image:

# %%
import numpy as np

confusion = np.array(mine["confusion"])
print(f"confusion matrix total: {confusion.sum()} images; each rank evaluated {mine['per_rank_val_images']}")
assert confusion.sum() == len(val_set) == 2 * mine["per_rank_val_images"]
accuracy = np.trace(confusion) / confusion.sum()
print(f"accuracy from the matrix {accuracy:.4f}, ignite's Accuracy {mine['history'][-1]['val_accuracy']:.4f}")
assert abs(accuracy - mine["history"][-1]["val_accuracy"]) < 1e-9
plots.confusion_matrix(confusion, title=f"digits, validation, after {EPOCHS} epochs on 2 ranks");

# %%
plots.sample_predictions(mine["images"], mine["labels"], mine["predicted"]);

# %% [markdown]
# ## 3. The kit's `training`: the same function, grown up
#
# `distkit.launch.run(config)` checks the config, picks a free port and calls
# `idist.Parallel(...).run(distkit.training.training, config, task)`, then reads rank
# 0's `results.json`. Inside, `distkit.training` makes the same ignite calls as the
# function above; this cell parses the source of the kit's modules loaded in this
# kernel (`distkit.training` and what it imports) and finds each call there:

# %%
import ast
import inspect
import sys

import distkit.training


def calls(source):
    """(dotted name, line) of every call in ``source``: ``idist.auto_model(...)`` -> "idist.auto_model"."""
    def name(node):
        if isinstance(node, ast.Attribute):
            return f"{name(node.value)}.{node.attr}"
        return node.id if isinstance(node, ast.Name) else "?"
    return [(name(n.func), n.lineno) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]


# the kit's modules loaded in this kernel (not the notebook props in distkit.lessons)
kit = {m.__name__: calls(inspect.getsource(m)) for name, m in sorted(sys.modules.items())
       if name.startswith("distkit.") and not name.startswith(("distkit.lessons", "distkit.commands"))
       and getattr(m, "__file__", None)}
yours = calls(inspect.getsource(training))
print("yours:    training" + str(inspect.signature(training)))
print("distkit:  training" + str(inspect.signature(distkit.training.training)))
for call in ("idist.auto_dataloader", "idist.auto_model", "idist.auto_optim", "set_epoch",
             "create_supervised_evaluator", "Checkpoint", "trainer.run", "idist.all_gather"):
    def hit(dotted):
        return dotted == call or dotted.endswith("." + call)
    where = [f"{module.split('.')[-1]}.py:{line}" for module, found in kit.items() for dotted, line in found if hit(dotted)]
    typed = any(hit(dotted) for dotted, _ in yours)  # (not `mine`: that holds your run's results)
    print(f"  {call:28} {'in your training' if typed else '-':17} distkit: {', '.join(where)}")
    assert where, call

# %% [markdown]
# What the kit adds around those calls: a learning-rate schedule (`PiecewiseLinear`), a
# `DeterministicEngine` and a resumable checkpoint of trainer, model, optimizer and
# schedule (notebook 09), optional `EarlyStopping` and profiling, and a hash of every
# replica's weights gathered with `idist.all_gather` to prove they stayed identical.
# Now the kit's function, on the best backend here:

# %%
import re
import shutil
import statistics
import subprocess
import sys

from distkit.reporting import run_summary
from distkit.config import Config
from distkit.launch import read_results, run
from distkit.preflight import default_nproc, resolve_backend

backend = resolve_backend("auto")
nproc = default_nproc(backend)
print(f"best backend here: {backend}, {nproc} process(es) per node")
kit_config = Config(epochs=EPOCHS, seed=0, progress_bar=False, output_dir=os.path.join(workdir, "runs"))
spawned = run(kit_config)
print(run_summary(spawned))

# %% [markdown]
# ## 4. The identical run under `torchrun`
#
# `torchrun` is PyTorch's own launcher. It starts the processes itself and sets
# `RANK`, `WORLD_SIZE`, `MASTER_ADDR`... in their environment; `distkit train` sees
# them, spawns nothing, calls `idist.initialize(backend)` and then the same `training`
# function. (`--standalone`: one machine, and torchrun picks a free port itself.) The
# exact command, run from here:

# %%
tr_backend = backend if backend in ("gloo", "nccl") else "gloo"  # torchrun speaks gloo/nccl, not PJRT
tr_nproc = nproc if tr_backend == backend else 2
command = f"torchrun --standalone --nproc_per_node={tr_nproc} -m distkit train --backend {tr_backend} " \
          f"--epochs {EPOCHS} --seed 0 --no-progress --output-dir {kit_config.output_dir}"
print("$", command)
argv = command.split()
if shutil.which("torchrun") is None:  # the same program, when the kernel's bin/ is not on PATH
    argv[:1] = [sys.executable, "-m", "torch.distributed.run"]
done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
print(done.stdout[-1500:])
assert done.returncode == 0, done.stderr[-3000:]
torchrun_results = read_results(re.search(r"plots in (\S+)", done.stdout).group(1))

# %% [markdown]
# ## 5. Learning curves and the single-process comparison
#
# Now the same config in one process, twice, with two seeds: the difference between the
# two seeds is the noise any comparison has to beat. The single process gets as many
# CPU threads as each spawned process had (`threads_per_process`: the cores divided by
# the processes), so the comparison asks what a second process, on cores of its own, buys:

# %%
threads = threads_per_process(spawned["world_size"])
print(cores.threads_sentence(spawned["world_size"], threads))
single = run(kit_config.replace(nproc_per_node=1, threads_per_process=threads))
single_seed1 = run(kit_config.replace(nproc_per_node=1, threads_per_process=threads, seed=1))
runs = {f"{backend} x{spawned['world_size']} (spawned)": spawned,
        f"{tr_backend} x{torchrun_results['world_size']} (torchrun)": torchrun_results,
        f"{single['backend']} x1, seed 0": single, f"{single['backend']} x1, seed 1": single_seed1}
plots.learning_curves(list(runs.values()), labels=list(runs));

# %%
epoch_s = {name: statistics.median(h["epoch_time_s"] for h in r["history"]) for name, r in runs.items()}
for name, r in runs.items():
    f = r["final"]
    print(f"{name:28} val accuracy {f['val_accuracy']:.4f}  val loss {f['val_loss']:.4f}  "
          f"{epoch_s[name]:.2f} s/epoch (median)  replicas identical: {r['replicas_identical']}")
noise = abs(single["final"]["val_accuracy"] - single_seed1["final"]["val_accuracy"])
gap = abs(spawned["final"]["val_accuracy"] - single["final"]["val_accuracy"])
allowed = max(3 * noise, 0.03)
print(f"accuracy: {spawned['world_size']} processes vs 1 differ by {gap:.4f}; two seeds of 1 process "
      f"differ by {noise:.4f}; allowed: {allowed:.4f}")
first, third = list(epoch_s)[0], list(epoch_s)[2]
print(f"time per epoch, {spawned['world_size']} processes / 1 process: {epoch_s[first] / epoch_s[third]:.2f}")
assert gap <= allowed, "data parallelism should not change what the model learns"
launchers_gap = abs(spawned["final"]["val_accuracy"] - torchrun_results["final"]["val_accuracy"])
print(f"spawned vs torchrun: accuracies differ by {launchers_gap:.4f}")
if tr_backend == backend:  # the same launch, by two launchers
    assert launchers_gap <= 0.01
assert all(r["replicas_identical"] for r in runs.values())

# %% [markdown]
# What the numbers above say:
#
# - **Accuracy**: the data-parallel run and the single process reach accuracies that
#   differ by less than the allowance printed above (3× the difference between two
#   seeds of one process, at least 0.03). With the same *global* batch and learning
#   rate, N processes take the same steps on the same amount of data per step; only the
#   order of the samples and of the floating-point sums changes.
# - **spawned vs torchrun**: the same config and seed, two launchers, the same function;
#   the difference printed above is checked to be at most 0.01.
# - **Time per epoch**: the ratio printed above, measured on this runtime (medians over
#   the epochs). Each process does 1/N of the work of an epoch, but every step also
#   waits for the gradient all-reduce (notebook 08 measures its share of a step). A
#   busy machine also blurs CPU timings: other programs take cores.
# - **`replicas identical`**: every run hashed each replica's weights at the start and at
#   the end (`results.json`); all equal means the replicas never drifted apart.
#
# ## What you saw
#
# A `training(local_rank, config)` you wrote ran under `idist.Parallel`; the kit's
# `training`, built from the same ignite calls, ran under `idist.Parallel`, under
# `torchrun` and in one process. The distributed part is three `auto_*` calls, the
# sampler's `set_epoch`, and a few `rank == 0` lines.
#
# Next: sharding checks (notebook 05) — did every process really see its own data?

# %% [markdown]
# ## Appendix: watching a run in TensorBoard
#
# `Config(logger="tensorboard")` (on the command line: `distkit train --logger
# tensorboard`) attaches ignite's `TensorboardLogger` (from `ignite.handlers`) on rank 0.
# Every epoch it writes the training loss (`training/loss`), the learning rate
# (`training/lr/group_0`) and the validation metrics (`validation/accuracy`,
# `validation/loss`) to `tensorboard/` in the run's folder. The cell below trains for 2
# epochs with it, reads the scalars back with TensorBoard's own `EventAccumulator`, and
# opens TensorBoard: in Colab inside the notebook (the magics `%load_ext tensorboard` and
# `%tensorboard --logdir <folder>`), elsewhere by printing the command to type in a
# terminal. Without the `tensorboard` package (`pip install tensorboard`) it says so and
# skips.

# %%
import importlib.util
import os
import sys
import tempfile

if importlib.util.find_spec("tensorboard") is None:
    print("tensorboard is not installed here: pip install tensorboard, then run this cell again")
else:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from distkit.config import Config
    from distkit.launch import run

    tb_dir = os.path.join(workdir, "tensorboard")  # outside the notebook's folder
    tb_run = run(Config(epochs=2, logger="tensorboard", progress_bar=False, output_dir=tb_dir))
    events = EventAccumulator(os.path.join(tb_run["run_dir"], "tensorboard"))
    events.Reload()
    for tag in ["training/loss", "training/lr/group_0", "validation/accuracy", "validation/loss"]:
        print(f"{tag:<20} epochs {[s.step for s in events.Scalars(tag)]}  "
              f"values {[round(s.value, 4) for s in events.Scalars(tag)]}")
        assert [s.step for s in events.Scalars(tag)] == [1, 2]
    if "google.colab" in sys.modules:
        get_ipython().run_line_magic("load_ext", "tensorboard")
        get_ipython().run_line_magic("tensorboard", f"--logdir {tb_dir}")
    else:
        print(f"to look at it: tensorboard --logdir {tb_dir}   (then open http://localhost:6006)")

# %% [markdown]
# ## Cleaning up
#
# Every run of this notebook wrote into its own temporary folder (`workdir`: the runs,
# checkpoints and TensorBoard logs above). The last cell removes it; skip it to keep the
# files and look at them.

# %%
shutil.rmtree(workdir)
print(f"removed {workdir}")
