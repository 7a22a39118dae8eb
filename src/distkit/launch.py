"""``run(config)``: start ``training`` in as many processes as asked for, or join a launch.

- ``nproc_per_node`` given (or no launcher around): spawn that many processes on this
  node with ``idist.Parallel`` (one per GPU with nccl; 2 on a CPU-only machine).
- Launched by torchrun or SLURM (``WORLD_SIZE`` / ``SLURM_JOB_ID`` set, no
  ``nproc_per_node``): spawn nothing; this process joins the launch.

Everything checkable is checked before any process starts, so bad input fails in one
line within seconds, with nothing half-written.
"""
from __future__ import annotations

import json
import os
import re
import socket
from datetime import timedelta

import ignite.distributed as idist
import torch

from distkit.errors import DistkitError

CPU_DEFAULT_NPROC = 2


def launched_externally() -> bool:
    """True inside a torchrun / torch.distributed launch or a SLURM job step."""
    return "WORLD_SIZE" in os.environ or "SLURM_JOB_ID" in os.environ


def tpu_available() -> bool:
    try:
        import torch_xla.runtime as xr  # noqa: F401

        return os.environ.get("PJRT_DEVICE", "").upper() == "TPU" or bool(os.environ.get("TPU_NAME")) \
            or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
    except Exception:
        return False


def resolve_backend(backend: str) -> str:
    """Turn ``auto`` into nccl (CUDA), xla-tpu (TPU) or gloo, and check that the chosen
    backend can run here."""
    if backend == "auto":
        if torch.cuda.is_available():
            return "nccl"
        if tpu_available():
            return "xla-tpu"
        return "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise DistkitError("--backend nccl needs CUDA GPUs and none is visible here: "
                           "use --backend gloo (CPU) or --backend auto")
    if backend == "xla-tpu":
        try:
            import torch_xla  # noqa: F401
        except Exception:
            raise DistkitError("--backend xla-tpu needs torch_xla, which is not importable: "
                               "pip install -r requirements-xla.txt in its own environment "
                               "(see README), or use --backend auto") from None
    if backend not in ("none",) and backend not in idist.available_backends():
        raise DistkitError(f"backend {backend!r} is not available in this torch build "
                           f"(available: {', '.join(idist.available_backends())}): use --backend auto")
    return backend


def default_nproc(backend: str) -> int:
    if backend == "nccl":
        return torch.cuda.device_count()
    if backend == "xla-tpu":
        # PJRT replicates over every device of the host (TPU v2/v3: 2 per chip, v4+: 1;
        # XLA:CPU: CPU_NUM_DEVICES, default 1); xmp.spawn takes 1 or all of them.
        from distkit.compat import xla_local_device_count

        return xla_local_device_count()
    if backend == "none":
        return 1  # one plain process, no process group
    return CPU_DEFAULT_NPROC


def threads_per_process(local_world_size: int) -> int:
    """Cores this process may use, divided by the processes on this node (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            raise DistkitError(f"--master-port {port} is already in use on this machine: pick "
                               "another port, or omit --master-port to use a free one") from None


def preflight(config, spawning: bool):
    """Resolve the backend and the process count and check everything that can be checked
    before a process starts. Returns a new, complete config."""
    config = config.replace().validate()
    backend = resolve_backend(config.backend)
    nproc = config.nproc_per_node
    if spawning and nproc is None:
        nproc = default_nproc(backend)
    if backend == "nccl" and nproc is not None and nproc > torch.cuda.device_count():
        raise DistkitError(f"--nproc-per-node {nproc} with nccl needs {nproc} GPUs but this node "
                           f"has {torch.cuda.device_count()}: use --nproc-per-node "
                           f"{torch.cuda.device_count()} or fewer")
    if backend == "xla-tpu" and nproc not in (None, 1):
        from distkit.compat import pjrt_nprocs, xla_local_device_count

        pjrt_nprocs(nproc, xla_local_device_count())  # 1 or every device, else one line
    if backend == "none" and nproc not in (None, 1):
        raise DistkitError(f"--backend none runs one plain process, not {nproc}: use "
                           "--backend gloo to start several")
    if spawning:
        config.check_batch_fits(nproc * config.nnodes)
        if config.nnodes == 1 and config.master_port is None:
            config.master_port = free_port()
        elif config.node_rank in (None, 0) and config.master_port is not None:
            check_port_free(config.master_port)
    if config.resume_from == "latest":  # the newest checkpoint under --output-dir, if any
        from distkit.checkpoint import resolve_resume_from

        config = resolve_resume_from(config)
    if config.resume_from:
        from distkit.checkpoint import check_checkpoint_fits

        check_checkpoint_fits(config.resume_from, config)
    if spawning and config.dataset in ("mnist", "cifar10"):
        # Download once here, before any process starts, so an offline machine fails fast.
        from distkit.data import fetch_torchvision

        fetch_torchvision(config.dataset, config.data_dir)
    return config.replace(backend=backend, nproc_per_node=nproc)


def run(config) -> dict | None:
    """Run ``training`` as the config says; return rank 0's results (None on other ranks
    of an external launch)."""
    from distkit.checkpoint import make_run_dir
    from distkit.training import training

    spawning = config.nproc_per_node is not None or not launched_externally()
    config = preflight(config, spawning)
    if not spawning:
        return _join(config)
    if config.backend == "none":
        config.run_dir = make_run_dir(config.output_dir, "none", 1)
        return training(0, config)

    world_size = config.nproc_per_node * config.nnodes
    if config.nnodes == 1 or config.node_rank == 0:
        config.run_dir = make_run_dir(config.output_dir, config.backend, world_size)
    # Spawned processes inherit this: one thread pool per process, never oversubscribed.
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads(config)))
    spawn_kwargs = {}
    if config.backend in ("gloo", "nccl"):
        spawn_kwargs["timeout"] = timedelta(seconds=config.timeout_s)
    try:
        with idist.Parallel(backend=config.backend, nproc_per_node=config.nproc_per_node,
                            nnodes=config.nnodes, node_rank=config.node_rank,
                            master_addr=config.master_addr, master_port=config.master_port,
                            **spawn_kwargs) as parallel:
            parallel.run(training, config)
    except Exception as e:
        failure = describe_process_failure(e, config.node_rank or 0, config.nproc_per_node)
        if failure is None:
            raise
        raise failure from None
    return read_results(config.run_dir) if config.run_dir else None


def _threads(config) -> int:
    return config.threads_per_process or threads_per_process(config.nproc_per_node)


def _join(config) -> dict | None:
    """Join a torchrun / SLURM launch: this process is one rank; spawn nothing."""
    from distkit.training import training

    kwargs = {}
    if config.backend in ("gloo", "nccl"):
        kwargs["timeout"] = timedelta(seconds=config.timeout_s)
    idist.initialize(config.backend, **kwargs)
    try:
        return training(idist.get_local_rank(), config)
    finally:
        idist.finalize()


def read_results(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def describe_process_failure(error: Exception, node_rank: int, nproc: int) -> DistkitError | None:
    """Turn torch.multiprocessing's report of a dead or failed child into one line that
    names the rank."""
    index = getattr(error, "error_index", None)
    if index is None:
        return None
    rank = node_rank * nproc + index
    signal_name = getattr(error, "signal_name", None)
    exit_code = getattr(error, "exit_code", None)
    if signal_name:
        return DistkitError(f"rank {rank} (local rank {index}) was killed by {signal_name}; the other "
                            "processes were stopped. Resume with --resume-from latest (the newest checkpoint under --output-dir)")
    if exit_code is not None:
        return DistkitError(f"rank {rank} (local rank {index}) exited with code {exit_code}; the "
                            "other processes were stopped. See its output above")
    # ProcessRaisedException: the child's traceback as text; keep its last line.
    text = str(error).strip().splitlines()
    last = text[-1] if text else repr(error)
    m = re.match(r"^distkit\.errors\.DistkitError: (.*)$", last)
    if m:
        return DistkitError(f"rank {rank}: {m.group(1)}")
    return DistkitError(f"rank {rank} (local rank {index}) failed: {last}")
