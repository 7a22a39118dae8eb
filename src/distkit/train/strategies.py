"""How the model is spread over the processes: ``ddp`` or ``fsdp`` (``Config.strategy``).

- ``ddp``: ``idist.auto_model`` wraps the model in DistributedDataParallel: every rank
  holds the whole model, its gradients and its optimizer state; ``backward()``
  all-reduces the gradients.
- ``fsdp``: FSDP2's ``torch.distributed.fsdp.fully_shard`` on every layer that owns
  parameters (on every block instead, for a model that names its ``blocks``), then on
  the root: every rank holds 1/N of each parameter, of its gradient and of its
  optimizer state (ZeRO-3). A unit's parameters are all-gathered just before its
  forward and its backward, and its gradients reduce-scattered after the backward.

Checkpoints hold *full* (unsharded) state dicts either way, gathered with
``torch.distributed.checkpoint.state_dict`` (``full_state_dict=True, cpu_offload=True``),
so a checkpoint written under fsdp loads into a plain model, and a ddp checkpoint resumes
an fsdp run (and back).
"""
from __future__ import annotations

import ignite.distributed as idist
import torch
import torch.nn as nn

from distkit.config import SHARDING_BACKENDS, check_strategy


def prepare_model(model: nn.Module, strategy: str) -> nn.Module:
    """The model, placed on this process's device and distributed by ``strategy``."""
    if strategy == "ddp":
        return fix_bucket_order(idist.auto_model(model))
    backend = idist.backend()
    if backend not in SHARDING_BACKENDS:  # e.g. --backend auto that resolved to xla-tpu
        check_strategy("fsdp", backend or "none")
    from torch.distributed.fsdp import fully_shard

    model = model.to(idist.device())
    # One FSDP unit per layer that owns parameters: only one layer's full weights exist
    # at a time. A model that names its repeated blocks (the GPT's ``blocks``) is sharded
    # one block per unit instead, as torchtitan shards a transformer: a block's eight
    # small layers are gathered in one collective, not eight (the kit's default GPT on 2
    # gloo processes, batch 16 x 128, loaded 2-core VM: 0.35-0.45 s of CPU per step and
    # rank against 0.63-0.68 s with one unit per layer, the same losses). The root call
    # takes whatever is left (none here) and drives the hooks.
    blocks = list(_blocks(model))
    inside = {id(m) for block in blocks for m in block.modules()}
    for module in list(model.modules())[1:]:
        if id(module) not in inside and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def fix_bucket_order(model: nn.Module) -> nn.Module:
    """A DDP model whose gradient buckets keep one layout for its whole life.

    Why: DDP buckets the gradients one way for a new process's first step (parameters in
    reverse order, one bucket) and rebuilds them once after it (in the order the first
    backward made them ready). gloo's all-reduce sums each element over the ranks in an
    order set by its place in the bucket, and on 3 or more ranks floating-point addition
    in another order gives other bits: a resumed run's first step (a new process, the
    first layout) then differs from the uninterrupted run's (the rebuilt one), and the
    resumed run ends with other weights. So DDP is asked to rebuild now, from every
    parameter in the model's own order, and then never again: fresh and resumed processes
    sum every step alike. On 1 or 2 ranks the sum of two is the same either way: DDP is
    left as it is. Cost: none per step (docs/resume.md)."""
    reducer = getattr(model, "reducer", None)
    if reducer is None or idist.get_world_size() < 3:
        return model
    reducer._push_all_rebuilt_params()
    reducer._rebuild_buckets()  # a collective: every rank builds its DDP here alike
    return model


def _blocks(model: nn.Module):
    """The model's repeated blocks, if it names them ``blocks`` (a ModuleDict or ModuleList)."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleDict):
        return blocks.values()
    return blocks if isinstance(blocks, nn.ModuleList) else []


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Gathered on rank 0 (the one that writes), in CPU memory; the other ranks get {}.
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


class FullModelState:
    """What ignite's ``Checkpoint`` saves and loads for a sharded model: the full state
    dict (``get_model_state_dict`` / ``set_model_state_dict``). Both are collectives:
    every rank calls them, as ``Checkpoint`` does."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model, options=_full_options())

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # Every rank read the whole file, so every rank loads its own shard from it.
        set_model_state_dict(self.model, state_dict, options=StateDictOptions(full_state_dict=True))


class FullOptimizerState:
    """The optimizer's state (momentum buffers...) unsharded and keyed by parameter name,
    as ``get_optimizer_state_dict`` gives it."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer, options=_full_options())

    def load_state_dict(self, state_dict):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             set_optimizer_state_dict)

        set_optimizer_state_dict(self.model, self.optimizer, state_dict,
                                 options=StateDictOptions(full_state_dict=True))


def checkpoint_objects(model, optimizer) -> tuple:
    """``(model, optimizer)`` as ignite's ``Checkpoint`` should see them."""
    if is_sharded(model):
        return FullModelState(model), FullOptimizerState(model, optimizer)
    return model, optimizer


def full_state_dict_everywhere(model) -> dict:
    """The whole model's state dict on every rank (an all-gather under fsdp)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return getattr(model, "module", model).state_dict()


def peak_memory_bytes() -> tuple[int, str]:
    """This process's peak memory and what was measured: the CUDA caching allocator's
    peak on a GPU, else the peak resident set of the whole process (Linux ``ru_maxrss``:
    the Python interpreter and torch's libraries included, not only tensors)."""
    device = idist.device()
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "peak resident set (ru_maxrss)"


def peak_memory_per_rank() -> dict:
    """Every rank's :func:`peak_memory_bytes`, in rank order (a collective)."""
    value, measure = peak_memory_bytes()
    return {"bytes": [int(v) for v in idist.all_gather(value)], "measure": measure}
