"""Exercise 10: predict what each rank holds under DDP and FSDP, then shard the model.

Data parallelism (DDP) keeps a whole copy of the model on every rank: its parameters,
their gradients and the optimizer's state. FSDP (``torch.distributed.fsdp.fully_shard``,
notebook 10) keeps 1/N of each on each of N ranks (ZeRO stage 3). The check trains one
step with Adam, in fp32, on 2, 3 and 4 gloo ranks, measures the bytes each rank holds,
and sets them against your prediction.

Task:

1. ``predict_bytes_per_rank(num_params, world_size, strategy)``: the bytes ONE rank holds
   for a model of ``num_params`` parameters trained in fp32 with ``torch.optim.Adam``,
   under ``strategy`` "ddp" or "fsdp", as a dict with the keys "params", "grads" and
   "optimizer" (Adam keeps two moments per parameter, ``exp_avg`` and ``exp_avg_sq``;
   leave out its one-number step counters). Assume every shard is the same size.
2. ``shard(model)``: turn the ``nn.Sequential`` ``model`` into an FSDP model: call
   ``fully_shard`` on every ``nn.Linear`` in it (some sit inside nested blocks), then on
   the model itself (the root), and return the model. The check builds the optimizer afterwards.

Check it:  pytest exercises -m ex10     (or: distkit check 10)
Stuck?     distkit check 10 --hint     (or read exercises/hints.md)
"""
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

FP32_BYTES = 4


def predict_bytes_per_rank(num_params, world_size, strategy):
    """Bytes of "params", "grads" and "optimizer" state one rank holds (fp32, Adam)."""
    # TODO: DDP: every rank holds everything; FSDP: each rank holds 1/world_size of it.
    raise NotImplementedError("exercise 10: write predict_bytes_per_rank")


def shard(model):
    """Shard ``model`` with FSDP2: every nn.Linear, then the root; return it."""
    # TODO: fully_shard each nn.Linear in model.modules(), then fully_shard(model).
    raise NotImplementedError("exercise 10: write shard")
