"""2 and 3. Processes: the kit vs hand-written DDP in the same gloo processes, and
scaling (world sizes 1 and N, strong and weak, pinned and oversubscribed threads), run
in one pool of processes that takes turns with this process round by round."""
from __future__ import annotations

import logging
import os
import queue
import statistics
import threading
import time

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.utils import manual_seed
from torch.utils.data import DataLoader

from distkit.bench.method import (TARGETS, Settings, compare, interleaved, paired_extra_us, summarize,
                                  timed, torch_threads)
from distkit.bench.sides import KitRun, bench_config, handwritten_epochs, handwritten_setup, linear_decay
from distkit.compat.shims import broadcast_text
from distkit.config import Config
from distkit.builtin.data import get_dataflow, synthetic_dataset
from distkit.errors import DistkitError
from distkit.host.facts import threads_per_process
from distkit.lessons.scaling import gradient_bytes, measure_step_costs
from distkit.builtin.models import MLP, get_model
from distkit.launch.runner import run_per_rank
from distkit.train.training import initialize

POOL_TIMEOUT_S = 900  # bound on any collective and on any wait for the process pool

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
        steps, sides = _ddp_sides(bench_config(settings, runs=runs), world_size, threads, runs)
        variants.update({f"ddp/{k}": side for k, side in sides.items()})
        info["ddp_steps_per_run"] = steps
        # the same on a model so small that a step is almost all overhead
        small = bench_config(settings, model="mlp", batch_size=8 * world_size, runs=runs,
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
        # Where a step's time goes (compute alone, + all-reduce, all-reduce alone): the
        # scaling study's own probe, on the kit's CNN at the strong-scaling batch.
        info["cnn_step_costs"] = measure_step_costs(
            Config(dataset="synthetic", model="cnn"), settings.batch_size // world_size,
            repeats=max(3, settings.scaling_steps), warmup=settings.warmup)
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
        name = broadcast_text(name, src=0)
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
    """``world_size`` gloo processes started by the kit's one process runner
    (:func:`distkit.launch.runner.run_per_rank`, in a thread) and kept alive, so that their
    variants can take turns, round by round, with the world-size-1 sides that run in this
    process: this process sends a variant's name and waits (without using CPU) for its
    result.

    Why persistent rather than one ``run_per_rank`` call per side: interleaving needs a
    1-process side and an N-process side back to back in every round, and a fresh launch
    per side would add seconds of start-up (imports, process group) to every round and
    time the launcher instead of the training step. So the pool is one ``run_per_rank``
    call whose worker loops over the names it is sent."""

    def __init__(self, settings, world_size, threads, cores, tasks):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        self.world_size, self.error = world_size, None
        job = {"settings": settings, "threads": threads, "cores": cores, "tasks": tuple(tasks),
               "commands": self.commands, "results": self.results}
        previous = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(threads)  # as distkit.launch.entry.run does
        self.thread = threading.Thread(target=self._run, args=(job,), daemon=True)
        self.thread.start()
        try:
            _, self.info = self._get("ready")
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous

    def _run(self, job):
        try:
            run_per_rank(_pool_worker, self.world_size, "gloo", job, start_method="spawn",
                         timeout_s=POOL_TIMEOUT_S)
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
            sides[f"{name}/1"] = _with_threads(timed(solo), threads)
            sides[f"{name}/1-all-cores"] = _with_threads(timed(every_core), cores)
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
            "cpu_us_per_step_per_process_rounds": {
                k: [1e6 * 8 / r for r in cpu[f"ddp-probe/{k}"]] for k in ("kit", "hand-written")},
            "kit_extra_cpu_us_per_step_per_process": paired_extra_us(
                {k: cpu[f"ddp-probe/{k}"] for k in ("kit", "hand-written")}, 8)["kit"],
            "hand_written_step_ms_of_the_real_model": step_ms,
        }
    if "scaling" in tasks:
        out["scaling"] = _scaling_report(settings, rates, world, threads, cores, pool.info)
    return out


def _with_threads(side, n):
    def run():
        with torch_threads(n):
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
        if name == "cnn":
            models[name]["step_costs"] = info["cnn_step_costs"]
    return {"world_sizes": [1, world], "threads_per_process": threads, "cores": cores,
            "steps_per_run": settings.scaling_steps, "per_process_batch_weak": settings.batch_size,
            "models": models}

