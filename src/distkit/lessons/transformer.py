"""Props for notebooks 12 and 13 (tensor, sequence and context parallel): a small
pre-norm transformer block to split, and the counting that is not the lesson.

The ``torch.distributed`` calls that are the lesson (``init_device_mesh``,
``parallelize_module`` with its ``ColwiseParallel`` / ``RowwiseParallel`` /
``SequenceParallel`` plan, ``CommDebugMode``; the ring attention's ``isend`` / ``irecv``)
are typed in the notebooks. Nothing here knows about ranks.

Why ``q``, ``k`` and ``v`` are three ``nn.Linear`` and not one fused ``Linear(d, 3d)``:
``ColwiseParallel`` cuts a weight's output features into contiguous halves, which for
separate projections is "half of the heads" on each rank; cutting a fused ``qkv``
weight that way would give rank 0 all of ``q`` and half of ``k``. And why the heads are
found with ``view(B, T, -1, head_dim)``: after the split each rank holds ``heads / N``
of them, and the module must not assume how many.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate ``q``, ``k``, ``v`` projections and
    an output projection ``o``; ``heads`` is used only to know the head size."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        batch, time, _ = x.shape
        # -1: the number of heads THIS process holds (all of them, or 1/N under tensor parallel)
        q, k, v = (proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(batch, time, -1))


class FeedForward(nn.Module):
    """``dim → 4·dim → dim`` with a GELU between."""

    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block (as in GPT-2): ``x + attn(ln1(x))``, then
    ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), CausalSelfAttention(dim, heads)
        self.ln2, self.mlp = nn.LayerNorm(dim), FeedForward(dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


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


def attention_flops(queries: int, keys: int, head_dim: int, heads: int, batch: int) -> int:
    """Multiply-adds × 2 of one attention block: ``q @ kᵀ`` and ``p @ v``."""
    return 2 * 2 * batch * heads * queries * keys * head_dim


def softmax_scale(head_dim: int) -> float:
    return 1 / math.sqrt(head_dim)
