# %% [markdown]
# # 09 · Multi-node: two "nodes" on one machine, and surviving a dead rank (CPU, gloo)
#
# The kit's claim is that `training` runs unchanged on many nodes. Nodes are processes
# that meet at an address; here two "nodes" meet at 127.0.0.1, which exercises
# everything a real cluster does except the network cable. This notebook:
#
# 1. prints, from inside the processes, what each launcher tells them: torchrun,
#    `idist.Parallel(nnodes=2, node_rank=...)`, and SLURM (as ignite reads it);
# 2. trains the unchanged `distkit train` on 2 nodes, once with torchrun (on two hosts
#    made of network namespaces where it can: Linux, root) and once with
#    `idist.Parallel`, and checks that both end with the *same* weights;
# 3. kills one rank with SIGKILL mid-epoch: the job must end within seconds, naming it;
# 4. lets `torchrun --max-restarts` restart the job, which resumes from the newest
#    checkpoint and ends, parameter for parameter, where the uninterrupted run ended.
#
# Hardware: any CPU (Linux: killing a rank reads `/proc`). Every run writes into a fresh
# temporary folder, so running the notebook again starts from nothing.
# Launch templates for real clusters: `scripts/` (torchrun on 1 or N nodes, SLURM, Colab).

# %%
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ignite.distributed as idist
import torch

from distkit.lessons import failure, multinode
from distkit.config import Config
from distkit.launch import run
from distkit.machine import cpu_only_processes, free_port
from distkit.checkpoint import checkpoint_iteration, latest_checkpoint, load_checkpoint

logging.disable(logging.INFO)  # ignite's launcher INFO lines; the logs below keep the rest
# One thread per process in every run: the same arithmetic in every layout (a different
# thread count sums in a different order, and changes the last bits of the weights).
# gloo named: two "nodes" on one machine share its GPU, if it has one, which nccl refuses
TRAIN = ["--backend", "gloo", "--epochs", "2", "--no-progress", "--checkpoint-every", "5", "--threads-per-process", "1"]
workdir = Path(tempfile.mkdtemp(prefix="distkit-09-"))  # fresh per run: no earlier run's checkpoints
print(f"torch {torch.__version__}; every run below: distkit train {' '.join(TRAIN)}; files in {workdir}")
print("(digits: 23 iterations per epoch; a checkpoint every 5 and at each epoch's end)")

# %% [markdown]
# ## 1. What each launcher tells a process
#
# **torchrun**, two launches, as you would type them on two machines
# (`--nnodes=2 --node_rank=0|1 --master_addr=...`). Each starts one process running
# `python -m distkit.lessons.multinode`, which prints what `idist` makes of it and the launcher's
# variables.

# %%
port = free_port()
cmds = [multinode.torchrun_node(r, 2, port, [], module="distkit.lessons.multinode") for r in (0, 1)]
print("$", " ".join(["torchrun", *cmds[1][3:]]))
nodes = multinode.run_nodes(cmds, timeout=120)
for r, node in enumerate(nodes):
    print(f"node {r}, exit code {node['returncode']}:\n  {multinode.log_tail(node['output'], 1)}")
assert [n["returncode"] for n in nodes] == [0, 0]

# %% [markdown]
# **`idist.Parallel`**: two "nodes" (forked from this notebook), each calling
# `idist.Parallel(nnodes=2, node_rank=...)`, which spawns that node's one process and
# sets its variables before `init_process_group`. No `TORCHELASTIC_*`, no `GROUP_RANK`:
# ignite passes the node rank as an argument and derives the rest.

# %%
port = free_port()


def node(node_rank):  # one "node": spawns its processes, here 1
    with cpu_only_processes(), idist.Parallel(backend="gloo", nproc_per_node=1, nnodes=2, node_rank=node_rank,
                                              master_addr="127.0.0.1", master_port=port) as parallel:
        parallel.run(multinode.show_env, "idist.Parallel: ")


assert multinode.fork_nodes(node, 2) == [0, 0]

# %% [markdown]
# **SLURM**: `srun` sets `SLURM_*` variables only; ignite's native backend turns them into
# the torch ones. Here ignite's own function reads what srun would give 4 tasks on 2
# nodes (`scripts/slurm.sbatch` is tested in such a simulated job by
# `tests/test_scripts.py`). The master address is the node list's first host; the port
# is 15000 + the last 4 digits of the job id. To expand the node list, ignite runs
# `scontrol show hostnames` when `scontrol` is installed, and expands it itself when it
# is not; on a machine that has SLURM's tools but no cluster of its own, `scontrol`
# fails, so this cell hides it from ignite's search (`PATH` without it) to show ignite's
# own expansion wherever the notebook runs.

# %%
import os
import shutil
from unittest import mock

from ignite.distributed.comp_models.native import _setup_ddp_vars_from_slurm_env

here = os.environ["PATH"].split(os.pathsep)
without_scontrol = os.pathsep.join(d for d in here if not os.path.exists(os.path.join(d, "scontrol")))
print("scontrol on this machine:", shutil.which("scontrol") or "none")
with mock.patch.dict(os.environ, {"PATH": without_scontrol}):
    for procid in range(4):
        env = multinode.slurm_env(procid, ntasks=4, localid=procid % 2, nnodes=2, nodeid=procid // 2,
                                  job_id="314159", nodelist="node[01-02]")
        shown = {k: env[k] for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NODELIST")}
        print(shown, "->", _setup_ddp_vars_from_slurm_env(env))

# %% [markdown]
# ## 2. Training on two nodes, unchanged
#
# The same `distkit train` command on both nodes, under torchrun. Rank 0 lives on
# node 0: it writes the results; node 1's process trains and writes nothing.
#
# Where it can (Linux, as root), the two nodes are **two hosts**: network namespaces
# made by `distkit.lessons.hosts`, each with its own network stack, its own address
# (198.18.x.1 and .2, the benchmarking range, on a virtual cable between them) and its
# own hostname that resolves to nothing, as on many clusters and cloud VMs. There gloo
# cannot find its own address from the hostname (it would fall back to 127.0.0.1, which
# the other host cannot reach), so in every process the kit sets `GLOO_SOCKET_IFNAME`
# to the interface whose address routes to the master (`distkit.machine.socket_interface`,
# what `distkit doctor` shows). Elsewhere both nodes run on 127.0.0.1, and the cell says so.

# %%
import contextlib

from distkit.lessons.hosts import NamespaceHosts, unavailable
from distkit.machine import socket_interface

stack = contextlib.ExitStack()  # closed at the end of this section: the hosts go away
why_not = unavailable()
hosts = stack.enter_context(NamespaceHosts()) if why_not is None else None
master = hosts.addresses[0] if hosts else "127.0.0.1"
if hosts:
    print(f"two hosts: {hosts.hostnames[0]} ({hosts.addresses[0]}) and {hosts.hostnames[1]} "
          f"({hosts.addresses[1]}), network namespaces joined by a veth pair")
    for r in (0, 1):
        ask = (f"import socket; from distkit.machine import socket_interface as s; "
               f"print(socket.gethostname(), s('gloo', {master!r}))")
        print(" ", subprocess.run(hosts.command(r, [sys.executable, "-c", ask]), text=True,
                                  capture_output=True, env=multinode.clean_env()).stdout.strip())
else:
    print(f"two 'nodes' on 127.0.0.1 of this machine: no namespace hosts here ({why_not})")

# %%
port = free_port()
out_dir = workdir / "torchrun-2nodes"
cmds = [multinode.torchrun_node(r, 2, port, ["train", *TRAIN, "--output-dir", out_dir], addr=master)
        for r in (0, 1)]
print("$", " ".join(["torchrun", *cmds[0][3:]]))
if hosts:  # the same command, started on each host
    cmds = [hosts.command(r, cmd) for r, cmd in enumerate(cmds)]
nodes = multinode.run_nodes(cmds, timeout=300)
for r, node in enumerate(nodes):
    print(f"--- node {r}: exit code {node['returncode']} after {node['seconds']:.0f} s")
    print(multinode.log_tail(node["output"], 5) or "(nothing: only rank 0 logs)")
assert [n["returncode"] for n in nodes] == [0, 0]
assert not any("loopback address as fallback" in n["output"] for n in nodes)
stack.close()

# %%
res = json.loads(next(out_dir.glob("*/results.json")).read_text())
print(f"world size {res['world_size']} on {res['nnodes']} nodes; replicas identical: "
      f"{res['replicas_identical']}; final val loss {res['final']['val_loss']:.4f}")
assert (res["world_size"], res["nnodes"], res["replicas_identical"]) == (2, 2, True)
reference = load_checkpoint(res["last_checkpoint"])  # the uninterrupted run's last state


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

# %% [markdown]
# The same two nodes with **`idist.Parallel`** instead of torchrun: each node calls
# `distkit.launch.run(Config(nnodes=2, node_rank=...))`, which is what
# `distkit train --nnodes 2 --node-rank R --master-addr A` does. Same function, same data,
# same world size: the final weights must be the torchrun run's, bit for bit.

# %%
port = free_port()
parallel_dir = workdir / "parallel-2nodes"


def node(node_rank):
    run(Config(backend="gloo", nnodes=2, node_rank=node_rank, nproc_per_node=1, master_addr="127.0.0.1",
               master_port=port, epochs=2, checkpoint_every=5, threads_per_process=1,
               progress_bar=False, output_dir=str(parallel_dir)))


assert multinode.fork_nodes(node, 2) == [0, 0]
res_p = json.loads(next(parallel_dir.glob("*/results.json")).read_text())
assert same_weights(load_checkpoint(res_p["last_checkpoint"])["model"], reference["model"])
print(f"idist.Parallel: {res_p['world_size']} processes on {res_p['nnodes']} nodes, final val loss "
      f"{res_p['final']['val_loss']:.4f}: the same weights as under torchrun")

# %% [markdown]
# ## 3. A rank dies mid-epoch
#
# `distkit train` with 2 processes; once the checkpoint of iteration 10 exists (epoch 1
# has 23), rank 1 gets SIGKILL: no clean-up, as with the OOM killer or a lost node. The
# launcher must notice, stop rank 0 (stuck in an all-reduce with a dead peer), and end
# non-zero with one line naming the rank, well within 30 s.

# %%
proc = subprocess.Popen([sys.executable, "-m", "distkit", "train", "--nproc-per-node", "2", *TRAIN,
                         "--output-dir", str(workdir / "killed")], env=multinode.clean_env(), text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
ckpt = failure.wait_for_checkpoint(str(workdir / "killed"), 10, timeout=120)
killed_at = time.monotonic()
pid = failure.kill_rank(proc.pid, 1)
out, _ = proc.communicate(timeout=60)
took = time.monotonic() - killed_at
last = out.strip().splitlines()[-1]
print(f"newest checkpoint: {Path(ckpt).name}; SIGKILL to rank 1 (pid {pid})")
print(f"job ended {took:.1f} s later, exit code {proc.returncode}:\n  {last}")
assert proc.returncode != 0 and took < 30 and "rank 1" in last and "SIGKILL" in last

# %% [markdown]
# ## 4. torchrun restarts, and the run resumes from its newest checkpoint
#
# `--max-restarts=1`: when a worker dies, torchrun stops the others and starts them all
# again. Every start is the same command, so it must find the previous start's
# checkpoint: `--resume-from latest` takes the newest under `--output-dir` (none: start
# from scratch). `--standalone` and `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` give each
# start a fresh rendezvous store (with a shared one, restarts sometimes failed to
# reconnect: see `distkit.checkpoint.restart_store_warning`); `scripts/torchrun_1node.sh`
# launches exactly so.

# %%
cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
       "--max-restarts=1", "-m", "distkit", "train", *TRAIN, "--resume-from", "latest",
       "--output-dir", str(workdir / "restarted")]
print("$ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun", " ".join(cmd[3:]))
proc = subprocess.Popen(cmd, env=multinode.clean_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1),
                        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
failure.wait_for_checkpoint(str(workdir / "restarted"), 10, timeout=120)
failure.kill_rank(proc.pid, 1)
newest_at_kill = latest_checkpoint(str(workdir / "restarted"))
out, _ = proc.communicate(timeout=240)
keys = ("failed (exitcode", "--resume-from latest", "final validation", "results, checkpoints")
print("\n".join(ln.split("] ")[-1] for ln in out.splitlines() if any(k in ln for k in keys)))
assert proc.returncode == 0

# %%
resumed_from = [ln for ln in out.splitlines() if "resuming from" in ln][-1].split("resuming from ")[-1]
final = load_checkpoint(latest_checkpoint(str(workdir / "restarted")))
print(f"killed after {Path(newest_at_kill).name}; the restart resumed from {Path(resumed_from).name}, "
      "so it lost at most the 5 iterations after it")
assert checkpoint_iteration(resumed_from) >= checkpoint_iteration(newest_at_kill)
assert final["trainer"]["iteration"] == reference["trainer"]["iteration"] == 46
assert same_weights(final["model"], reference["model"])
assert same_weights(final["optimizer"]["state"][0], reference["optimizer"]["state"][0])
print(f"interrupted + restarted == uninterrupted: all {len(final['model'])} parameter tensors "
      "(and the optimizer's momentum) equal, bit for bit")

# %% [markdown]
# ## 5. A kill during a checkpoint save
#
# A checkpoint written in place and interrupted half way would be the newest file and
# unloadable: the restart would fail exactly when it is needed. ignite's
# `DiskSaver(atomic=True)`, which `training` uses, writes to a temporary file in the
# same folder and renames it when complete; a rename is all or nothing. Below, a process
# saves a 100 MB state over and over with it and is SIGKILLed in the middle of a save.
# (`tests/test_failure.py` does the same to a training run of a ResNet-18.)

# %%
from ignite.handlers import DiskSaver

state = {"model": {"w": torch.randn(25_000_000)}}  # 100 MB of float32
saver = DiskSaver(str(workdir / "atomic"), atomic=True, require_empty=False)
caught = failure.kill_during_save(lambda i: saver(state, f"training_checkpoint_{i}.pt"), str(workdir / "atomic"))
print(f"killed while {Path(caught['partial']).name} held {caught['partial_bytes'] / 1e6:.0f} MB")
try:
    torch.load(caught["partial"], weights_only=True)
except Exception as e:
    print(f"the partial file does not load ({type(e).__name__}), and is not a *.pt")
for path in caught["complete"]:
    ok = torch.equal(torch.load(path, weights_only=True)["model"]["w"], state["model"]["w"])
    print(f"{Path(path).name}: loads with weights_only=True, intact: {ok}")
    assert ok

# %% [markdown]
#
# ## What to take away
#
# - Nodes are just processes meeting at `MASTER_ADDR:MASTER_PORT`; torchrun, `idist.Parallel`
#   and SLURM tell each its rank in different variables, and `idist` reads them all: the
#   training code does not change, and the weights do not either.
# - A dead rank must end the job, fast and loudly; torchrun's restarts then need a
#   checkpoint every N iterations, a resume that finds it (`--resume-from latest`), and
#   atomic writes.

# %% [markdown]
# ## Cleaning up
#
# Every run of this notebook wrote into its own temporary folder (`workdir`). The last cell
# removes it; skip it to keep the files and look at them.

# %%
import shutil

shutil.rmtree(workdir)
print(f"removed {workdir}")
