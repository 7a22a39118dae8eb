"""Measuring props for notebooks 10 and 11: what a rank holds, and what it sends.

The ``torch.distributed`` calls that are the lesson (``fully_shard``, DDP,
``torch.distributed.checkpoint``, the pipelining schedules, ``parallelize_module``) are
typed in the notebooks; this module only counts and tabulates.

- :class:`CommCounter` sees every collective a process issues (a ``TorchDispatchMode``:
  every ``c10d`` op, DDP's gradient all-reduce, FSDP's all-gathers and reduce-scatters,
  DTensor's functional collectives, point-to-point sends) and adds up its *payload*: the
  size of the whole tensor being reduced or gathered.
- :func:`state_bytes` sums the bytes of this rank's parameters, gradients and optimizer
  state: for a sharded (DTensor) parameter, only the local shard.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FP32 = 4  # bytes per float32 value
COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "send", "recv",
               "alltoall", "all_to_all", "reduce", "gather", "scatter"}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def _kind(name: str) -> str | None:
    """'all_gather', 'reduce_scatter', 'all_reduce', 'send', 'recv', ... for a c10d op name."""
    if "c10d" not in name:
        return None
    op = name.split(".")[1] if "." in name else name
    op = op.strip("_").replace("_base", "").replace("_into_tensor", "").replace("_tensor", "")
    aliases = {"allgather": "all_gather", "allreduce": "all_reduce", "reduce_scatter": "reduce_scatter",
               "recv_any_source": "recv", "broadcast": "broadcast"}
    op = aliases.get(op, op)
    # Only data movement: waits, barriers and autograd wrappers around a counted op are not.
    return op if op in COLLECTIVES else None


class CommCounter(TorchDispatchMode):
    """Count the collectives issued inside ``with CommCounter() as c:`` on this rank.

    ``c.calls[kind]`` and ``c.payload[kind]`` (bytes): for a gather, the gathered (whole)
    tensor; for a reduce-scatter, the tensor before scattering; for an all-reduce, the
    tensor; for a send/recv, the tensor sent or received. The largest tensor among the
    op's arguments is that payload in every case. With a ring algorithm each rank sends
    about ``(N-1)/N`` of an all-gather's or reduce-scatter's payload and ``2(N-1)/N`` of an
    all-reduce's: :meth:`sent_per_rank` applies that."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}
        self.payload: dict[str, int] = {}
        self.log: list[tuple] = []  # (kind, shape, dtype) of each op's largest tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = _kind(str(func))
        if kind is not None:
            tensors = sorted(_tensors(list(args) + list((kwargs or {}).values())), key=_nbytes)
            self.calls[kind] = self.calls.get(kind, 0) + 1
            self.payload[kind] = self.payload.get(kind, 0) + (_nbytes(tensors[-1]) if tensors else 0)
            if tensors:
                self.log.append((kind, tuple(tensors[-1].shape), str(tensors[-1].dtype)))
        return func(*args, **(kwargs or {}))

    def total(self) -> int:
        return sum(self.payload.values())

    def sent_per_rank(self, world_size: int) -> float:
        """Bytes each rank puts on the wire under ring all-reduce/all-gather/reduce-scatter."""
        share = (world_size - 1) / world_size
        factor = {"all_reduce": 2 * share, "all_gather": share, "reduce_scatter": share}
        return sum(b * factor.get(k, 1.0) for k, b in self.payload.items())


def state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds: ``params``, ``grads`` and ``optimizer`` state (the tensors
    shaped like a parameter: Adam's two moments; its 0-d step counters are left out)."""
    params = list(model.parameters())
    out = {"params": sum(_nbytes(p) for p in params),
           "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
           "optimizer": 0}
    for state in optimizer.state.values():
        out["optimizer"] += sum(_nbytes(v) for v in state.values()
                                if torch.is_tensor(v) and v.dim() > 0)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def count_params(model) -> int:
    """Ψ: the number of values in the model's parameters (the whole model, unsharded)."""
    return sum(p.numel() for p in model.parameters())


def zero3_bytes(psi: int, world_size: int, optimizer_bytes_per_param: int = 2 * FP32) -> dict:
    """The ZeRO-3 prediction (Rajbhandari et al. 2020) for fp32 training with Adam: each
    of N ranks holds (4 + 4 + 8)·Ψ / N bytes; DDP (ZeRO-0) holds all (4 + 4 + 8)·Ψ."""
    per = {"params": FP32 * psi, "grads": FP32 * psi, "optimizer": optimizer_bytes_per_param * psi}
    per = {k: v / world_size for k, v in per.items()}
    per["total"] = sum(per.values())
    return per


def mib(b: float) -> str:
    return f"{b / 2**20:.3f} MiB"


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``rows`` (dicts) with the given columns, widths fitted."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "-" * len(line), *body])
