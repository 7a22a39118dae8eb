"""Checks before any process starts, and the choices they settle: the backend
(``auto`` resolved to nccl, xla-tpu or gloo, and refused where it cannot run), the
process count, the master address and port, memory for the synthetic set, a checkpoint
to resume from, a dataset to download. A wrong input ends here in one line, within
seconds, with nothing started and nothing half-written.

``distkit.launch`` calls :func:`preflight` before it starts or joins processes;
notebooks call it to show a refusal::

    >>> from distkit.config import Config
    >>> from distkit.preflight import preflight
    >>> cfg = preflight(Config(backend="gloo"), spawning=True)
    >>> cfg.backend, cfg.nproc_per_node, cfg.master_port is not None
    ('gloo', 2, True)
"""
from __future__ import annotations

import os
import pickle

import ignite.distributed as idist
import torch

from distkit.checkpoint import check_checkpoint_fits, resolve_resume_from
from distkit.compat import pjrt_nprocs, xla_local_device_count
from distkit.config import check_strategy
from distkit.data import VAL_SIZE, fetch_torchvision
from distkit.errors import DistkitError
from distkit.machine import (available_memory, check_address_resolves, check_port_free, free_port,
                             in_ipython, inside_launch, local_world_size, tpu_available)

CPU_DEFAULT_NPROC = 2


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
        return xla_local_device_count()
    if backend == "none":
        return 1  # one plain process, no process group
    return CPU_DEFAULT_NPROC


# Peak memory per sample while the synthetic set is built (templates[labels], the noise,
# their sum, labels, permutation; measured: 787 bytes per 1x8x8 sample with torch 2.15).
SYNTHETIC_BYTES_PER_SAMPLE = 800


def check_synthetic_fits_in_memory(config, processes: int | None) -> None:
    """Every process builds the whole synthetic set in memory: refuse a size that cannot
    fit, instead of swapping the machine to a halt."""
    if config.dataset != "synthetic":
        return
    processes = max(1, processes or 1)
    need = (config.dataset_size + VAL_SIZE) * SYNTHETIC_BYTES_PER_SAMPLE * processes
    have = available_memory()
    if have is not None and need > have:
        fits = max(1, have // (SYNTHETIC_BYTES_PER_SAMPLE * processes) - VAL_SIZE)
        raise DistkitError(
            f"--dataset-size {config.dataset_size} needs about {need / 2**30:.1f} GiB of memory "
            f"({processes} process(es) each build the synthetic set) and {have / 2**30:.1f} GiB "
            f"are available: use --dataset-size {fits} or less")


def preflight(config, spawning: bool, task=None):
    """Resolve the backend and the process count and check everything that can be checked
    before a process starts (a checkpoint to resume from against ``task``'s model).
    Returns a new, complete config."""
    config = config.replace().validate()
    if config.nproc_per_node is not None and inside_launch():
        raise DistkitError(
            f"--nproc-per-node {config.nproc_per_node} inside a torchrun/SLURM launch, which "
            "starts the processes itself: drop --nproc-per-node (torchrun's --nproc_per_node "
            "sets the count), or run distkit train without torchrun")
    backend = resolve_backend(config.backend)
    if config.backend == "auto":  # validate() checked the strategy against a named backend
        check_strategy(config.strategy, backend)
    nproc = config.nproc_per_node
    if spawning and nproc is None:
        nproc = default_nproc(backend)
    if backend == "nccl" and nproc is not None and nproc > torch.cuda.device_count():
        raise DistkitError(f"--nproc-per-node {nproc} with nccl needs {nproc} GPUs but this node "
                           f"has {torch.cuda.device_count()}: use --nproc-per-node "
                           f"{torch.cuda.device_count()} or fewer")
    if backend == "xla-tpu" and nproc not in (None, 1):
        pjrt_nprocs(nproc, xla_local_device_count())  # 1 or every device, else one line
    if backend == "none" and nproc not in (None, 1):
        raise DistkitError(f"--backend none runs one plain process, not {nproc}: use "
                           "--backend gloo to start several")
    if config.master_addr is not None:
        check_address_resolves(config.master_addr)
    check_synthetic_fits_in_memory(config, nproc if spawning else local_world_size())
    if not spawning and "WORLD_SIZE" in os.environ:
        config.check_batch_fits(int(os.environ["WORLD_SIZE"]))
    if spawning:
        if config.nproc_per_node is None:  # else validate() checked it
            config.check_batch_fits(nproc * config.nnodes)
        if config.nnodes == 1 and config.master_port is None:
            config.master_port = free_port()
        elif config.node_rank in (None, 0) and config.master_port is not None:
            check_port_free(config.master_port)
    if config.resume_from == "latest":  # the newest checkpoint under --output-dir, if any
        config = resolve_resume_from(config)
    if config.resume_from:
        world_size = nproc * config.nnodes if spawning else \
            int(os.environ.get("WORLD_SIZE", "1"))
        check_checkpoint_fits(config.resume_from, config, task, world_size)
    if spawning and config.dataset in ("mnist", "cifar10"):
        # Download once here, before any process starts, so an offline machine fails fast.
        fetch_torchvision(config.dataset, config.data_dir)
    return config.replace(backend=backend, nproc_per_node=nproc)


def check_picklable(what: str, obj) -> None:
    """Spawned processes receive their function and arguments pickled; fail in one line
    here rather than in every child. (Forked processes, as in notebooks, need no pickle.)"""
    if in_ipython():
        return
    try:
        pickle.dumps(obj)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DistkitError(
            f"{what} cannot be sent to spawned processes ({why}): define its functions at the "
            "top level of an importable module, or of a script run under an "
            "`if __name__ == \"__main__\":` guard, not as lambdas or nested functions") from None
