# %% [markdown]
# # 15 · Seeing every rank: profiler traces, merged and drawn (CPU, gloo)
#
# ignite's profilers (notebook 06) and `Timer` (notebook 07) say how long each event
# takes *on average*. They cannot say **when**: whether the gradient all-reduce runs
# while the backward is still computing, whether a slow rank makes the others wait,
# when FSDP gathers a layer's weights. A **trace** says it: `torch.profiler` records
# every operator with its start and end on each rank, and the ranks' traces, merged on
# one time axis, show who did what, when. This notebook, on nothing but a CPU:
#
# 1. records a trace on every rank of a DDP run with `torch.profiler.profile`, a
#    `schedule` and `record_function` ranges, writes it with `export_chrome_trace`,
#    merges the ranks into one timeline and draws it;
# 2. measures when DDP launches its all-reduce and how much of it is hidden under the
#    backward, for small and large gradient buckets (`bucket_cap_mb`) and under `no_sync`;
# 3. slows one rank on purpose and reads, off the trace, how long the others wait;
# 4. shows FSDP's all-gathers in the forward and its reduce-scatters in the backward;
# 5. reads a pipeline's bubble (GPipe and 1F1B) off the trace, against the formula of
#    notebook 11.
#
# Hardware: any CPU. Backend: `gloo`. The timings come from a loaded 2-core machine, so
# every assertion below leaves room for scheduling noise and says how much.

# %%
import json
import os
import statistics
import tempfile
import time

import ignite
import ignite.distributed as idist
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from distkit import tracing
from distkit.machine import cpu_only_processes, free_port, quiet_ignite_logs

quiet_ignite_logs()
# no kineto lines on stderr: ERROR ones on a CPU-only build, and (torch 2.15) a USDT line
# at every profiler start and stop, the one level above ERROR; 6 is above both
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
folder = tempfile.mkdtemp(prefix="distkit-nb15-")  # every trace of this notebook goes here
print(f"torch {torch.__version__}, ignite {ignite.__version__}, {os.cpu_count()} CPU cores")

# %% [markdown]
# ## 1. A trace on every rank
#
# `torch.profiler.profile` records the operators that run inside it. A long run would
# make a huge file, so a `schedule` says which steps to record: skip `wait` steps, run
# `warmup` steps with the profiler on but throw them away (its start-up cost lands
# there), then record `active` steps. `prof.step()` marks the end of each step, and
# `on_trace_ready` runs when the active steps are done: here it calls
# `export_chrome_trace`, which writes the Chrome trace format that Perfetto
# (ui.perfetto.dev) and `chrome://tracing` open.
#
# `record_function("forward")` adds a named range of our own to the trace: the phases
# of a step. The collectives name themselves: gloo's work shows as `gloo:all_reduce`
# on gloo's own worker threads, from the moment it starts to the moment every peer has
# answered.
#
# The model: 8 linear layers of 256 x 256 (2.1 MB of fp32 gradients), wrapped in
# `DistributedDataParallel`. DDP groups the gradients into **buckets** of at most
# `bucket_cap_mb` (25 MB by default) and launches a bucket's all-reduce as soon as
# every gradient in it is ready, while the backward computes the earlier layers.

# %%
STEPS = dict(wait=1, warmup=1, active=3)
LAYERS, WIDTH, BATCH = 8, 256, 64


# %%
def ddp_steps(name, bucket_cap_mb=None, accumulate=1, straggle=0.0):
    """Train a few steps under DDP with the profiler on; in each recorded step rank 1
    sleeps ``straggle`` times the warm-up step's time (the slowest rank's; at least 0.2 s)
    in its forward.
    Writes this rank's trace to ``<folder>/<name>-rank<r>.json``."""
    rank = idist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH // idist.get_world_size(), WIDTH)
    path = f"{folder}/{name}-rank{rank}.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(**STEPS),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        for step in range(sum(STEPS.values())):
            recording = step >= STEPS["wait"] + STEPS["warmup"]
            if step == STEPS["wait"] + STEPS["warmup"]:
                tracing.clock_sync()  # marks for aligning the ranks' clocks (section 1)
            started = time.perf_counter()
            for micro in range(accumulate):
                last = micro == accumulate - 1
                # no_sync: no all-reduce in this backward; the gradients accumulate locally
                with (model.no_sync() if not last else torch.enable_grad()):
                    with record_function("forward"):
                        if rank == 1 and straggle and recording:
                            with record_function("straggle"):
                                time.sleep(min(2.0, max(0.2, straggle * step_s)))
                        loss = model(x).square().mean()
                    with record_function("backward"):
                        loss.backward()
            with record_function("optimizer step"):
                optimizer.step()
                optimizer.zero_grad()
            if step == STEPS["wait"]:  # the warm-up step: how long a step takes, slowest rank
                step_s = idist.all_reduce(time.perf_counter() - started, op="MAX")
            prof.step()
    return path


# %%
def launch(fn, *args):
    """Run ``fn(*args)`` on 2 gloo ranks started by idist.Parallel (fork)."""
    # (cpu_only_processes: gloo processes on the CPU, even where a GPU is; notebook 01 says why)
    with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=2,
                                              master_port=free_port()) as parallel:
        parallel.run(fn, *args)


def merged(name, world_size=2):
    return tracing.merge([tracing.load(f"{folder}/{name}-rank{r}.json") for r in range(world_size)])


# %% [markdown]
# Each rank wrote its own trace. Their clocks need not agree (on two machines they
# never do), so at the first recorded step `tracing.clock_sync()` plays ping-pong
# between rank 0 and each other rank and marks the moments in each trace; rank r's
# clock offset is read from those marks, within half the shortest round trip, as NTP
# does. `tracing.merge` then shifts every rank's events by its offset and makes each
# rank one process row (`pid` = rank, named "rank r"), the file Perfetto shows as one
# row per rank.

# %%
def all_ddp_runs(local_rank):
    ddp_steps("default")                     # DDP's own buckets (25 MB)
    ddp_steps("small", bucket_cap_mb=0.25)   # a quarter MiB: one layer per bucket, 8 buckets
    ddp_steps("large", bucket_cap_mb=100)    # one bucket holds every gradient
    ddp_steps("no_sync", accumulate=4)       # 4 micro-batches, all-reduce on the last only
    ddp_steps("straggler", straggle=2.0)      # section 3


start = time.perf_counter()
launch(all_ddp_runs)
print(f"5 traced runs on 2 ranks in {time.perf_counter() - start:.1f} s")
trace = merged("default")
clock = trace["distkit"]["clock"]
print(f"rank 1's clock minus rank 0's: {clock['offset_us'][1]:+.0f} us, "
      f"known within +-{clock['error_us'][1]:.0f} us")
rows = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
print(rows, f"{len(trace['traceEvents'])} events,",
      f"{len(json.dumps(trace)) / 1e6:.1f} MB as JSON")
assert rows == {0: "rank 0", 1: "rank 1"}
# one host, one clock: the offset found is the alignment's own error, within its bound
assert abs(clock["offset_us"][1]) <= clock["error_us"][1] + 1

# %%
tracing.timeline(trace, phases=("forward", "backward", "optimizer step"),
                 title="DDP, default buckets: 2 ranks, 3 recorded steps");

# %% [markdown]
# ## 2. How much of the all-reduce hides under the backward
#
# The picture shows the all-reduce starting inside the backward. Two things decide how
# much of it runs while the backward still computes:
#
# - **when DDP launches it**: a bucket's all-reduce is launched (`c10d::allreduce_`, on
#   the rank's main thread) the moment the last gradient in that bucket is ready. The
#   more of the backward's work is still to come at that moment, the more the
#   all-reduce *can* hide under it. This is fixed by the bucket sizes: it is the same
#   in every run, on every machine;
# - **whether it then runs**: gloo carries out the all-reduce on a thread of its own
#   (`gloo:all_reduce`), which needs a free core (and, between machines, the network)
#   while the main thread computes. That depends on the machine and on its load.
#
# Both can be read off the trace. The backward's own **compute** is the autograd
# operators on the rank's main thread (`autograd::engine::evaluate_function: ...`).
# The **work left at the launch** is the share of those operators that start after the
# step's first all-reduce was launched. The **hidden fraction** is the time the
# `gloo:all_reduce` ranges and the compute ran at once, divided by the communication
# time (`tracing.overlap` and `tracing.total` intersect and add up intervals).

# %%
def backward_compute(trace, rank):
    return tracing.spans(trace, rank, lambda n: n.startswith("autograd::engine::evaluate_function"))


def hidden(trace):
    """Per rank: (all-reduce calls, communication ms, fraction hidden under backward compute)."""
    out = []
    for rank in (0, 1):
        comm = tracing.collective_spans(trace, rank, "all_reduce")
        both = tracing.overlap(comm, backward_compute(trace, rank))
        out.append((len(comm), tracing.total(comm) / 1e3, both / tracing.total(comm)))
    return out


def work_left_at_launch(trace, rank):
    """Per recorded step: the share of the backward's operators that start after DDP
    launched the step's first all-reduce."""
    launches = tracing.spans(trace, rank, "c10d::allreduce_")
    shares = []
    for a, b in tracing.steps(trace, rank):
        first = min(start for start, _ in launches if a <= start <= b)
        started = [start for start, _ in backward_compute(trace, rank) if a <= start <= b]
        shares.append(sum(start > first for start in started) / len(started))
    return shares


runs = ("small", "default", "large", "no_sync")
study = {name: hidden(merged(name)) for name in runs}
left = {name: [work_left_at_launch(merged(name), r) for r in (0, 1)] for name in runs}
for name, ranks in study.items():
    print(f"{name:8s}", "   ".join(f"rank {r}: {n:2d} all-reduces, {ms:6.1f} ms, {f:4.0%} hidden"
                                    for r, (n, ms, f) in enumerate(ranks)))
    seen = sorted({f"{x:.0%}" for shares in left[name] for x in shares})  # over steps and ranks
    print(f"{'':8s} each step's first all-reduce launched with {' or '.join(seen)} of the backward to run")

# %% [markdown]
# What the numbers say. The launches first, each checked below; they come out the same
# in every run:
#
# - with DDP's **default** buckets the first all-reduce is launched while part of the
#   backward is still to run: DDP's first bucket is small (1 MB,
#   `dist._DEFAULT_FIRST_BUCKET_BYTES`), so it is ready after the last layers' gradients;
# - with **small** buckets (a quarter MiB) there are more all-reduces, and the first is
#   launched after the last layer's gradient, with most of the backward to come; **one
#   large** bucket's single all-reduce is launched when the last gradient is ready,
#   with nothing left to hide under;
# - under **`no_sync`**, 3 of every 4 backwards all-reduce nothing: over the same 3
#   recorded optimizer steps, the number of all-reduces is that of the default run,
#   for 4 times the samples.
#
# The hidden fractions are the machine's part. On a machine with a core free for gloo's
# thread, the runs that launch early hide the most. On a loaded 2-core machine, such as
# the one that recorded this notebook, gloo's thread often waits for a core until the
# backward is over: the fractions then move from run to run, and even between the two
# ranks of one run. Run the cells again and watch them move while the launches stay put.
# That is why they are printed, not checked. (Even the large bucket, launched with no
# backward work to come, can show some time "hidden": the operator that launched it
# is still open, finishing its own work or waiting for a core, while gloo's thread runs.)

# %%
first = {name: [x for ranks in left[name] for x in ranks] for name in runs}  # every step, both ranks
calls = {name: [n for n, _, _ in ranks] for name, ranks in study.items()}
assert min(first["default"]) > 0, first["default"]
assert calls["small"][0] > calls["large"][0], calls
assert max(first["large"]) == 0, first["large"]
assert min(first["small"]) > max(first["default"]), first
assert calls["no_sync"] == calls["default"], calls
print("launches checked:", {name: f"{min(shares):.0%}-{max(shares):.0%}" for name, shares in first.items()})

# %% [markdown]
# ## 3. A straggler: everyone waits for the slowest rank
#
# In the run named `straggler`, rank 1 slept in every recorded forward, twice as long
# as a warm-up step took, and at least 0.2 s, so that the wait stands out of a loaded
# machine's noise (at most 2 s; a range named `straggle` in its trace says how long).
# Synchronous data parallelism cannot leave it behind: rank 0's all-reduce starts on
# time, but it cannot finish until rank 1 joins. So rank 0's all-reduces last longer
# than rank 1's, by about the time rank 1 slept. The slow rank is the one that **waits least** in the collectives: it arrives
# last and finds the others there.

# %%
slow = merged("straggler")
slept_ms = tracing.total(tracing.spans(slow, 1, "straggle")) / 1e3 / len(tracing.steps(slow, 1))
comm_ms = [tracing.total(tracing.collective_spans(slow, r, "all_reduce")) / 1e3 for r in (0, 1)]
step_ms = [statistics.median(b - a for a, b in tracing.steps(slow, r)) / 1e3 for r in (0, 1)]
found = min((0, 1), key=lambda r: comm_ms[r])
waited_ms = (comm_ms[0] - comm_ms[1]) / len(tracing.steps(slow, 0))
print(f"time in all-reduce per rank (3 steps): {comm_ms[0]:.1f} ms, {comm_ms[1]:.1f} ms; "
      f"step {step_ms[0]:.1f} ms")
print(f"the slow rank is rank {found}; it slept {slept_ms:.1f} ms a step, and rank 0 waited "
      f"{waited_ms:.1f} ms a step for it, {waited_ms / step_ms[0]:.0%} of its step")
assert found == 1
# rank 0 waited at least half of what rank 1 slept (the bound leaves room for a loaded
# machine, where either rank may lose the core for a while)
assert waited_ms > 0.5 * slept_ms, (waited_ms, slept_ms)

# %%
tracing.timeline(slow, phases=("forward", "backward", "optimizer step"),
                 title="rank 1 sleeps in each forward: rank 0's all-reduce waits");

# %% [markdown]
# ## 4. FSDP: gather before the forward, reduce-scatter in the backward
#
# `fully_shard` (notebook 10) keeps 1/N of each layer on each rank. Before a unit's
# forward it **all-gathers** the full weights; in the backward it gathers them again,
# computes the gradients and **reduce-scatters** them, so each rank receives the sum for
# its own shard. FSDP names its steps in the trace itself (`FSDP::all_gather (<layer>)`,
# `FSDP::pre_backward`, ...); the c10d call `c10d::_reduce_scatter_base_` is the
# reduce-scatter, and on gloo the trace shows it carried out as a `gloo:all_reduce`.
# Checked below on each rank: every step's first all-gather starts before its first
# matmul; some all-gathers run in the forwards and the rest outside them (in the
# backwards); every reduce-scatter lies inside a backward.

# %%
def fsdp_steps(local_rank):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH // 2, WIDTH)
    path = f"{folder}/fsdp-rank{idist.get_rank()}.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(**STEPS),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        for step in range(sum(STEPS.values())):
            if step == STEPS["wait"] + STEPS["warmup"]:
                tracing.clock_sync()
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer step"):
                optimizer.step()
                optimizer.zero_grad()
            prof.step()


# %%
launch(fsdp_steps)
fsdp = merged("fsdp")
for rank in (0, 1):
    forward, backward = tracing.spans(fsdp, rank, "forward"), tracing.spans(fsdp, rank, "backward")
    gathers = tracing.collective_spans(fsdp, rank, "all_gather")
    scatters = tracing.spans(fsdp, rank, "c10d::_reduce_scatter_base_")
    matmuls = tracing.spans(fsdp, rank, "aten::addmm")
    in_forward = [g for g in gathers if tracing.overlap([g], forward) > 0]
    print(f"rank {rank}: {len(gathers)} all-gathers ({len(in_forward)} in the forwards), "
          f"{len(scatters)} reduce-scatters, all in the backwards: "
          f"{tracing.overlap(scatters, backward) == tracing.total(scatters)}")
    # every step's first all-gather starts before that step's first matmul
    for a, b in forward:
        first_gather = min(g[0] for g in gathers if a <= g[0] <= b)
        first_matmul = min(m[0] for m in matmuls if a <= m[0] <= b)
        assert first_gather < first_matmul
    assert 0 < len(in_forward) < len(gathers)
    assert len(scatters) == 3 * 4  # 3 steps x 4 layers (the root holds no parameters)
    assert tracing.overlap(scatters, backward) == tracing.total(scatters)

# %%
tracing.timeline(fsdp, phases=("forward", "backward", "optimizer step"),
                 title="FSDP: all-gathers in the forward, reduce-scatters (as gloo all-reduces) in the backward");

# %% [markdown]
# ## 5. A pipeline's bubble, read off the trace
#
# Notebook 11 cut a model into 2 stages and measured the **bubble**, the share of a step
# a stage sits idle, against the formula (p − 1)/(m + p − 1) for p stages and m
# micro-batches. Here the same schedules run inside `profile`, and the bubble is read
# off their traces. Each stage holds a `Timed` layer (from `distkit.lessons.pipeline`,
# as in notebook 11) that sleeps 3 ms per sample in the forward and 6 ms in the
# backward, so the stage's work takes the same time however busy the cores are; it is
# an autograd function, so the trace names its forward `_Sleep` and its backward
# `_SleepBackward`. A rank's busy time is the union of those ranges; the step is the
# span from the first of them on any rank to the last. `Timed` also keeps its own log
# of when it slept (`distkit.lessons.pipeline.BUSY`, the clock notebook 11 read): the
# trace's ranges must hold those sleeps, so never show less busy time than the log, and
# more only by the Python work around each sleep (entering the autograd function,
# saving for backward), a few percent on a quiet machine, more where the processes wait
# for a core.

# %%
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from distkit.lessons import pipeline as timed_stage
from distkit.lessons.pipeline import Timed, bubble_model

MICRO = 4


def pipeline_steps(local_rank):
    rank = idist.get_rank()
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    logged = {}
    for name, Schedule in (("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)):
        part = nn.Sequential(nn.Linear(64, 64), Timed(0.003, 0.006))  # this rank's stage
        stage = PipelineStage(part, stage_index=rank, num_stages=2, device=torch.device("cpu"))
        pipe = Schedule(stage, n_microbatches=MICRO, loss_fn=nn.functional.mse_loss)
        for recorded in (False, True):  # a warm-up step, then the recorded one
            timed_stage.BUSY.clear()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                tracing.clock_sync()
                if rank == 0:
                    pipe.step(x)
                else:
                    pipe.step(target=y)
        prof.export_chrome_trace(f"{folder}/{name}-rank{rank}.json")
        logged[name] = sum(end - start for start, end in timed_stage.BUSY) * 1e6  # us
    with open(os.path.join(folder, f"busy-rank{rank}.json"), "w") as f:
        json.dump(logged, f)


# %%
launch(pipeline_steps)
model = bubble_model(2, MICRO)
bubbles = {}
for name in ("GPipe", "1F1B"):
    pipe_trace = merged(name)
    busy = [tracing.spans(pipe_trace, r, ("_Sleep", "_SleepBackward")) for r in (0, 1)]
    span = max(b for ranks in busy for _, b in ranks) - min(a for ranks in busy for a, _ in ranks)
    bubbles[name] = [1 - tracing.total(ranks) / span for ranks in busy]
    print(f"{name}: bubble rank 0 {bubbles[name][0]:.3f}, rank 1 {bubbles[name][1]:.3f}; formula "
          f"(p-1)/(m+p-1) = {model:.3f} for p = 2, m = {MICRO}")
    for rank in (0, 1):
        with open(os.path.join(folder, f"busy-rank{rank}.json")) as f:
            log_us = json.load(f)[name]
        traced_us = tracing.total(busy[rank])
        print(f"  rank {rank}: busy {traced_us / 1e3:.1f} ms in the trace, {log_us / 1e3:.1f} ms "
              f"slept by Timed's own clock (+{traced_us / log_us - 1:.1%} around the sleeps)")
        # the ranges hold the sleeps (0.5 %: the two clocks' rounding), and the work
        # around them stays a small part (a quarter at most, even on a loaded machine)
        assert 0.995 * log_us <= traced_us <= 1.25 * log_us, (traced_us, log_us)

# %% [markdown]
# The bubble read off the trace is larger than the formula's. Why, and by how much, can
# be measured from the same trace. The formula describes an ideal run: every forward
# takes the same time, every backward too, and each piece of work starts the moment it
# can: when the work before it on its stage has ended and, if it needs the other
# stage's output (stage 1's forward of micro-batch i, stage 0's backward of micro-batch
# i), when that work has ended. The trace holds every piece of work (`_Sleep`,
# `_SleepBackward`: which micro-batch, when, how long), so that ideal run can be
# **replayed** in a few lines, in the order each stage ran its work:
#
# - with the nominal lengths (3 ms and 6 ms per sample), the replay *is* the formula;
# - with the lengths the trace measured (a sleep overshoots on a loaded machine), it is
#   the formula for *these* pieces of work;
# - the trace also shows how late each piece started after it could have: its
#   **delay**, the hand-off through `send`/`recv`, the schedule's Python work and the
#   wait for a core. Replayed with the run's mean delay added to every piece, the bubble
#   must come out as the trace's, within 0.10 either way (the delays are uneven; a
#   mean stands for them).

# %%
from distkit.lessons.pipeline import replay, stage_delays, stage_work

TOLERANCE = 0.10
for name in ("GPipe", "1F1B"):
    work = [stage_work(merged(name), r) for r in (0, 1)]
    order = [list(w) for w in work]
    measured = {(r, *key): b - a for r in (0, 1) for key, (a, b) in work[r].items()}
    nominal = {key: (3e3 if key[1] == "F" else 6e3) * 32 / MICRO for key in measured}  # us
    busy = [sum(v for k, v in measured.items() if k[0] == r) for r in (0, 1)]
    late = stage_delays(work)
    mean_delay = statistics.mean(late)
    ideal_nominal = 1 - sum(v for k, v in nominal.items() if k[0] == 0) / replay(order, nominal)
    ideal = [1 - u / replay(order, measured) for u in busy]
    with_delays = [1 - u / replay(order, measured, mean_delay) for u in busy]
    print(f"{name}: replayed with nominal lengths {ideal_nominal:.3f} (formula {model:.3f}); "
          f"with the measured lengths {ideal[0]:.3f}, {ideal[1]:.3f}; mean delay "
          f"{mean_delay / 1e3:.1f} ms a piece (of {len(late)}), replayed with it "
          f"{with_delays[0]:.3f}, {with_delays[1]:.3f}; the trace: {bubbles[name][0]:.3f}, "
          f"{bubbles[name][1]:.3f}")
    assert abs(ideal_nominal - model) < 1e-9  # the formula is this replay
    for r in (0, 1):
        # nothing beats the ideal run: the trace's bubble is never below it (0.02: timer noise)
        assert bubbles[name][r] >= ideal[r] - 0.02, (name, r, bubbles[name], ideal)
        # the delays explain the rest, both ways
        assert abs(bubbles[name][r] - with_delays[r]) <= TOLERANCE, (name, r, bubbles[name], with_delays)

# %% [markdown]
# So the formula is right about the schedule (the replay with equal pieces gives it
# exactly), and the trace's larger bubble is the delays: each hand-off between the
# stages (`send`, `recv`) and each piece of work waits for Python and for a core before
# it starts. On a quiet machine with real compute the delays are a small share of each
# piece and the trace's bubble comes close to the formula; on the loaded 2-core machine
# that recorded this notebook they were tens of milliseconds against pieces of 24 and
# 48 ms, which is why its bubble was far above the formula. The timeline shows them:
# the gaps between one stage's ranges while the other stage's message is on its way.

# %%
tracing.timeline(merged("1F1B"), phases=("_Sleep", "_SleepBackward"),
                 title=f"1F1B, 2 stages, {MICRO} micro-batches: forwards and backwards alternate");

# %% [markdown]
# ## What you saw
#
# - `torch.profiler.profile` with a `schedule` records a few steps after a warm-up;
#   `record_function` names your phases; `export_chrome_trace` writes one file per rank;
#   merged with their clocks aligned, they show every rank on one time axis.
# - DDP launches a bucket's all-reduce as soon as the bucket's gradients are ready:
#   smaller buckets launch earlier, with more of the backward left to hide under; how
#   much really hides depends on a free core (or link) for the communication.
#   `no_sync` skips the all-reduce of the micro-batches it covers.
# - One slow rank makes every other rank wait in the collective; the trace says which
#   rank and for how long.
# - FSDP all-gathers before computing and reduce-scatters in the backward.
# - A pipeline's idle time is in its trace too: GPipe's and 1F1B's bubbles, read off
#   the trace, are the formula (p − 1)/(m + p − 1) replayed with the run's own pieces of
#   work, plus the delays of their hand-offs, measured.
#
# `distkit train --trace` does all of this for a training run: per-rank traces, the
# merged file and its drawing in the run folder (`docs/tracing.md`). Exercise 15 asks you
# to find the slow rank in such a trace yourself.
