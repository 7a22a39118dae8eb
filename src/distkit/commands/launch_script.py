"""``distkit launch``: run any script that makes its own process group (torchrun-style:
it reads RANK, LOCAL_RANK, WORLD_SIZE) on N ranks, with the kit's supervision; see
:mod:`distkit.launch.script`."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = ("distkit launch [--nproc-per-node N] [--nnodes N --node-rank R --master-addr A "
               "--master-port P] [--timeout S] [--end-timeout S] [--trace] [--debug-collectives] SCRIPT [ARGS...] | "
               "-m MODULE [ARGS...]")
    p.description = ("Run SCRIPT on N ranks as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, "
                     "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT set; threads per "
                     "process; gloo ranks kept off the GPUs), reporting a rank that fails in one "
                     "line with the file:line in your script. Inside an srun job step it maps "
                     "SLURM's variables to torchrun's and runs the script once per task. Options "
                     "go before SCRIPT; everything after it goes to the script.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=None, metavar="N",
                   help="ranks on this node (default: one per GPU with nccl, 2 on a CPU)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", "--node_rank", type=int, default=None, metavar="R")
    p.add_argument("--master-addr", "--master_addr", default=None, metavar="ADDR",
                   help="address of the node with --node-rank 0 (default: 127.0.0.1 on one node)")
    p.add_argument("--master-port", "--master_port", type=int, default=None, metavar="PORT",
                   help="default: a free port on one node, 29500 on several")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="what the script's process group uses: gloo ranks see no GPU; auto: "
                        "nccl where CUDA is, else gloo")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=120.0, metavar="S",
                   help="seconds any collective of the script (and its init_process_group "
                        "rendezvous) may wait before the rank fails, for process groups made "
                        "without a timeout= of their own (default: 120, as distkit train)")
    p.add_argument("--end-timeout", dest="end_timeout_s", type=float, default=None, metavar="S",
                   help="once a rank has ended, the others must end within S seconds or are "
                        "stopped (default: no bound)")
    p.add_argument("--trace", action="store_true",
                   help="torch.profiler on every rank for 3 optimizer steps after 3 (one node): "
                        "one trace per rank, a merged trace and its drawing in "
                        "OUTPUT_DIR/<time>-<backend>-<N>procs/trace/, named in results.json there")
    p.add_argument("--debug-collectives", action="store_true",
                   help="TORCH_DISTRIBUTED_DEBUG=DETAIL in every rank: torch checks each "
                        "collective's op, shapes and dtypes across ranks before it runs, so a "
                        "mismatch fails at once on every rank instead of hanging or going on "
                        "with garbage (one extra collective each; not with DDP: torch 2.15's "
                        "DDP crashes under it)")
    p.add_argument("--output-dir", default="runs", metavar="D",
                   help="where --trace makes its run folder (a failing rank's traceback then goes "
                        "to its tracebacks/); inside srun or torchrun, a failing rank's traceback "
                        "goes to D/launch-<job>/tracebacks/, a folder every node of a shared "
                        "file system reaches (default: runs)")
    p.add_argument("--grace", dest="grace_s", type=float, default=10.0, metavar="S",
                   help="seconds a rank gets to end after Ctrl-C or SIGTERM before SIGKILL")
    p.add_argument("--verbose", action="store_true",
                   help="also print a failed rank's full traceback (it is always in a file)")
    p.add_argument("-m", "--module", action="store_true",
                   help="SCRIPT is a module name, run as python -m MODULE")
    p.add_argument("script", metavar="SCRIPT", help="the .py file to run (or the module, with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's own arguments")


def main(args) -> int:
    import sys

    from distkit.launch.script import ScriptStopped, launch_script

    try:
        return launch_script(args.script, args.args, nproc_per_node=args.nproc_per_node,
                             nnodes=args.nnodes, node_rank=args.node_rank,
                             master_addr=args.master_addr, master_port=args.master_port,
                             backend=args.backend, timeout_s=args.timeout_s,
                             end_timeout_s=args.end_timeout_s, trace=args.trace,
                             output_dir=args.output_dir, grace_s=args.grace_s, module=args.module, verbose=args.verbose,
                             debug_collectives=args.debug_collectives)
    except ScriptStopped as e:
        sys.stderr.write(f"distkit: {e}\n")
        return e.exit_code
