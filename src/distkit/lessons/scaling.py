"""Scaling study: the unchanged ``training`` function at several world sizes.

What N processes buy and what they cost, measured rather than assumed:

- **strong scaling**: the GLOBAL batch is fixed, so each of N processes computes
  ``batch / N`` samples per step; the steps per epoch stay the same. Compute per step
  shrinks with N, the gradients all-reduced per step do not.
- **weak scaling**: the batch PER PROCESS is fixed, so the global batch grows with N and
  an epoch takes N times fewer steps. Fewer, larger steps learn less per epoch unless
  the learning rate grows too: the linear scaling rule with warm-up (Goyal et al. 2017,
  ``Config.scale_lr`` + ``warmup_epochs``).

Every configuration runs with ``EarlyStopping`` when asked (``Config.early_stopping_*``),
``repeats`` times; timings are medians over the repeats and over the epochs after the
first (the first pays for warm-up). Threads are pinned: every process gets the same
number of torch threads (default 1: one process is one worker, as one GPU would be), so
N processes use N times the cores of one; with more processes than cores the
processes share cores, and the numbers show what that costs.

One ``idist.Parallel`` launch per world size runs every configuration of that size in
turn, then measures the cost of one step (:func:`measure_step_costs`): compute alone
(``DistributedDataParallel.no_sync``), compute plus the gradient all-reduce, and the
all-reduce alone, with the bytes all-reduced per step.

    from distkit.config import Config
    from distkit.lessons.scaling import scaling_study, format_table

    if __name__ == "__main__":  # in a script: the processes are spawned, and import it
        study = scaling_study(Config(dataset="digits", epochs=4), world_sizes=(1, 2, 4))
        print(format_table(study["summary"]))

In a notebook ``idist.Parallel`` forks instead, and the guard is not needed.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import statistics
import time
from dataclasses import dataclass, field

import ignite.distributed as idist
import torch

from distkit.config import Config
from distkit.builtin.data import dataset_info
from distkit.errors import DistkitError

STRONG, WEAK = "strong", "weak"
PLAIN, SCALED = "same lr", "lr x N + warm-up"


@dataclass(frozen=True)
class Job:
    """One configuration of the study: which scaling mode and lr rule it stands for."""
    world_size: int
    per_process_batch: int
    scale_lr: bool
    labels: tuple = field(default=())  # ((mode, lr rule), ...): one run may serve several


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def plan(world_sizes=(1, 2, 4), strong_batch: int = 64, weak_batch: int = 16) -> list[Job]:
    """The configurations to run, each once even if it stands for several curves.

    Strong scaling keeps ``strong_batch`` global and the lr unchanged (the global batch
    does not change, so neither should the lr). Weak scaling keeps ``weak_batch`` per
    process, with and without the linear scaling rule; at N = 1 both are the baseline."""
    jobs: dict[tuple, list] = {}
    for n in world_sizes:
        if strong_batch % n:
            raise DistkitError(f"strong-scaling batch {strong_batch} does not divide by world size "
                               f"{n}: pick a batch that every world size divides")
        jobs.setdefault((n, strong_batch // n, False), []).append((STRONG, PLAIN))
        jobs.setdefault((n, weak_batch, False), []).append((WEAK, PLAIN))
        if n > 1:
            jobs.setdefault((n, weak_batch, True), []).append((WEAK, SCALED))
        else:  # lr x 1 and no warm-up: the one baseline of both weak-scaling curves
            jobs[(n, weak_batch, False)].append((WEAK, SCALED))
    return [Job(n, b, s, tuple(labels)) for (n, b, s), labels in jobs.items()]


def job_config(base: Config, job: Job, warmup_epochs: float, threads: int = 1) -> Config:
    """``base`` adapted to one job: global batch, lr rule, pinned threads."""
    return base.replace(
        batch_size=job.per_process_batch * job.world_size,
        scale_lr=job.scale_lr, warmup_epochs=warmup_epochs if job.scale_lr else 0.0,
        threads_per_process=threads,
        progress_bar=False, nproc_per_node=job.world_size)


# --- the cost of one step --------------------------------------------------------------

def gradient_bytes(model) -> int:
    """Bytes of gradient one step produces: what DDP all-reduces every step."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _median_time(fn, repeats: int) -> float:
    sync = torch.cuda.synchronize if idist.device().type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats):
        sync()
        idist.barrier()  # start together, so no rank's wait for another is counted
        start = time.perf_counter()
        fn()
        sync()  # a GPU works asynchronously: wait for it before reading the clock
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_step_costs(config: Config, per_process_batch: int, repeats: int = 20, warmup: int = 3) -> dict:
    """Seconds per training step of ``config.model`` with ``per_process_batch`` samples
    per process: compute alone, compute + gradient all-reduce, and the all-reduce alone;
    medians over ``repeats``, then the slowest rank. A collective: call on every rank."""
    from contextlib import nullcontext

    from torch.nn.parallel import DistributedDataParallel

    from distkit.train.training import initialize

    model, optimizer, criterion = initialize(config)
    info = dataset_info(config.dataset)
    g = torch.Generator().manual_seed(idist.get_rank())
    x = torch.randn(per_process_batch, info["in_channels"], info["image_size"], info["image_size"],
                    generator=g).to(idist.device())
    y = torch.randint(0, info["num_classes"], (per_process_batch,), generator=g).to(idist.device())
    ddp = isinstance(model, DistributedDataParallel)

    def step(sync: bool):
        with nullcontext() if sync or not ddp else model.no_sync():  # no_sync: skip the all-reduce
            optimizer.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step(True)
    nbytes = gradient_bytes(model)
    compute = _median_time(lambda: step(False), repeats)
    full = _median_time(lambda: step(True), repeats)
    flat = torch.zeros(nbytes // 4, device=idist.device())
    allreduce = _median_time(lambda: idist.all_reduce(flat), repeats) if ddp else 0.0
    n = idist.get_world_size()
    slowest = [idist.all_reduce(v, op="MAX") for v in (compute, full, allreduce)]
    return {
        "world_size": n,
        "per_process_batch": per_process_batch,
        "gradient_bytes": nbytes,
        "bytes_allreduced_per_step": nbytes if ddp else 0,
        # a ring all-reduce sends (and receives) 2 (N-1)/N of the buffer per process
        "bytes_sent_per_process": int(2 * (n - 1) / n * nbytes) if ddp else 0,
        "compute_s": slowest[0],
        "step_s": slowest[1],
        "allreduce_s": slowest[2],
        # the part of a step the all-reduce adds (what DDP could not overlap with backward)
        "communication_share": max(0.0, slowest[1] - slowest[0]) / slowest[1] if ddp else 0.0,
    }


# --- running the study ------------------------------------------------------------------

def _compact(results: dict, job: Job, repeat: int) -> dict:
    history = results["history"]
    times = [h["epoch_time_s"] for h in history]
    return {
        "world_size": job.world_size, "per_process_batch": job.per_process_batch,
        "global_batch": job.per_process_batch * job.world_size, "scale_lr": job.scale_lr,
        "labels": [list(label) for label in job.labels], "repeat": repeat,
        "peak_lr": results["peak_lr"],
        "threads_per_process": results["threads_per_process"],  # torch.get_num_threads(), as measured
        "epochs_completed": results["epochs_completed"], "iterations": results["iterations"],
        "epoch_times_s": times,
        "samples_per_epoch": results["samples_trained"] / max(1, len(history)),
        "final_val_loss": history[-1]["val_loss"], "final_val_accuracy": history[-1]["val_accuracy"],
        "val_losses": [h["val_loss"] for h in history],
        "run_dir": results["run_dir"],
    }


def _world_size_worker(local_rank: int, base: Config, jobs: list, repeats: int, warmup_epochs: float,
                       threads: int, cost_repeats: int) -> list | None:
    """One process of one world size: every job x repeat through the unchanged
    ``training`` function, then the step costs. Returns the rows on rank 0."""
    from distkit.train.training import training

    logging.disable(logging.INFO)  # ignite's INFO lines, once per run: keep the output short
    rows = []
    for repeat in range(repeats):
        for job in jobs:
            with contextlib.redirect_stdout(io.StringIO()):  # the per-epoch lines: in the rows
                results = training(local_rank, job_config(base, job, warmup_epochs, threads))
            if results is not None:
                rows.append({"kind": "run", **_compact(results, job, repeat)})
    for batch in sorted({job.per_process_batch for job in jobs}):
        config = job_config(base, jobs[0], warmup_epochs, threads)
        torch.set_num_threads(threads)
        costs = measure_step_costs(config, batch, repeats=cost_repeats)
        rows.append({"kind": "cost", **costs})
    return rows if idist.get_rank() == 0 else None


def run_world_size(base: Config, jobs: list, repeats: int = 2, warmup_epochs: float = 1.0,
                   threads: int = 1, cost_repeats: int = 20, backend: str = "gloo") -> list[dict]:
    """Start ``jobs[0].world_size`` processes once (:func:`distkit.launch.runner.run_per_rank`)
    and run all jobs in them; return rank 0's rows."""
    from distkit.launch.runner import run_per_rank

    n = jobs[0].world_size
    assert all(j.world_size == n for j in jobs)
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the processes
    try:
        return run_per_rank(_world_size_worker, n, backend, base, jobs, repeats, warmup_epochs,
                            threads, cost_repeats, timeout_s=base.timeout_s)[0]
    finally:
        if previous is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous


def scaling_study(base: Config, world_sizes=(1, 2, 4), strong_batch: int = 64, weak_batch: int = 16,
                  repeats: int = 2, warmup_epochs: float = 1.0, threads: int = 1,
                  cost_repeats: int = 20, backend: str = "gloo") -> dict:
    """Run :func:`plan` at every world size; return ``{"runs", "costs", "summary",
    "machine"}``. ``base`` gives the dataset, model, epochs, lr, seed, early stopping and
    output dir; the batch, lr rule, threads and process count are set per job."""
    base = base.replace().validate()
    jobs = plan(world_sizes, strong_batch, weak_batch)
    rows = []
    started = time.perf_counter()
    for n in world_sizes:
        rows += run_world_size(base, [j for j in jobs if j.world_size == n], repeats,
                               warmup_epochs, threads, cost_repeats, backend)
    runs = [r for r in rows if r["kind"] == "run"]
    costs = [r for r in rows if r["kind"] == "cost"]
    from distkit.observe.reporting import versions

    return {"runs": runs, "costs": costs, "summary": summarize(runs),
            "machine": {"cores": cores(), "threads_per_process": threads, "backend": backend,
                        **versions()},
            "wall_time_s": time.perf_counter() - started}


# --- summarizing ------------------------------------------------------------------------

def steady_epoch_time(epoch_times: list) -> float:
    """Median epoch time, leaving out the first epoch when there are others (it pays for
    warm-up: allocations, first all-reduce, caches)."""
    return statistics.median(epoch_times[1:] if len(epoch_times) > 1 else epoch_times)


def efficiency(samples_per_s: float, world_size: int, baseline_samples_per_s: float) -> float:
    """Scaling efficiency: the throughput of N processes over N times that of one.
    1.0 is linear scaling. Strong scaling: T1 / (N TN) of the epoch time; weak: the step
    time of 1 process over that of N; both reduce to this ratio of samples/s."""
    return samples_per_s / (world_size * baseline_samples_per_s)


def summarize(runs: list) -> list[dict]:
    """One row per (mode, lr rule, world size): medians over the repeats."""
    groups: dict[tuple, list] = {}
    for r in runs:
        for mode, rule in r["labels"]:
            groups.setdefault((mode, rule, r["world_size"]), []).append(r)
    rows = []
    for (mode, rule, n), rs in sorted(groups.items()):
        epoch = statistics.median(steady_epoch_time(r["epoch_times_s"]) for r in rs)
        rows.append({
            "mode": mode, "lr_rule": rule, "world_size": n,
            "per_process_batch": rs[0]["per_process_batch"], "global_batch": rs[0]["global_batch"],
            "peak_lr": rs[0]["peak_lr"], "threads_per_process": rs[0]["threads_per_process"],
            "repeats": len(rs), "epoch_time_s": epoch,
            "samples_per_s": statistics.median(r["samples_per_epoch"] for r in rs) / epoch,
            "epochs_completed": statistics.median(r["epochs_completed"] for r in rs),
            "final_val_loss": statistics.median(r["final_val_loss"] for r in rs),
            "final_val_accuracy": statistics.median(r["final_val_accuracy"] for r in rs),
        })
    for row in rows:
        # the baseline: 1 process, same mode and lr rule (at N = 1 both rules are one run)
        base = next((b for b in rows if (b["mode"], b["lr_rule"], b["world_size"]) ==
                     (row["mode"], row["lr_rule"], 1)), None)
        row["speedup"] = row["samples_per_s"] / base["samples_per_s"] if base else None
        row["efficiency"] = (efficiency(row["samples_per_s"], row["world_size"], base["samples_per_s"])
                             if base else None)
    return rows


def format_table(summary: list) -> str:
    """The summary as a fixed-width text table (every number the plots show)."""
    head = (f"{'mode':6} {'lr rule':17} {'N':>2} {'batch/proc':>10} {'global':>6} {'peak lr':>7} "
            f"{'thr':>3} {'s/epoch':>8} {'samples/s':>9} {'speedup':>7} {'effic.':>6} "
            f"{'epochs':>6} {'val loss':>8} {'val acc':>7}")
    lines = [head, "-" * len(head)]
    for r in summary:
        lines.append(
            f"{r['mode']:6} {r['lr_rule']:17} {r['world_size']:>2} {r['per_process_batch']:>10} "
            f"{r['global_batch']:>6} {r['peak_lr']:>7.3f} {r['threads_per_process']:>3} "
            f"{r['epoch_time_s']:>8.3f} {r['samples_per_s']:>9.0f} {_num(r['speedup'], 7, 2)} "
            f"{_num(r['efficiency'], 6, 2)} {r['epochs_completed']:>6g} {r['final_val_loss']:>8.4f} "
            f"{r['final_val_accuracy']:>7.4f}")
    return "\n".join(lines)


def format_costs(costs: list) -> str:
    """Per world size and batch per process: bytes all-reduced and time per step."""
    head = (f"{'N':>2} {'batch/proc':>10} {'bytes all-reduced':>17} {'sent/proc':>10} "
            f"{'compute ms':>10} {'step ms':>8} {'all-reduce ms':>13} {'comm share':>10}")
    lines = [head, "-" * len(head)]
    for c in sorted(costs, key=lambda c: (c["world_size"], -c["per_process_batch"])):
        lines.append(
            f"{c['world_size']:>2} {c['per_process_batch']:>10} {c['bytes_allreduced_per_step']:>17,} "
            f"{c['bytes_sent_per_process']:>10,} {1e3 * c['compute_s']:>10.2f} {1e3 * c['step_s']:>8.2f} "
            f"{1e3 * c['allreduce_s']:>13.2f} {c['communication_share']:>10.0%}")
    return "\n".join(lines)


def _num(v, width, digits):
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"
