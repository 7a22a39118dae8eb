"""Several nodes: what each launcher tells a process, and "nodes" on one machine.

Every launcher hands a process the same few facts through environment variables, under
different names; ``idist`` reads whichever are there:

- torchrun: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK`` (the node rank), ``MASTER_ADDR``/``MASTER_PORT`` and its own
  ``TORCHELASTIC_*`` (restart count, run id);
- ``idist.Parallel`` (and so ``distkit train --nnodes ...``): sets ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` inside each process it
  spawns, before ``init_process_group``;
- SLURM's ``srun``: ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
  ``SLURM_JOB_NODELIST``, ``SLURM_JOB_NUM_NODES``, ``SLURM_JOB_ID``; ignite turns them
  into the torch variables (master address: the first host of the node list; master
  port: 15000 + the last 4 digits of the job id).

``python -m distkit.lessons.multinode`` prints one process's view (run it under torchrun or
srun); ``python -m distkit.lessons.multinode --nnodes 2 --node-rank R ...`` is the same through
``idist.Parallel``. :func:`run_nodes` starts several "node" commands at once on this
machine and collects their logs: two nodes on 127.0.0.1.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
    "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST",
)


def launcher_env(environ=None) -> dict:
    """The launch-related variables present in ``environ`` (default: this process)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in LAUNCHER_VARS if k in environ}


def describe_process(label: str = "") -> str:
    """One line: what ``idist`` says this process is, then the launcher's variables."""
    import ignite.distributed as idist

    view = (f"rank {idist.get_rank()}/{idist.get_world_size()} node {idist.get_node_rank()}/"
            f"{idist.get_nnodes()} local rank {idist.get_local_rank()}/{idist.get_nproc_per_node()}")
    env = " ".join(f"{k}={v}" for k, v in launcher_env().items())
    return f"{label}{view} | {env}"


def show_env(local_rank: int, label: str = "") -> None:
    """Print :func:`describe_process`; a function for ``idist.Parallel.run``."""
    print(describe_process(label) + "\n", end="", flush=True)  # one write: lines of two processes never interleave


def slurm_env(procid: int, ntasks: int, localid: int | None = None, nnodes: int = 1,
              nodeid: int = 0, job_id: str = "4242", nodelist: str = "localhost",
              cpus_per_task: int = 1) -> dict:
    """The variables ``srun`` gives one task (the ones ignite reads, and a few more).
    For simulating a SLURM job step on a machine without SLURM."""
    return {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid if localid is None else localid),
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
        "SLURM_NODEID": str(nodeid), "SLURM_JOB_NUM_NODES": str(nnodes), "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_CPUS_PER_TASK": str(cpus_per_task),
    }


def clean_env(**extra) -> dict:
    """This process's environment without any launcher's variables, plus ``extra``: a
    child started with it does not mistake itself for part of another launch."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_nodes(commands: list, timeout: float = 180, envs: list | None = None, cwd=None) -> list[dict]:
    """Start every command at once (one per "node"), wait for all, and return for each
    ``{"returncode", "output", "seconds"}`` (stdout and stderr together). If one is
    still running after ``timeout`` seconds, all are killed (returncode None)."""
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=cwd, env=(envs[i] if envs else clean_env()), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, cmd in enumerate(commands)]
    results = []
    try:
        for p in procs:
            left = max(0.1, timeout - (time.monotonic() - start))
            try:
                out, _ = p.communicate(timeout=left)
                results.append({"returncode": p.returncode, "output": out,
                                "seconds": time.monotonic() - start})
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                results.append({"returncode": None, "output": out, "seconds": time.monotonic() - start})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def fork_nodes(fn, nnodes: int, timeout: float = 180) -> list:
    """Run ``fn(node_rank)`` in ``nnodes`` forked processes at once, one "node" each, and
    return their exit codes (None: killed after ``timeout`` s). Forking is cheap (no
    re-import) and lets a notebook cell define ``fn``; each node may start its own
    processes, e.g. with ``idist.Parallel(nnodes=..., node_rank=...)``."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=fn, args=(r,)) for r in range(nnodes)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    return codes


def torchrun_node(node_rank: int, nnodes: int, port: int, args: list, nproc_per_node: int = 1,
                  module: str = "distkit", addr: str = "127.0.0.1") -> list[str]:
    """The torchrun command line of one node of a static (``--master_addr``) launch."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
            f"--nproc_per_node={nproc_per_node}", f"--master_addr={addr}", f"--master_port={port}",
            "-m", module, *map(str, args)]


def log_tail(output: str, lines: int = 8, drop=("INFO", "\t")) -> str:
    """The last ``lines`` lines of a node's log, without ignite's INFO chatter."""
    kept = [ln for ln in output.splitlines() if ln.strip() and not any(d in ln[:60] for d in drop)]
    return "\n".join(kept[-lines:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m distkit.lessons.multinode", description=__doc__.splitlines()[0])
    p.add_argument("--nnodes", type=int, default=None,
                   help="spawn with idist.Parallel as one of this many nodes (default: join torchrun/srun)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29500)
    args = p.parse_args(argv)
    import ignite.distributed as idist

    from distkit.host.facts import CPU_ONLY_ENVIRONMENT, cpu_only_processes

    if args.nnodes is None:  # torchrun / srun started this process: join the launch
        before = launcher_env()
        os.environ.update(CPU_ONLY_ENVIRONMENT)  # gloo ranks are CPU processes (distkit.host.facts)
        idist.initialize("gloo")
        print(describe_process("torchrun/srun: " if before else "no launcher: "), flush=True)
        idist.finalize()
        return 0
    with cpu_only_processes(), \
            idist.Parallel(backend="gloo", nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                           node_rank=args.node_rank, master_addr=args.master_addr,
                           master_port=args.master_port) as parallel:
        parallel.run(show_env, "idist.Parallel: ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
