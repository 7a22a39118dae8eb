"""``distkit train``: flags map one-to-one onto :class:`distkit.config.Config`.

``--task module:attr`` trains a course's own :class:`distkit.Task` (see
``distkit.tasks``); without it, ``--dataset`` and ``--model`` pick a built-in task."""
from __future__ import annotations

import argparse
import os

from distkit.config import (BACKENDS, DATASET_DEFAULTS, DATASETS, LOGGERS, MODELS, STRATEGIES,
                            Config)

DEFAULTS = Config()


def _default(field: str) -> str:
    """Help text for a flag whose default depends on --dataset."""
    per_dataset = ", ".join(f"{d}: {v[field]}" for d, v in DATASET_DEFAULTS.items() if field in v)
    return f"default: {getattr(DEFAULTS, field)}" + (f" ({per_dataset})" if per_dataset else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    g = p.add_argument_group("processes and nodes")
    g.add_argument("--backend", choices=BACKENDS, default=DEFAULTS.backend,
                   help="auto: nccl with CUDA, xla-tpu with a TPU, else gloo")
    g.add_argument("--nproc-per-node", "--nproc_per_node", type=int, metavar="N", default=None,
                   help="processes to spawn on this node (default: join torchrun/SLURM if "
                        "launched by one, else one per GPU, or 2 on a CPU)")
    g.add_argument("--nnodes", type=int, default=DEFAULTS.nnodes)
    g.add_argument("--node-rank", "--node_rank", type=int, default=None, metavar="R")
    g.add_argument("--master-addr", "--master_addr", default=None, metavar="ADDR")
    g.add_argument("--master-port", "--master_port", type=int, metavar="PORT", default=None,
                   help="default: a free port (single node)")
    g.add_argument("--timeout", dest="timeout_s", type=float, default=DEFAULTS.timeout_s,
                   help="seconds any collective may wait before the run fails")
    g.add_argument("--threads-per-process", type=int, default=None,
                   help="default: this machine's cores / the processes of the run on this machine "
                        "(all launches: two torchrun \"nodes\" on one machine share it)")
    g = p.add_argument_group("data, model and optimization")
    g.add_argument("--task", default=None, metavar="MODULE:ATTR",
                   help="a course's own distkit.Task: module:attr (module importable from the "
                        "current folder) or path/to/file.py:attr; replaces --dataset/--model")
    g.add_argument("--set", dest="task_settings", action="append", default=[],
                   metavar="NAME=VALUE",
                   help="a setting of the --task's own (declared in Task(settings=...)), e.g. "
                        "--set hidden=64 --set max_norm=1.0; repeat for each")
    g.add_argument("--dataset", choices=DATASETS, default=DEFAULTS.dataset,
                   help="digits and synthetic need no download")
    g.add_argument("--data-dir", default=DEFAULTS.data_dir)
    g.add_argument("--dataset-size", type=int, default=DEFAULTS.dataset_size,
                   help="training samples of the synthetic dataset")
    g.add_argument("--model", choices=MODELS, default=DEFAULTS.model)
    g.add_argument("--strategy", choices=STRATEGIES, default=DEFAULTS.strategy,
                   help="ddp: a whole model per process; fsdp: each process holds 1/N of the "
                        "parameters, gradients and optimizer state (gloo or nccl)")
    g.add_argument("--epochs", type=int, default=None, help=_default("epochs"))
    g.add_argument("--batch-size", type=int, default=None,
                   help="GLOBAL batch size, summed over all processes: each of N processes "
                        "gets batch-size / N samples per step; " + _default("batch_size"))
    g.add_argument("--lr", type=float, default=None, help=_default("lr"))
    g.add_argument("--scale-lr", action="store_true",
                   help="linear scaling rule: peak lr = lr x world size")
    g.add_argument("--warmup-epochs", type=float, default=DEFAULTS.warmup_epochs)
    g.add_argument("--num-workers", type=int, default=DEFAULTS.num_workers,
                   help="GLOBAL data-loader workers, divided among the processes")
    g.add_argument("--seed", type=int, default=DEFAULTS.seed)
    g.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    g.add_argument("--early-stopping-patience", type=int, default=0,
                   help="stop after this many epochs without a better validation score (the "
                        "task's; built-in tasks: a lower validation loss) (0: off)")
    g.add_argument("--early-stopping-min-delta", type=float, default=0.0)
    g = p.add_argument_group("output")
    g.add_argument("--profile", action="store_true",
                   help="profile handlers and data/compute time; summary in results.json")
    g.add_argument("--trace", action="store_true",
                   help="torch.profiler on every rank for a few steps after a warm-up: per-rank "
                        "traces, one merged Chrome trace (one row per rank, clocks aligned) and "
                        "its timeline.png in <run dir>/trace/, named in results.json")
    g.add_argument("--no-progress", dest="progress_bar", action="store_false",
                   help="one line per epoch even in a terminal (the progress bar shows only when "
                        "output goes to a terminal or a notebook; in logs, one line per epoch)")
    g.add_argument("--verbose", action="store_true",
                   help="also print ignite's INFO lines (launcher parameters, data loaders, model wrapping)")
    g.add_argument("--logger", choices=LOGGERS, default=DEFAULTS.logger,
                   help="experiment tracker on rank 0 (ignite's TensorboardLogger / MLflowLogger): "
                        "loss, lr, validation metrics per epoch, the profile with --profile; "
                        "pip install tensorboard / mlflow first")
    g.add_argument("--output-dir", default=DEFAULTS.output_dir,
                   help="each run writes to a fresh sub-folder of this")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="also checkpoint every N iterations (always at each epoch end)")
    g.add_argument("--resume-from", default=None,
                   help="checkpoint .pt file to resume from, or 'latest': the newest checkpoint "
                        "under --output-dir (none yet: start from scratch; for torchrun --max-restarts)")
    g.add_argument("--max-iters", type=int, default=None,
                   help="stop (with a checkpoint) after this many iterations in total")
    g.add_argument("--peak-flops", type=float, default=None, metavar="FLOPS",
                   help="the machine's peak FLOP/s, all processes together, for the MFU of "
                        "models that count their FLOPs (--model gpt); default: measured at "
                        "the start (a large matmul on every process at once)")


def config_from_args(args) -> Config:
    """The Config of these flags; a flag not given takes its dataset's default
    (``DATASET_DEFAULTS``), else Config's."""
    fields = Config.__dataclass_fields__
    given = {k: v for k, v in vars(args).items() if k in fields}
    given["task_settings"] = parse_settings(given.get("task_settings") or [])
    for k, v in DATASET_DEFAULTS.get(given.get("dataset"), {}).items():
        if given.get(k) is None:
            given[k] = v
    return Config(**{k: v for k, v in given.items()
                     if v is not None or fields[k].default is None})


def parse_settings(pairs) -> dict:
    """``["hidden=64", "max_norm=1.0"]`` -> ``{"hidden": "64", "max_norm": "1.0"}`` (the task
    converts each to its default's type before any process starts)."""
    from distkit.errors import DistkitError

    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise DistkitError(f"--set {pair!r} is not NAME=VALUE: give e.g. --set hidden=64")
        settings[name] = value
    return settings


# distkit.launch.preflight.CPU_DEFAULT_NPROC, read here without importing torch (which
# preflight imports); tests/test_first_line.py keeps the two equal.
CPU_PROCESSES = 2


def visible_gpus() -> int:
    """NVIDIA GPUs the driver lists, found without importing torch (0 without a driver)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def first_line(config: Config, environ=os.environ) -> str:
    """What ``distkit train`` is starting, said before torch's import (several seconds):
    what it trains, on how many processes, where its output goes."""
    what = (f"the task {config.task}" if config.task else f"{config.model} on {config.dataset}")
    what += f", {config.epochs} epoch(s)" if config.epochs else ""
    if "WORLD_SIZE" in environ:
        where = f"rank {environ.get('RANK', '0')} of {environ['WORLD_SIZE']} processes started by torchrun"
    elif "SLURM_NTASKS" in environ and "SLURM_PROCID" in environ:
        where = f"task {environ['SLURM_PROCID']} of {environ['SLURM_NTASKS']} processes started by SLURM"
    elif config.nproc_per_node:
        where = f"{config.nproc_per_node} process(es) on this machine"
    elif config.backend == "none":
        where = "1 process, no process group"
    elif visible_gpus() and config.backend in ("auto", "nccl"):
        where = f"{visible_gpus()} processes, one per GPU"
    else:
        where = f"{CPU_PROCESSES} processes on the CPU (gloo)"
    nodes = f" x {config.nnodes} nodes" if config.nnodes > 1 else ""
    return (f"distkit train: {what}, on {where}{nodes}; output in a new folder under "
            f"{config.output_dir}/ (loading torch...)")


def announce(config: Config, environ=os.environ) -> None:
    """Print :func:`first_line` once per run: from the launching process, or rank 0 of a
    torchrun / SLURM launch."""
    rank = environ.get("RANK", environ.get("SLURM_PROCID", "0"))
    if rank == "0":
        print(first_line(config, environ), flush=True)


def main(args) -> int:
    config = config_from_args(args)
    announce(config)  # before torch: its import alone takes seconds

    import torch

    from distkit.launch.entry import run
    from distkit.host.facts import world_layout
    from distkit.observe.reporting import run_summary

    # This process only launches (or, joined to torchrun, trains and sets its own count):
    # on one thread it never starts an OpenMP pool, so its workers fork safely at any count.
    torch.set_num_threads(1)
    results = run(config)
    # under torchrun / SLURM every rank gets rank 0's results: one summary, from rank 0
    if results is not None and world_layout().rank == 0:
        if results.get("profile"):
            from distkit.observe.profiling import write_csv

            write_csv(results["profile"], f"{results['run_dir']}/profile.csv")
        print(run_summary(results))
    return 0
