"""Exercise 08: gradient accumulation with no_sync, equal to one step on a larger batch.
(Solution.)

See ``exercises/08_grad_accumulation.py`` for the task.
"""
import contextlib

import ignite.distributed as idist
import torch


def accumulation_step(model, optimizer, loss_fn, micro_batches) -> None:
    """One optimizer step from ``micro_batches``, as if they were one batch."""
    optimizer.zero_grad()
    n = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        # Inside no_sync DDP only accumulates locally; the last backward runs outside it
        # and all-reduces the accumulated sum once. A plain model has no no_sync.
        if last or not hasattr(model, "no_sync"):
            context = contextlib.nullcontext()
        else:
            context = model.no_sync()
        with context:
            # loss_fn gives each micro-batch's MEAN; dividing by n makes the sum over
            # micro-batches the mean over this process's whole batch. DDP then averages
            # over the processes: the mean over the global batch, as in one large step.
            loss = loss_fn(model(x), y) / n
            loss.backward()
    optimizer.step()
