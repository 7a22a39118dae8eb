# %% [markdown]
# # 16 · When a run hangs: torch's Flight Recorder and the kit's verdict (CPU, gloo)
#
# "Why does it hang?" is the most asked question of distributed training. A collective
# returns on a rank only when **every** rank of its group has called the **same**
# collective with tensors of the **same** size. When one rank calls another op, or skips
# one, or is still computing, the others wait; torch's only word, after the process
# group's timeout, is one rank's "Timed out waiting ... for recv operation", at that
# rank's line, and nothing about the others. This notebook, on nothing but a CPU:
#
# 1. causes hangs on purpose in functions started by `idist.Parallel` (gloo, a 2 s
#    timeout, so that each hang costs seconds, not the default 30 minutes);
# 2. reads torch's own record of every collective, its **Flight Recorder**, with
#    `torch._C._distributed_c10d._dump_fr_trace_json()` on every rank, and finds the
#    disagreement in the dumps yourself;
# 3. lets the kit read them (`distkit.launch_function`, the launcher behind
#    `distkit launch` and `distkit train`): one line per rank and a verdict;
# 4. turns on `TORCH_DISTRIBUTED_DEBUG=DETAIL`, which checks every collective across
#    the ranks before it runs: what it catches, and what it costs;
# 5. says how the same reading is done on a GPU cluster (nccl).
#
# Hardware: any CPU. Backend: `gloo`.

# %%
import contextlib
import datetime
import io
import json
import logging
import os
import shutil
import statistics
import tempfile
import time

import ignite
import ignite.distributed as idist
import torch
import torch.distributed as dist

import distkit
from distkit.errors import DistkitError
from distkit.host.facts import cpu_only_processes, free_port, quiet_ignite_logs

quiet_ignite_logs()
# torch's spawn says "Terminating process N via signal SIGTERM" when a rank fails: each
# cell below says what happened in its own words
logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
folder = tempfile.mkdtemp(prefix="distkit-16-")  # every dump of this notebook goes here
TIMEOUT = datetime.timedelta(seconds=2)  # the process group's timeout: how long a hang lasts
print(f"torch {torch.__version__}, ignite {ignite.__version__}, {os.cpu_count()} CPU cores")

# %% [markdown]
# ## 1. Three ways to hang
#
# Each function below runs on every rank. They start alike: two `all_reduce` calls that
# every rank makes, so the ranks agree on collectives #1 and #2 of their own calls. Then
# they disagree:
#
# - `wrong_op`: rank 0 calls `all_reduce`, rank 1 calls `broadcast`. Both wait for a
#   partner that never comes.
# - `skips_one`: on 3 ranks, rank 2 skips the third `all_reduce` (it computes, here
#   sleeps, for longer than the timeout). Ranks 0 and 1 wait for it.
# - `different_sizes`: every rank calls `all_reduce`, rank 1 with half as many
#   elements. Without a check, gloo's ranks exchange pieces of the wrong size: a rank
#   may be aborted from C++ (SIGABRT), or go on with a sum computed from garbage. This
#   one runs in section 4 only, under the check that stops it.

# %%
def agree():
    """Two collectives every rank makes."""
    x = torch.ones(1000)
    dist.all_reduce(x)
    dist.all_reduce(x)


def wrong_op(local_rank):
    agree()
    x = torch.ones(1000)
    if idist.get_rank() == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)


def skips_one(local_rank):
    agree()
    if idist.get_rank() == 2:
        time.sleep(1.5 * TIMEOUT.total_seconds())  # computing: never reaches the all_reduce
        return
    dist.all_reduce(torch.ones(1000))


def different_sizes(local_rank):
    agree()
    dist.all_reduce(torch.ones(1000 if idist.get_rank() == 0 else 500))


# %% [markdown]
# ## 2. What torch recorded: the Flight Recorder
#
# torch 2.15 records every collective of every process group, on gloo too, in a ring
# buffer of 2000 entries per process (`TORCH_FR_BUFFER_SIZE` sets its size, `0` turns it
# off; `_maybe_attach_flight_recorder` in `torch/distributed/distributed_c10d.py`). An
# entry holds the group, the collective's number in that group (`collective_seq_id`),
# the op (`profiling_name`, e.g. `gloo:all_reduce`), the input sizes and dtypes.
# `torch._C._distributed_c10d._dump_fr_trace_json()` returns the buffer as JSON (bytes),
# from any thread, in microseconds.
#
# `dumped` runs a hang on one rank, catches the error the timeout raises, and writes
# the rank's dump beside it. `idist.Parallel` starts the ranks with a `timeout`
# (ignite passes it to `init_process_group`).

# %%
def dumped(local_rank, hang, name):
    rank = idist.get_rank()
    try:
        hang(local_rank)
        error = None
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    fr = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
    with open(os.path.join(folder, f"{name}-rank{rank}.json"), "w") as f:
        json.dump({"error": error, "fr": fr}, f)


def run_and_dump(hang, nproc=2):
    started = time.perf_counter()
    with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=nproc, master_port=free_port(),
                                              timeout=TIMEOUT) as parallel:
        parallel.run(dumped, hang, hang.__name__)
    print(f"{hang.__name__} on {nproc} ranks: {time.perf_counter() - started:.1f} s")
    dumps = []
    for rank in range(nproc):
        with open(os.path.join(folder, f"{hang.__name__}-rank{rank}.json")) as f:
            dumps.append(json.load(f))
    return dumps


# %%
def show(dumps, last=3):
    """Each rank's error and its last ``last`` Flight Recorder entries."""
    for rank, d in enumerate(dumps):
        print(f"rank {rank}: {d['error'] or 'no error'}")
        for e in d["fr"]["entries"][-last:]:
            print(f"    #{e['collective_seq_id']} {e['profiling_name']:18s} sizes {e['input_sizes']} "
                  f"{e['input_dtypes']} group {e['process_group'][1]}")


def ops(dump):
    """{collective number: op} of the default group's entries."""
    return {e["collective_seq_id"]: e["profiling_name"] for e in dump["fr"]["entries"]
            if e["process_group"][1] == "default_pg"}


wrong = run_and_dump(wrong_op)
show(wrong)

# %% [markdown]
# Read the dumps as a collective is matched: by its number. Both ranks recorded the
# same collectives up to one number; at that number rank 0 recorded `gloo:all_reduce`
# and rank 1 `gloo:broadcast`. That is the disagreement, whatever each rank's error
# says. (The numbers start where ignite's own setup collectives end, which is why they
# do not start at #1.)

# %%
first = min(n for n in ops(wrong[0]) if ops(wrong[0])[n] != ops(wrong[1]).get(n))
print(f"first disagreement: #{first}: rank 0 {ops(wrong[0])[first]}, rank 1 {ops(wrong[1])[first]}")
assert ops(wrong[0])[first] == "gloo:all_reduce" and ops(wrong[1])[first] == "gloo:broadcast"
assert all(ops(wrong[0])[n] == ops(wrong[1])[n] for n in ops(wrong[0]) if n < first)
assert all(d["error"] for d in wrong)  # both ranks waited, until the timeout raised

# %% [markdown]
# A rank that skips a collective leaves a **shorter** record: ranks 0 and 1 recorded an
# `all_reduce` that rank 2 never did. The rank missing from a collective the others
# wait in is the one to look at; it raised nothing itself (it was computing).

# %%
skipped = run_and_dump(skips_one, nproc=3)
show(skipped, last=2)
last = [max(ops(d)) for d in skipped]
print(f"the last collective each rank recorded: {last}")
assert last[0] == last[1] == last[2] + 1, last
assert skipped[0]["error"] and skipped[1]["error"] and skipped[2]["error"] is None

# %% [markdown]
# ## 3. The kit's verdict
#
# Reading the dumps by hand is what the kit does for every run it starts:
# `distkit.launch_function(fn, ...)` (the launcher of `distkit launch` and `distkit
# train`, which starts `idist.Parallel` itself) arms a thread in every rank; when a rank
# fails in a collective, every rank writes its Flight Recorder dump and where its
# Python code is (its stack, read as `faulthandler` does), and the launcher prints one
# line per rank and a **verdict** before its error (`distkit: hang: ...` on stderr,
# caught here to show it). `timeout_s` is the process group's timeout.

# %%
def verdict_of(hang, nproc=2):
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        try:
            distkit.launch_function(hang, backend="gloo", nproc_per_node=nproc,
                                    timeout_s=TIMEOUT.total_seconds())
        except DistkitError as e:
            print(f"DistkitError: {str(e)[:160]}...")
    lines = [ln.removeprefix("distkit: hang: ") for ln in said.getvalue().splitlines()
             if ln.startswith("distkit: hang: ")]
    print("\n".join(lines))
    return lines


wrong_lines = verdict_of(wrong_op)
assert "called different collectives" in wrong_lines[-1], wrong_lines
assert "all_reduce" in wrong_lines[-1] and "broadcast" in wrong_lines[-1], wrong_lines

# %%
skip_lines = verdict_of(skips_one, nproc=3)
assert "rank 2 never reached all_reduce" in skip_lines[-1], skip_lines
assert any(ln.startswith("rank 2: not in a collective") for ln in skip_lines), skip_lines

# %% [markdown]
# The verdict names each collective by its number and the **line** each rank called it
# from, read from the rank's own stack: here the cells' lines (`ipykernel_...`), in a
# script `train.py:15`. (Its numbers run ahead of section 2's: they count every
# collective of the group, and the kit's launcher makes some of its own before your
# function starts.) docs/hangs.md lists every verdict the doctor gives, and how it
# works; exercise 16 asks you to write its core, `diagnose(records)`, yourself.
#
# ## 4. `TORCH_DISTRIBUTED_DEBUG=DETAIL`: check every collective first
#
# With `TORCH_DISTRIBUTED_DEBUG=DETAIL` set before the process group starts, torch wraps
# each group: before every collective, the ranks all-gather its **fingerprint** (op,
# shapes, dtypes) on a helper group and compare them; on a mismatch every rank raises at
# once ("Detected mismatch between collectives on ranks"), before any data moves. That
# is what stops `different_sizes`, which without it may abort a rank or go on with
# garbage. torch reads the variable when `torch.distributed` is imported, long done in
# this kernel, so `detail()` also sets the level with `dist.set_debug_level`: the
# forked ranks inherit both.
#
# One warning, seen with torch 2.15 on gloo: `DistributedDataParallel`'s constructor
# crashes (SIGSEGV) under DETAIL, so use it on plain collectives, as here, not on a DDP
# run (docs/hangs.md).

# %%
@contextlib.contextmanager
def detail():
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        yield
    finally:
        del os.environ["TORCH_DISTRIBUTED_DEBUG"]
        dist.set_debug_level(dist.DebugLevel.OFF)


with detail():
    sizes = run_and_dump(different_sizes)
for rank, d in enumerate(sizes):
    print(f"rank {rank}: {d['error'][:100]}... {d['error'][d['error'].index('Collectives differ'):]}")
assert all("Detected mismatch between collectives" in d["error"] for d in sizes)
assert "shapes: 1000vs 500" in sizes[0]["error"] and "shapes: 500vs 1000" in sizes[1]["error"]


# %% [markdown]
# What it costs: more collectives, by construction. The Flight Recorder shows them: on
# a helper group of each group, two all-gathers of int64 tensors before each of your
# collectives (the fingerprint's length, then the fingerprint), the kit's rule to tell
# them apart (`distkit.observe.hangs.without_fingerprints`): a group that only ever
# all-gathers int64. The time they add depends on the machine (and on this loaded 2-core
# one, on the other jobs): measured below for 200 all-reduces of 1000 floats, with and
# without it.

# %%
def helper_groups(entries):
    """The groups whose entries are all fingerprints: all-gathers of int64."""
    fingerprint = lambda e: e["profiling_name"] == "gloo:all_gather" and e["input_dtypes"] == ["Long"]  # noqa: E731
    return {e["pg_id"] for e in entries} - {e["pg_id"] for e in entries if not fingerprint(e)}


entries = sizes[0]["fr"]["entries"]
helper = [e for e in entries if e["pg_id"] in helper_groups(entries)]
mine = [e for e in entries if e["pg_id"] not in helper_groups(entries)]
print(f"rank 0 under DETAIL: {len(mine)} collectives recorded of its own (the mismatched one raised "
      f"before it started), {len(helper)} fingerprint all-gathers; without DETAIL: "
      f"{len(helper_groups(wrong[0]['fr']['entries']))} helper groups")
assert len(helper) == 2 * (len(mine) + 1)  # two for each, and two for the mismatched one
assert not helper_groups(wrong[0]["fr"]["entries"])

# %% [markdown]
# The time: rounds of 200 all-reduces of 1000 floats on 2 ranks, with DETAIL off and on
# in turn, 3 rounds each; each round also counts the fingerprints its Flight Recorder
# holds, so that the "on" rounds are known to have checked every call. On the loaded
# 2-core machine that recorded this notebook the rounds differ by more than the effect:
# five runs of this cell within ten minutes gave medians from -36 % to +176 % (a cost
# cannot be negative: that is the noise). So the cell prints every round and asserts
# only the count; on your machine, look at the spread before you trust the median.

# %%
CALLS, ROUNDS = 200, 3


def timed(local_rank):
    x = torch.ones(1000)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(CALLS):
        dist.all_reduce(x)
    us = (time.perf_counter() - started) / CALLS * 1e6
    entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())["entries"]
    return us, sum(e["pg_id"] in helper_groups(entries) for e in entries)


rounds = {"off": [], "DETAIL": []}
for _ in range(ROUNDS):
    rounds["off"].append(distkit.launch_function(timed, backend="gloo", nproc_per_node=2))
    with detail():
        rounds["DETAIL"].append(distkit.launch_function(timed, backend="gloo", nproc_per_node=2))
us = {k: statistics.median(u for u, _ in v) for k, v in rounds.items()}
for k, v in rounds.items():
    print(f"{k:6s} us per all_reduce of float32[1000], each round: {[round(u) for u, _ in v]}")
print(f"median {us['off']:.0f} us, {us['DETAIL']:.0f} us under DETAIL ({us['DETAIL'] / us['off'] - 1:+.0%}); "
      f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
assert all(n == 0 for _, n in rounds["off"])
assert all(n >= 2 * CALLS for _, n in rounds["DETAIL"]), rounds["DETAIL"]


# %% [markdown]
# ## 5. On a GPU cluster (nccl)
#
# The Flight Recorder began on nccl, where a hang costs most: a stuck job holds its GPUs
# until the watchdog's timeout. What to set there, from torch's page on the nccl
# environment variables
# (<https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html>) and its
# Flight Recorder tutorial
# (<https://pytorch.org/tutorials/prototype/flight_recorder_tutorial.html>):
#
# - `TORCH_NCCL_TRACE_BUFFER_SIZE=2000`: the entries kept per rank (the tutorial's
#   advice; `TORCH_FR_BUFFER_SIZE` is the same setting for every backend);
# - `TORCH_NCCL_DUMP_ON_TIMEOUT=1`: each rank writes its buffer when its watchdog sees a
#   timeout or an error ("must be set together with TORCH_NCCL_TRACE_BUFFER_SIZE larger
#   than 0");
# - `TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/shared/fr/rank_`: the dumps' path prefix, one
#   pickled file per rank, on a file system every node sees (torchtitan sets the same
#   three in `torchtitan/distributed/utils.py`);
# - then, on one machine: `python -m torch.distributed.flight_recorder.fr_trace
#   /shared/fr -p rank_` (torch's analyzer; `pip install tabulate` for its tables),
#   which lines the ranks' entries up by their numbers, as section 2 did by hand, and
#   reports the first collective they disagree on.
#
# The JSON read in section 2 is the same buffer (`_dump_fr_trace_json()`; on nccl its
# entries say `nccl:all_reduce`), so the reading is the same. `TORCH_DISTRIBUTED_DEBUG=DETAIL`
# wraps nccl groups too (the fingerprints travel on a gloo helper group). Newer torch
# adds a debug server that dumps every rank's buffer and stacks on request
# (<https://docs.pytorch.org/tutorials/intermediate/debug_hangs_with_flight_recorder.html>).
#
# torch's analyzer does not read gloo's dumps in torch 2.15: it finds each entry's group
# by its name in the dump's `pg_config`, where nccl's default group is listed as `'0'`
# (the tutorial's example) but gloo's under the name `''`, while gloo's entries say
# `'0'`; run on section 2's dumps written with `_dump_fr_trace()`, it stopped with a
# `KeyError` naming group `'0'`. The cell checks the mismatch, so that this notebook
# fails once torch changes it, and says so.

# %%
groups_listed = set(wrong[0]["fr"]["pg_config"])
groups_used = {e["process_group"][0] for e in wrong[0]["fr"]["entries"]}
print(f"pg_config lists {groups_listed}; the entries name {groups_used}")
assert not groups_used <= groups_listed

# %% [markdown]
# ## What you saw
#
# - A hang is a disagreement: another op, another size, or a rank that never came. The
#   ranks' errors do not say which; their Flight Recorder dumps do, read side by side
#   by collective number (`torch._C._distributed_c10d._dump_fr_trace_json()`).
# - The kit does that reading for every run it starts (`distkit launch`,
#   `distkit train`, `distkit.launch_function`): one line per rank, then a verdict,
#   within the timeout.
# - `TORCH_DISTRIBUTED_DEBUG=DETAIL` stops a mismatch before any data moves, at the cost
#   of an all-gather per collective (`distkit launch --debug-collectives` sets it); on
#   gloo in torch 2.15 not with DDP.
# - On nccl: `TORCH_NCCL_TRACE_BUFFER_SIZE`, `TORCH_NCCL_DUMP_ON_TIMEOUT`, and torch's
#   `fr_trace` analyzer over the dumps.

# %%
shutil.rmtree(folder)  # the dumps of this notebook
