"""Benchmarks: what the kit's abstractions cost, what scaling buys, and where the limit is.

``distkit bench --quick`` (about a minute on 2 cores) or ``distkit bench`` (the full
mode) measures, in one run:

1. **overhead** -- the kit's trainer vs a minimal hand-written PyTorch loop, 1 process;
2. **ddp** -- the kit vs a hand-written ``torch.distributed`` DDP loop, in the same gloo
   processes;
3. **scaling** -- world sizes 1 and N for a communication-heavy MLP and the
   compute-heavy CNN, strong and weak, with the bytes all-reduced per step; and the
   oversubscribed case (threads not pinned);
4. **data** -- loader throughput vs ``num_workers`` (and ``pin_memory`` with CUDA)
   against the models' compute throughput: when is training data-bound?
5. **gpu** -- CIFAR-shaped ResNet-18, bf16 autocast and channels_last, kit vs
   hand-written loop (only with a CUDA device; otherwise reported as skipped).

Method, for every measurement: all sides run in the same run, on the same data tensors,
with the same number of threads. Each side runs ``warmup`` times first (discarded); then
come ``repeats`` rounds in which the sides take turns in a rotated order (A B, B A, ...),
so drift on a busy machine hits every side alike. A side's result is its median
samples/s over the rounds; a ratio is a ratio of medians.

From Python::

    from distkit.bench import run_benchmarks
    results = run_benchmarks("quick", output_dir="benchmarks/results")
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import queue
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.utils import manual_seed
from torch.utils.data import DataLoader, Dataset

from distkit.config import Config
from distkit.data import TensorImageDataset, get_dataflow, synthetic_dataset
from distkit.errors import DistkitError
from distkit.launch import threads_per_process
from distkit.models import MLP, get_model
from distkit.training import (attach_step_handlers, create_lr_scheduler, create_trainer, initialize,
                              versions)

MEASUREMENTS = ("overhead", "ddp", "scaling", "data", "gpu")
# The kit may cost at most this fraction of the hand-written loop's samples/s.
TARGETS = {"overhead": 0.03, "ddp": 0.03, "gpu": 0.05}
POOL_TIMEOUT_S = 900  # bound on any collective and on any wait for the process pool


@dataclass(frozen=True)
class Settings:
    """How big and how often. ``steps`` optimizer steps make one timed run."""

    mode: str
    repeats: int             # rounds of each kit vs hand-written comparison
    warmup: int
    batch_size: int          # CNN global batch (overhead, ddp, scaling)
    steps: int               # steps per timed run (overhead, ddp)
    mlp_hidden: int          # width of the communication-heavy MLP
    scaling_steps: int
    max_world_size: int      # the process pool: min(cores, this), at least 2
    data_batch: int
    data_batches: int        # batches per timed loader run
    data_workers: tuple = (0, 1, 2)
    compute_steps: int = 3   # steps per timed compute run (data measurement)
    overhead_probe_steps: int = 200  # steps of the tiny model that measures per-step cost
    overhead_variants: bool = True   # also time the kit's variants on the real model
    gpu_batch: int = 256
    gpu_steps: int = 30
    study_repeats: int = 5   # rounds of the scaling and data measurements


MODES = {
    # For the tests: every code path, seconds of work.
    "tiny": Settings("tiny", repeats=2, warmup=1, batch_size=32, steps=3, mlp_hidden=256,
                     scaling_steps=2, max_world_size=2, data_batch=16, data_batches=2,
                     data_workers=(0, 1), compute_steps=1, gpu_batch=4, gpu_steps=1,
                     overhead_probe_steps=20, study_repeats=2),
    "quick": Settings("quick", repeats=15, warmup=1, batch_size=256, steps=8, mlp_hidden=1024,
                      scaling_steps=6, max_world_size=2, data_batch=128, data_batches=8,
                      compute_steps=2, overhead_variants=False, overhead_probe_steps=100,
                      study_repeats=5),
    "full": Settings("full", repeats=25, warmup=2, batch_size=256, steps=16, mlp_hidden=1024,
                     scaling_steps=16, max_world_size=8, data_batch=128, data_batches=24,
                     data_workers=(0, 1, 2, 4), compute_steps=4, gpu_steps=100,
                     overhead_probe_steps=200, study_repeats=9),
}


# --------------------------------------------------------------------------------------
# Method: interleaved repeats, medians
# --------------------------------------------------------------------------------------

def interleaved(sides: dict, repeats: int, warmup: int = 1, cpu: dict | None = None) -> dict:
    """Run every side ``warmup`` times (discarded), then ``repeats`` rounds in rotated
    order: round r starts with side r mod n (A B, B A, A B, ... for two sides).

    A side is a callable returning ``(samples, seconds)``, timed by itself, or
    ``(samples, seconds, cpu_seconds)``. Returns ``{name: [samples/s of round 1, round
    2, ...]}``; samples per CPU-second go into ``cpu`` when it is given."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    rates = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples, seconds, *cpu_seconds = sides[name]()
            rates[name].append(samples / seconds)
            if cpu is not None and cpu_seconds:
                cpu.setdefault(name, []).append(samples / cpu_seconds[0])
    return rates


def summarize(rates: list, cpu_rates: list | None = None) -> dict:
    """Median and spread of one side's samples/s (and samples per CPU-second)."""
    out = {"samples_per_s": rates, "median": statistics.median(rates),
           "min": min(rates), "max": max(rates)}
    if cpu_rates:
        out.update(samples_per_cpu_s=cpu_rates, cpu_median=statistics.median(cpu_rates))
    return out


def compare(kit_rates: list, hand_rates: list, target: float, kit_cpu=None, hand_cpu=None) -> dict:
    """Kit vs hand-written samples/s (1.0 = free, 0.97 = the kit costs 3%): the median
    over rounds of each round's ratio. The two sides of a round ran back to back, so a
    slow spell of the machine that spans a round cancels out of its ratio; the ratio of
    the two sides' medians is kept as ``ratio_of_medians``.

    ``cpu_ratio`` is the same in samples per CPU-second: the kit's extra work is CPU
    work, and CPU time moves much less than wall time when other jobs share the cores."""
    ratio = statistics.median([k / h for k, h in zip(kit_rates, hand_rates)])
    out = {"ratio": ratio, "cost": 1.0 - ratio,
           "ratio_of_medians": statistics.median(kit_rates) / statistics.median(hand_rates),
           "target_cost": target, "within_target": ratio >= 1.0 - target}
    if kit_cpu and hand_cpu:
        out["cpu_ratio"] = statistics.median([k / h for k, h in zip(kit_cpu, hand_cpu)])
    return out


# --------------------------------------------------------------------------------------
# The two sides: the kit's trainer, and a minimal hand-written loop
# --------------------------------------------------------------------------------------

class KitRun:
    """The kit's trainer with the handlers that ``distkit.training.training`` attaches
    to every step or epoch of training: ``create_trainer`` (a ``DeterministicEngine``
    whose step is forward, backward, optimizer step and ``loss.item()``, and the epoch's
    mean loss), the lr schedule of ``create_lr_scheduler`` at every
    ``ITERATION_STARTED``, the sampler's ``set_epoch`` at every ``EPOCH_STARTED``, and the
    sample counter. Validation and checkpoints, which ``training()`` runs between epochs,
    are not training throughput and are left out (the hand-written loop has none).

    ``handlers=False`` leaves out the lr schedule (``attach_step_handlers`` with no
    scheduler: the per-epoch reshuffle and the sample counter stay);
    ``progress_bar=True`` adds the ``ProgressBar`` that ``distkit train`` shows by
    default (written to /dev/null here). Calling it trains ``epochs`` epochs and returns
    the samples this process trained on."""

    def __init__(self, model, optimizer, criterion, loader, config, handlers=True, progress_bar=False):
        self.loader = loader
        self.trainer = create_trainer(model, optimizer, criterion, config)
        schedule = create_lr_scheduler(config, optimizer, len(loader)) if handlers else None
        attach_step_handlers(self.trainer, loader, schedule)
        if progress_bar:
            from ignite.handlers import ProgressBar

            self._devnull = open(os.devnull, "w")
            ProgressBar(persist=False, file=self._devnull).attach(
                self.trainer, output_transform=lambda out: {"loss": out["loss"]})

    def __call__(self, epochs: int = 1) -> int:
        self.trainer.run(self.loader, max_epochs=epochs)
        return self.trainer.state.samples


def handwritten_epochs(model, optimizer, criterion, loader, epochs=1, scheduler=None,
                       sampler=None, amp_dtype=None) -> int:
    """The minimal loop the kit is measured against. It does the same work per step as
    the kit's ``train_step``: forward, loss, backward, optimizer step, the lr schedule,
    and ``loss.item()`` (the kit reads the loss every step for its running average; on a
    GPU that is a sync point, so the baseline must pay it too)."""
    device = next(model.parameters()).device
    samples = 0
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if amp_dtype is None:
                loss = criterion(model(x), y)
            else:
                with torch.autocast(device.type, dtype=amp_dtype):
                    loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            loss.item()  # read the loss every step, as the kit does
            samples += len(x)
    return samples


def handwritten_setup(config, device, ddp=False):
    """Model, optimizer and loss written out by hand: the same model class, seed and
    hyper-parameters as ``distkit.training.initialize``; ``ddp=True`` wraps the model in
    ``DistributedDataParallel`` on the default process group."""
    from distkit.data import dataset_info

    torch.manual_seed(config.seed)
    model = get_model(config.model, **dataset_info(config.dataset)).to(device)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    return model, optimizer, nn.CrossEntropyLoss()


def linear_decay(optimizer, total_steps):
    """The kit's default schedule (no warm-up, linear decay to 0), as torch's ``LinearLR``."""
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0,
                                             total_iters=total_steps)


def _timed(fn):
    """A side for :func:`interleaved`: runs ``fn`` (which returns samples) and times it,
    wall clock and this process's CPU time (all its threads)."""
    def side():
        cpu, start = time.process_time(), time.perf_counter()
        samples = fn()
        return samples, time.perf_counter() - start, time.process_time() - cpu
    return side


def _bench_config(settings, model="cnn", batch_size=None, runs=1, steps=None) -> Config:
    """A synthetic-data config whose training set is exactly ``steps`` global batches.
    ``epochs`` covers every run, so the lr schedule never runs out."""
    batch_size = batch_size or settings.batch_size
    steps = steps or settings.steps
    return Config(dataset="synthetic", model=model, batch_size=batch_size,
                  dataset_size=steps * batch_size, epochs=runs, progress_bar=False,
                  backend="gloo", num_workers=0)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------------------
# 1. Overhead, one process
# --------------------------------------------------------------------------------------

def _overhead_sides(config, runs, variants=True):
    """The sides of the overhead measurement, on the kit's own loader's tensors."""
    train_loader, _ = get_dataflow(config)  # the kit's loader: the same tensors for all

    def kit(**kwargs):
        model, optimizer, criterion = initialize(config)
        return KitRun(model, optimizer, criterion, train_loader, config, **kwargs)

    hand_model, hand_opt, hand_loss = handwritten_setup(config, idist.device())
    hand_loader = DataLoader(train_loader.dataset, batch_size=config.batch_size, shuffle=True)
    hand_sched = linear_decay(hand_opt, runs * len(hand_loader))
    sides = {
        "hand-written": _timed(lambda: handwritten_epochs(hand_model, hand_opt, hand_loss, hand_loader,
                                                          scheduler=hand_sched)),
        "kit": _timed(kit()),
    }
    if variants:
        sides["kit: create_trainer only"] = _timed(kit(handlers=False))
        sides["kit + progress bar"] = _timed(kit(progress_bar=True))
    return len(train_loader), sides


def measure_overhead(settings: Settings, threads: int | None = None) -> dict:
    """The kit's trainer vs the hand-written loop, 1 process, all cores' threads (the
    kit's rule for one process), the same data tensors. Variants of the kit isolate what
    each layer costs: ``create_trainer`` alone; as ``training()`` builds it (the
    headline); and with the progress bar that ``distkit train`` shows by default.
    ``threads`` overrides the thread count (both sides alike).

    ``per_step_us`` measures the same sides on a model so small (the kit's MLP, batch 8)
    that the step is almost all overhead: the kit's fixed cost per step in
    microseconds of CPU, which divided by a real step's time predicts the ratio."""
    runs = settings.warmup + settings.repeats
    config = _bench_config(settings, runs=runs)
    threads = threads or threads_per_process(1)
    with _threads(threads):
        steps, sides = _overhead_sides(config, runs, settings.overhead_variants)
        cpu = {}
        rates = interleaved(sides, settings.repeats, settings.warmup, cpu)
        small = _bench_config(settings, model="mlp", batch_size=8, runs=runs,
                              steps=settings.overhead_probe_steps)
        _, small_sides = _overhead_sides(small, runs)
        small_cpu = {}
        interleaved(small_sides, settings.repeats, settings.warmup, small_cpu)
    hand, hand_cpu = rates["hand-written"], cpu["hand-written"]
    us = {name: 1e6 * small.batch_size / statistics.median(r) for name, r in small_cpu.items()}
    return {
        "model": config.model, "dataset": "synthetic 1x8x8", "batch_size": config.batch_size,
        "steps_per_run": steps, "threads": threads, "processes": 1, "device": str(idist.device()),
        "sides": {name: summarize(r, cpu[name]) for name, r in rates.items()},
        **compare(rates["kit"], hand, TARGETS["overhead"], cpu["kit"], hand_cpu),
        "variants": {name: compare(r, hand, TARGETS["overhead"], cpu[name], hand_cpu)
                     for name, r in rates.items() if name != "hand-written"},
        "per_step_us": {
            "model": "mlp, batch 8", "steps_per_run": settings.overhead_probe_steps,
            "cpu_us_per_step": us,
            "kit_extra_cpu_us_per_step": {name: t - us["hand-written"] for name, t in us.items()
                                          if name != "hand-written"},
            "hand_written_step_ms_of_the_real_model": 1000 * config.batch_size / statistics.median(hand),
        },
    }


# --------------------------------------------------------------------------------------
# 2 and 3. Processes: a pool of gloo processes that runs the variants it is sent
# --------------------------------------------------------------------------------------

def wide_mlp(hidden: int) -> nn.Module:
    """The communication-heavy model: the kit's MLP with a wide hidden layer (many
    parameters to all-reduce, few FLOPs per parameter)."""
    return MLP(in_channels=1, num_classes=10, image_size=8, hidden=hidden)


def scaling_models(settings: Settings) -> dict:
    """name -> (builder, what it stands for)."""
    return {
        "cnn": (lambda: get_model("cnn"), "compute-heavy"),
        f"mlp-{settings.mlp_hidden}": (lambda: wide_mlp(settings.mlp_hidden), "communication-heavy"),
    }


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradient one step produces: what DDP all-reduces every step."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _kit_variant(build, global_batch, steps, runs):
    """The kit's code path with any model: ``idist.auto_dataloader`` (a
    ``DistributedSampler`` and batch / world size when distributed, as ``get_dataflow``),
    ``idist.auto_model`` (DDP when distributed), ``idist.auto_optim``, and ``KitRun``."""
    config = Config(batch_size=global_batch, epochs=runs, progress_bar=False)
    data = synthetic_dataset(steps * global_batch)
    loader = idist.auto_dataloader(data, batch_size=global_batch, shuffle=True, num_workers=0,
                                   pin_memory=False)
    manual_seed(config.seed)
    model = idist.auto_model(build())
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config.lr,
                                                 momentum=config.momentum))
    return KitRun(model, optimizer, nn.CrossEntropyLoss(), loader, config)


def _measured_allreduce_bytes(build, batch) -> int:
    """Run one step of DDP with a communication hook that counts the bytes of every
    bucket it all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(build())
    counted = {"bytes": 0}

    def counting_allreduce(state, bucket):
        state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(counted, counting_allreduce)
    x, y = torch.randn(batch, 1, 8, 8), torch.randint(0, 10, (batch,))
    nn.functional.cross_entropy(model(x), y).backward()
    return counted["bytes"]


def _collective(fn, threads):
    """A side run by every process of the pool: start together, time, and report the
    global samples and the slowest process's seconds."""
    def side():
        torch.set_num_threads(threads)
        idist.barrier()
        cpu, start = time.process_time(), time.perf_counter()
        samples = fn()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return (idist.all_reduce(float(samples)), idist.all_reduce(seconds, op="MAX"),
                idist.all_reduce(cpu))
    return side


def _ddp_sides(config, world_size, threads, runs):
    """Kit and hand-written DDP, on the same tensors, in the same processes and process
    group: (steps per run, {"kit": side, "hand-written": side})."""
    from torch.utils.data.distributed import DistributedSampler

    train_loader, _ = get_dataflow(config)  # DistributedSampler, batch / world size
    model, optimizer, criterion = initialize(config)  # DDP via idist.auto_model
    kit = KitRun(model, optimizer, criterion, train_loader, config)
    hand_model, hand_opt, hand_loss = handwritten_setup(config, idist.device(), ddp=True)
    sampler = DistributedSampler(train_loader.dataset, num_replicas=world_size,
                                 rank=idist.get_rank(), shuffle=True)
    hand_loader = DataLoader(train_loader.dataset, batch_size=config.batch_size // world_size,
                             sampler=sampler)
    hand_sched = linear_decay(hand_opt, runs * len(hand_loader))
    return len(train_loader), {
        "kit": _collective(kit, threads),
        "hand-written": _collective(lambda: handwritten_epochs(
            hand_model, hand_opt, hand_loss, hand_loader, scheduler=hand_sched, sampler=sampler), threads),
    }


def _pool_variants(settings, world_size, threads, cores, tasks):
    runs = settings.warmup + max(settings.repeats, settings.study_repeats)
    variants, info = {}, {}
    if "ddp" in tasks:
        steps, sides = _ddp_sides(_bench_config(settings, runs=runs), world_size, threads, runs)
        variants.update({f"ddp/{k}": side for k, side in sides.items()})
        info["ddp_steps_per_run"] = steps
        # the same on a model so small that a step is almost all overhead
        small = _bench_config(settings, model="mlp", batch_size=8 * world_size, runs=runs,
                              steps=settings.overhead_probe_steps)
        _, sides = _ddp_sides(small, world_size, threads, runs)
        variants.update({f"ddp-probe/{k}": side for k, side in sides.items()})
    if "scaling" in tasks:
        info["allreduce_bytes"] = {}
        for name, (build, _) in scaling_models(settings).items():
            b, s = settings.batch_size, settings.scaling_steps
            variants[f"{name}/strong"] = _collective(_kit_variant(build, b, s, runs), threads)
            variants[f"{name}/weak"] = _collective(_kit_variant(build, b * world_size, s, runs), threads)
            # Not pinned: every process takes all the cores' threads, as torch does by
            # default when OMP_NUM_THREADS is not set.
            variants[f"{name}/oversubscribed"] = _collective(_kit_variant(build, b, s, runs), cores)
            info["allreduce_bytes"][name] = _measured_allreduce_bytes(build, 8)
    return variants, info


def _pool_worker(local_rank, job):
    """Each process of the pool: build the variants, then run the ones rank 0 is sent,
    until told to stop. Waiting costs no CPU; what it does cost is recorded."""
    logging.disable(logging.INFO)
    torch.set_num_threads(job["threads"])
    variants, info = _pool_variants(job["settings"], idist.get_world_size(), job["threads"],
                                    job["cores"], job["tasks"])
    rank = idist.get_rank()
    if rank == 0:
        job["results"].put(("ready", info))
    idle_cpu = idle_wall = 0.0
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        name = job["commands"].get() if rank == 0 else ""
        name = idist.broadcast(name, src=0, safe_mode=True)
        idle_cpu += time.process_time() - cpu
        idle_wall += time.perf_counter() - wall
        if name == "stop":
            break
        measured = variants[name]()
        if rank == 0:
            job["results"].put(("done", measured))
    idle_cpu = idist.all_reduce(idle_cpu, op="MAX")
    idle_wall = idist.all_reduce(idle_wall, op="MIN")
    if rank == 0:
        job["results"].put(("stopped", {"idle_cpu_s": idle_cpu, "idle_wall_s": idle_wall}))
    idist.barrier()


class ProcessPool:
    """``world_size`` gloo processes started with ``idist.Parallel`` (the kit's launcher),
    kept alive so that their variants can take turns with this process's own: this
    process sends a variant's name and waits (without using CPU) for its result."""

    def __init__(self, settings, world_size, threads, cores, tasks):
        import multiprocessing as mp

        from distkit.launch import free_port

        ctx = mp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        self.world_size, self.error = world_size, None
        job = {"settings": settings, "threads": threads, "cores": cores, "tasks": tuple(tasks),
               "commands": self.commands, "results": self.results}
        previous = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(threads)  # as distkit.launch.run does
        self.thread = threading.Thread(target=self._run, args=(job, free_port()), daemon=True)
        self.thread.start()
        try:
            _, self.info = self._get("ready")
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous

    def _run(self, job, port):
        try:
            with idist.Parallel(backend="gloo", nproc_per_node=self.world_size, master_port=port,
                                timeout=timedelta(seconds=POOL_TIMEOUT_S)) as parallel:
                parallel.run(_pool_worker, job)
        except BaseException as e:  # reported by _get, in the main thread
            self.error = e

    def _get(self, expected):
        deadline = time.monotonic() + POOL_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                message = self.results.get(timeout=0.5)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise DistkitError(f"the benchmark's process pool died ({self.error!r}): see "
                                       "its output above") from None
                continue
            assert message[0] == expected, message
            return message
        raise DistkitError(f"the benchmark's process pool gave no answer in {POOL_TIMEOUT_S} s: "
                           "is the machine overloaded? retry with --quick")

    def side(self, name):
        def run_remote():
            self.commands.put(name)
            return self._get("done")[1]
        return run_remote

    def close(self) -> dict:
        self.commands.put("stop")
        _, idle = self._get("stopped")
        self.thread.join(timeout=60)
        return idle


def pool_size(settings: Settings, cores: int) -> int:
    return max(2, min(cores, settings.max_world_size))


def measure_processes(settings: Settings, tasks=("ddp", "scaling")) -> dict:
    """Measurements 2 (ddp) and 3 (scaling), interleaved in one run.

    The world-size-1 points run in this process (no process group: exactly the kit's
    1-process path); the world-size-N points run in a pool of N gloo processes, which
    waits on a queue while this process works, and vice versa."""
    cores = threads_per_process(1)
    world = pool_size(settings, cores)
    threads = max(1, cores // world)  # the kit's rule: cores / processes on the node
    runs = settings.warmup + settings.study_repeats
    sides = {}
    if "scaling" in tasks:
        for name, (build, _) in scaling_models(settings).items():
            solo = _kit_variant(build, settings.batch_size, settings.scaling_steps, runs)
            every_core = _kit_variant(build, settings.batch_size, settings.scaling_steps, runs)
            sides[f"{name}/1"] = _with_threads(_timed(solo), threads)
            sides[f"{name}/1-all-cores"] = _with_threads(_timed(every_core), cores)
    pool = ProcessPool(settings, world, threads, cores, tasks)
    rates, cpu = {}, {}
    try:
        if "ddp" in tasks:
            comparison = {name: pool.side(name) for name in (
                "ddp/kit", "ddp/hand-written", "ddp-probe/kit", "ddp-probe/hand-written")}
            rates.update(interleaved(comparison, settings.repeats, settings.warmup, cpu))
        if "scaling" in tasks:
            for name in (f"{m}/{kind}" for m in scaling_models(settings)
                         for kind in ("strong", "weak", "oversubscribed")):
                sides[name] = pool.side(name)
            rates.update(interleaved(sides, settings.study_repeats, settings.warmup, cpu))
    finally:
        idle = pool.close()
    out = {"world_size": world, "threads_per_process": threads, "cores": cores, "pool_idle": idle}
    if "ddp" in tasks:
        out["ddp"] = {
            "model": "cnn", "dataset": "synthetic 1x8x8", "global_batch_size": settings.batch_size,
            "world_size": world, "backend": "gloo", "threads_per_process": threads,
            "steps_per_run": pool.info["ddp_steps_per_run"],
            "sides": {"kit": summarize(rates["ddp/kit"], cpu["ddp/kit"]),
                      "hand-written": summarize(rates["ddp/hand-written"], cpu["ddp/hand-written"])},
            **compare(rates["ddp/kit"], rates["ddp/hand-written"], TARGETS["ddp"],
                      cpu["ddp/kit"], cpu["ddp/hand-written"]),
        }
        # CPU per step and process, on the tiny model (8 samples per process)
        us = {k: 1e6 * 8 / statistics.median(cpu[f"ddp-probe/{k}"]) for k in ("kit", "hand-written")}
        step_ms = 1000 * settings.batch_size / statistics.median(rates["ddp/hand-written"])
        out["ddp"]["per_step_us"] = {
            "model": "mlp, batch 8 per process", "steps_per_run": settings.overhead_probe_steps,
            "cpu_us_per_step_per_process": us,
            "kit_extra_cpu_us_per_step_per_process": us["kit"] - us["hand-written"],
            "hand_written_step_ms_of_the_real_model": step_ms,
        }
    if "scaling" in tasks:
        out["scaling"] = _scaling_report(settings, rates, world, threads, cores, pool.info)
    return out


def _with_threads(side, n):
    def run():
        with _threads(n):
            return side()
    return run


def _scaling_report(settings, rates, world, threads, cores, info) -> dict:
    models = {}
    for name, (build, role) in scaling_models(settings).items():
        med = {k: statistics.median(rates[f"{name}/{k}"])
               for k in ("1", "1-all-cores", "strong", "weak", "oversubscribed")}
        b = settings.batch_size
        points = [
            {"variant": "1 process", "world_size": 1, "threads_per_process": threads,
             "global_batch": b, **summarize(rates[f"{name}/1"])},
            {"variant": "1 process, all cores", "world_size": 1, "threads_per_process": cores,
             "global_batch": b, **summarize(rates[f"{name}/1-all-cores"])},
            {"variant": "strong", "world_size": world, "threads_per_process": threads,
             "global_batch": b, **summarize(rates[f"{name}/strong"])},
            {"variant": "weak", "world_size": world, "threads_per_process": threads,
             "global_batch": b * world, **summarize(rates[f"{name}/weak"])},
            {"variant": "oversubscribed", "world_size": world, "threads_per_process": cores,
             "global_batch": b, **summarize(rates[f"{name}/oversubscribed"])},
        ]
        model = build()
        models[name] = {
            "role": role, "parameters": sum(p.numel() for p in model.parameters()),
            "allreduce_bytes_per_step": gradient_bytes(model),
            "allreduce_bytes_per_step_measured": info["allreduce_bytes"][name],
            "points": points,
            # efficiency: samples/s of N processes / (N x samples/s of 1), same threads each
            "strong_efficiency": med["strong"] / (world * med["1"]),
            "weak_efficiency": med["weak"] / (world * med["1"]),
            # what N processes buy over 1 process using all the cores' threads
            "speedup_vs_1_process_all_cores": med["strong"] / med["1-all-cores"],
            "oversubscribed_slowdown": med["strong"] / med["oversubscribed"],
        }
    return {"world_sizes": [1, world], "threads_per_process": threads, "cores": cores,
            "steps_per_run": settings.scaling_steps, "per_process_batch_weak": settings.batch_size,
            "models": models}


# --------------------------------------------------------------------------------------
# 4. Data pipeline
# --------------------------------------------------------------------------------------

class Augmented(Dataset):
    """The CIFAR-10 training augmentation (random 32x32 crop of a 4-pixel padded image,
    random horizontal flip), applied per sample as torchvision datasets do."""

    def __init__(self, dataset):
        from torchvision.transforms import v2

        self.dataset = dataset
        self.transform = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        x, y = self.dataset[i]
        return self.transform(x), y


def _pipelines(settings, size):
    return {
        "in-memory 1x8x8": (synthetic_dataset(size), {"in_channels": 1, "image_size": 8}),
        "3x32x32 + crop/flip": (Augmented(synthetic_dataset(size, shape=(3, 32, 32))),
                                {"in_channels": 3, "image_size": 32}),
    }


def _loader_side(dataset, batch, workers, pin, batches):
    """Times ``batches`` batches after the first; the first (workers started, first batch
    made) is recorded apart in ``side.startup_s``: without ``persistent_workers`` a
    loader pays it again at every epoch. With CUDA each batch is also copied to the GPU
    (asynchronously from pinned memory), which is where ``pin_memory`` pays off."""
    cuda = torch.cuda.is_available()

    def side():
        start = time.perf_counter()
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                            pin_memory=pin)
        it = iter(loader)
        next(it)
        side.startup_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(batches):
            x, y = next(it)
            if cuda:
                x, y = x.to("cuda", non_blocking=pin), y.to("cuda", non_blocking=pin)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del it
        return batches * batch, seconds
    side.startup_s = []
    return side


def measure_data(settings: Settings, threads: int | None = None) -> dict:
    """Loader samples/s for each ``num_workers`` (and ``pin_memory`` with CUDA) against
    each model's compute samples/s (the kit's trainer on batches already in memory):
    training is data-bound when the loader is the slower of the two."""
    cores = threads_per_process(1)
    threads = threads or cores
    # more workers than cores only makes them take turns (and torch warns)
    workers = [w for w in settings.data_workers if w <= max(2, cores)]
    b = settings.data_batch
    size = (settings.data_batches + 1) * b
    pins = (False, True) if torch.cuda.is_available() else (False,)
    runs = settings.warmup + settings.study_repeats
    out = {"batch_size": b, "threads": threads, "cores": cores, "num_workers": workers, "pipelines": {},
           "pin_memory": ("measured" if torch.cuda.is_available()
                          else "not measured: pinning only helps copies to a CUDA device")}
    with _threads(threads):
        for pname, (dataset, shape) in _pipelines(settings, size).items():
            loader_sides = {f"workers={w} pin={p}": _loader_side(dataset, b, w, p, settings.data_batches)
                            for w in workers for p in pins}
            compute_sides, kits = {}, {}
            for model in ("cnn", "mlp"):
                config = Config(model=model, batch_size=b, epochs=runs, progress_bar=False)
                manual_seed(0)
                net = get_model(model, num_classes=10, **shape).to(idist.device())
                opt = torch.optim.SGD(net.parameters(), lr=config.lr, momentum=config.momentum)
                batches = [dataset[i * b:(i + 1) * b] if isinstance(dataset, TensorImageDataset)
                           else _collate(dataset, i * b, b) for i in range(settings.compute_steps)]
                kits[model] = KitRun(net, opt, nn.CrossEntropyLoss(), batches, config)
                compute_sides[f"compute {model}"] = _timed(kits[model])
            rates = interleaved({**loader_sides, **compute_sides}, settings.study_repeats,
                                settings.warmup)
            loaders = {k: {**summarize(rates[k]),
                           "startup_s_median": statistics.median(loader_sides[k].startup_s)}
                       for k in loader_sides}
            compute = {m: summarize(rates[f"compute {m}"]) for m in kits}
            verdicts = {}
            for m, c in compute.items():
                bound = [w for w in workers
                         if loaders[f"workers={w} pin=False"]["median"] >= c["median"]]
                verdicts[m] = {
                    "compute_samples_per_s": c["median"],
                    "compute_ms_per_batch": 1000 * b / c["median"],
                    "data_bound_with_0_workers": loaders["workers=0 pin=False"]["median"] < c["median"],
                    "fewest_workers_to_keep_up": bound[0] if bound else None,
                }
            out["pipelines"][pname] = {"loader": loaders, "compute": compute, "verdict": verdicts}
    return out


def _collate(dataset, start, n):
    xs, ys = zip(*(dataset[i] for i in range(start, start + n)))
    return torch.stack(xs), torch.stack(ys)


# --------------------------------------------------------------------------------------
# 5. GPU
# --------------------------------------------------------------------------------------

def measure_gpu(settings: Settings, force: bool = False) -> dict:
    """Images/s of the CIFAR-shaped ResNet-18 with bf16 autocast and channels_last, kit
    vs hand-written, on the same batches already on the device. Needs CUDA; ``force``
    runs the same code on the CPU (for the tests)."""
    if not torch.cuda.is_available() and not force:
        return {"skipped": "no CUDA device"}
    device = idist.device()
    runs = settings.warmup + settings.repeats
    config = Config(dataset="cifar10", model="resnet18", batch_size=settings.gpu_batch, amp=True,
                    epochs=runs, progress_bar=False)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(config.batch_size, 3, 32, 32, generator=g)
                .to(device).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (config.batch_size,), generator=g).to(device))
               for _ in range(settings.gpu_steps)]

    model, optimizer, criterion = initialize(config)  # the kit: model on idist.device()
    model = model.to(memory_format=torch.channels_last)
    kit = KitRun(model, optimizer, criterion, batches, config)
    hand_model, hand_opt, hand_loss = handwritten_setup(config, device)
    hand_model = hand_model.to(memory_format=torch.channels_last)
    hand_sched = linear_decay(hand_opt, runs * len(batches))

    def synced(fn):
        def side():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            samples = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return samples, time.perf_counter() - start
        return side

    sides = {"kit": synced(kit),
             "hand-written": synced(lambda: handwritten_epochs(
                 hand_model, hand_opt, hand_loss, batches, scheduler=hand_sched,
                 amp_dtype=torch.bfloat16))}
    rates = interleaved(sides, settings.repeats, settings.warmup)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (forced)"
    return {"device": name, "model": "resnet18 (CIFAR stem)", "batch_size": config.batch_size,
            "amp": "bfloat16", "memory_format": "channels_last", "steps_per_run": len(batches),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "sides": {k: summarize(r) for k, r in rates.items()},
            **compare(rates["kit"], rates["hand-written"], TARGETS["gpu"])}


# --------------------------------------------------------------------------------------
# Machine, the whole run, output files
# --------------------------------------------------------------------------------------

def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            memory = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": threads_per_process(1),
            "memory_gib": memory, "cuda": torch.cuda.is_available(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "load_average": _load()}


def _load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_benchmarks(mode: str = "quick", output_dir: str | None = "benchmarks/results",
                   only=MEASUREMENTS, note: str = "", threads: int | None = None,
                   log=print) -> dict:
    """Run the measurements of ``mode`` (tiny, quick, full); write
    ``bench-<mode>.json`` and ``bench-<mode>.png`` under ``output_dir`` (unless None);
    return the results. ``threads``: torch threads of the 1-process measurements
    (overhead, data); default: all cores, the kit's rule for one process."""
    if mode not in MODES:
        raise DistkitError(f"unknown benchmark mode {mode!r}: use one of {', '.join(MODES)}")
    if threads is not None and threads < 1:
        raise DistkitError(f"--threads must be >= 1, got {threads}")
    unknown = set(only) - set(MEASUREMENTS)
    if unknown:
        raise DistkitError(f"unknown measurement {', '.join(sorted(unknown))}: choose from "
                           f"{', '.join(MEASUREMENTS)}")
    if output_dir is not None:
        _check_output_dir(output_dir)  # fail now, not after minutes of measuring
    settings = MODES[mode]
    started, t0 = datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    results = {"mode": mode, "started": started, "note": note, "machine": machine(),
               "versions": versions(), "settings": asdict(settings), "targets": TARGETS,
               "method": "warm-up runs discarded; sides interleaved in rotated order each round; "
                         "median samples/s over rounds; ratio = kit median / hand-written median"}
    previous_disable = logging.root.manager.disable
    logging.disable(logging.INFO)  # ignite logs every auto_dataloader at INFO
    try:
        if "overhead" in only:
            with _phase(results, "overhead", log, "1/5 overhead: kit vs hand-written loop, 1 process"):
                results["overhead"] = measure_overhead(settings, threads)
        if "ddp" in only or "scaling" in only:
            tasks = [t for t in ("ddp", "scaling") if t in only]
            with _phase(results, "processes", log,
                        f"2-3/5 {' and '.join(tasks)}: a pool of gloo processes"):
                procs = measure_processes(settings, tasks)
            for t in tasks:
                results[t] = procs.pop(t)
            results["pool"] = procs
        if "data" in only:
            with _phase(results, "data", log, "4/5 data pipeline: loader vs compute"):
                results["data"] = measure_data(settings, threads)
        if "gpu" in only:
            with _phase(results, "gpu", log, "5/5 gpu"):
                results["gpu"] = measure_gpu(settings)
    finally:
        logging.disable(previous_disable)
    results["machine"]["load_average_end"] = _load()
    results["duration_s"] = time.perf_counter() - t0
    if output_dir is not None:
        results["files"] = write_outputs(results, output_dir)
    return results


@contextlib.contextmanager
def _phase(results, name, log, what):
    log(f"{what} ...")
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    results.setdefault("phase_seconds", {})[name] = round(seconds, 1)
    log(f"    ({seconds:.0f} s)")


def _check_output_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise DistkitError(f"cannot create --output {output_dir!r} ({e.strerror}): pass a "
                           "writable folder") from None
    if not os.access(output_dir, os.W_OK):
        raise DistkitError(f"--output {output_dir!r} is not writable: pass a writable folder")


def write_outputs(results: dict, output_dir: str) -> dict:
    """``bench-<mode>.json`` and ``bench-<mode>.png``, each written to a temporary file
    first and then renamed, so a reader never sees half a file."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from distkit.plots import benchmark_chart

    _check_output_dir(output_dir)
    base = os.path.join(output_dir, f"bench-{results['mode']}")
    files = {"json": base + ".json", "png": base + ".png"}
    fig = benchmark_chart(results)
    fig.savefig(files["png"] + ".tmp.png", dpi=110)
    plt.close(fig)
    os.replace(files["png"] + ".tmp.png", files["png"])
    with open(files["json"] + ".tmp", "w") as f:
        json.dump({**results, "files": files}, f, indent=2, default=str)
    os.replace(files["json"] + ".tmp", files["json"])
    return files


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

def _rate(x):
    return f"{x:,.0f}/s" if x is not None and not math.isnan(x) else "-"


def _status(cmp):
    return "ok" if cmp["within_target"] else "OVER TARGET"


def table(results: dict) -> str:
    """The printed summary: one line per ratio."""
    m, v = results["machine"], results["versions"]
    lines = [f"distkit bench ({results['mode']}): {m['cores']} cores, {m['cpu']}, torch {v['torch']}, "
             f"ignite {v['ignite']}, load average {m['load_average']} -> {m.get('load_average_end')}"]
    if results.get("note"):
        lines.append(f"note: {results['note']}")
    row = "{:<46} {:>10} {:>13} {:>6} {:>6}  {}"
    if "overhead" in results or "ddp" in results or "gpu" in results:
        lines += ["", row.format("kit vs hand-written (medians)", "kit", "hand-written", "ratio",
                                 "cpu", "target (on ratio)")]

    def kit_row(label, kit, hand, cmp, target=True):
        cpu = f"{cmp['cpu_ratio']:.3f}" if "cpu_ratio" in cmp else "-"
        verdict = (f">= {1 - cmp['target_cost']:.2f} {_status(cmp)}" if target else "(not a target)")
        return row.format(label, _rate(kit["median"]), _rate(hand["median"]) if hand else "",
                          f"{cmp['ratio']:.3f}", cpu, verdict)

    if "overhead" in results:
        o = results["overhead"]
        hand = o["sides"]["hand-written"]
        lines.append(kit_row(f"1 overhead, 1 process ({o['model']}, batch {o['batch_size']}, "
                             f"{o['threads']} thr)", o["sides"]["kit"], hand, o))
        for name, cmp in o["variants"].items():
            if name != "kit":
                lines.append(kit_row(f"    {name}", o["sides"][name], None, cmp, target=False))
        per = o["per_step_us"]
        extra = per["kit_extra_cpu_us_per_step"]
        step_ms = per["hand_written_step_ms_of_the_real_model"]
        lines.append(f"    the kit's own cost per step ({per['model']}): {extra['kit']:+.0f} us of CPU "
                     f"(create_trainer only {extra['kit: create_trainer only']:+.0f}, with progress bar "
                     f"{extra['kit + progress bar']:+.0f}); against a {step_ms:.1f} ms step: "
                     f"{step_ms / (step_ms + extra['kit'] / 1000):.3f} expected")
    if "ddp" in results:
        d = results["ddp"]
        lines.append(kit_row(f"2 DDP overhead, {d['world_size']} gloo processes (batch "
                             f"{d['global_batch_size']})", d["sides"]["kit"], d["sides"]["hand-written"], d))
        per = d["per_step_us"]
        extra, step_ms = per["kit_extra_cpu_us_per_step_per_process"], per["hand_written_step_ms_of_the_real_model"]
        lines.append(f"    the kit's own cost per step and process ({per['model']}): {extra:+.0f} us of "
                     f"CPU; against a {step_ms:.1f} ms step: {step_ms / (step_ms + extra / 1000):.3f} expected")
    if "gpu" in results:
        g = results["gpu"]
        if "skipped" in g:
            lines.append(f"5 GPU (ResNet-18, bf16, channels_last): skipped: {g['skipped']}")
        else:
            lines.append(kit_row(f"5 GPU {g['device']} (ResNet-18 bf16 cl)", g["sides"]["kit"],
                                 g["sides"]["hand-written"], g))
    if any(k in results for k in ("overhead", "ddp")):
        lines.append("(ratio: samples/s, wall clock; cpu: samples per CPU-second, steadier on a "
                     "shared machine)")
    if "scaling" in results:
        s = results["scaling"]
        lines += ["", f"3 scaling (the kit's trainer; {s['threads_per_process']} thread(s) per process "
                      f"unless noted; {s['cores']} cores)",
                  "{:<12} {:<22} {:>5} {:>6} {:>12} {:>10}".format(
                      "model", "variant", "world", "batch", "samples/s", "threads")]
        for name, mod in s["models"].items():
            for p in mod["points"]:
                lines.append("{:<12} {:<22} {:>5} {:>6} {:>12} {:>10}".format(
                    name, p["variant"], p["world_size"], p["global_batch"], _rate(p["median"]),
                    p["threads_per_process"]))
            lines.append(f"{'':<12} efficiency strong {mod['strong_efficiency']:.2f}  weak "
                         f"{mod['weak_efficiency']:.2f}  all-reduced/step "
                         f"{mod['allreduce_bytes_per_step'] / 2**20:.2f} MiB (measured "
                         f"{mod['allreduce_bytes_per_step_measured'] / 2**20:.2f})  unpinned threads: "
                         f"{mod['oversubscribed_slowdown']:.2f}x slower")
    if "data" in results:
        d = results["data"]
        lines += ["", f"4 data pipeline (batch {d['batch_size']}; loader alone vs compute alone; "
                      f"pin_memory {d['pin_memory']})"]
        for pname, p in d["pipelines"].items():
            loaders = "  ".join(f"{k.split()[0]} {_rate(v['median'])} (start {v['startup_s_median']:.2f} s)"
                                for k, v in p["loader"].items())
            lines.append(f"  {pname}: loader {loaders}")
            for model, verdict in p["verdict"].items():
                keep = verdict["fewest_workers_to_keep_up"]
                lines.append(f"      {model}: compute {_rate(verdict['compute_samples_per_s'])} "
                             f"({verdict['compute_ms_per_batch']:.1f} ms/batch): "
                             + ("data-bound with 0 workers; " if verdict["data_bound_with_0_workers"]
                                else "compute-bound with 0 workers; ")
                             + (f"{keep} worker(s) keep up" if keep is not None
                                else "no tested worker count keeps up"))
    if "pool" in results:
        idle = results["pool"]["pool_idle"]
        lines.append(f"\n(the process pool used {idle['idle_cpu_s']:.2f} s of CPU while waiting "
                     f"{idle['idle_wall_s']:.1f} s for its turn)")
    lines.append(f"done in {results['duration_s']:.0f} s")
    if results.get("files"):
        lines.append(f"results: {results['files']['json']}  chart: {results['files']['png']}")
    return "\n".join(lines)


def targets_missed(results: dict) -> list:
    """Names of the measurements whose kit/hand-written ratio misses its target."""
    return [k for k in TARGETS if k in results and "ratio" in results[k]
            and not results[k]["within_target"]]
