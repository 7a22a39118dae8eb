"""Props for notebooks 12 and 13 (tensor, sequence and context parallel): the counting
that is not the lesson.

The ``torch.distributed`` calls that are the lesson (``init_device_mesh``,
``parallelize_module`` with its ``ColwiseParallel`` / ``RowwiseParallel`` /
``SequenceParallel`` plan, ``CommDebugMode``; the ring attention's ``isend`` / ``irecv``)
are typed in the notebooks; the block they split is the kit's own
:class:`distkit.builtin.models.Block`. Nothing here knows about ranks.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor gathered from every rank (``full_tensor()``), else itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_bytes(module: nn.Module) -> int:
    """Bytes of parameters this process holds (a DTensor counts its local shard only)."""
    total = 0
    for p in module.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


def largest_grad_difference(sharded: nn.Module, reference: nn.Module) -> dict:
    """``{parameter name: max |grad − reference grad|}``, each sharded gradient gathered
    whole first. Call it on every rank: gathering a DTensor is a collective."""
    ref = dict(reference.named_parameters())
    return {name: (full(p.grad) - ref[name].grad).abs().max().item()
            for name, p in sharded.named_parameters()}


def causal_work(query_positions, key_positions) -> int:
    """How many (query, key) score entries of causal attention are not masked: pairs with
    key position ≤ query position. The work a rank must do for those queries and keys."""
    q = torch.as_tensor(query_positions).reshape(-1, 1)
    k = torch.as_tensor(key_positions).reshape(1, -1)
    return int((k <= q).sum())
