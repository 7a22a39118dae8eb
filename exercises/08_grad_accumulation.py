"""Exercise 08: gradient accumulation with no_sync, equal to one step on a larger batch.

Topic: larger batches. When a batch does not fit in memory, split it into micro-batches,
add up their gradients, and step once: the update is the same as one step on the whole
batch, if each micro-batch's loss is scaled so that the sum of the scaled losses is the
mean loss of the whole batch.

Under DistributedDataParallel every ``backward()`` also all-reduces the gradients across
the processes. With 4 micro-batches that is 4 exchanges where 1 would do: inside
``with model.no_sync():`` DDP only adds up the gradients locally. DDP decides at FORWARD
time: a micro-batch whose forward ran inside ``no_sync()`` is not exchanged, one whose
forward ran outside it is (its backward then exchanges the sum accumulated so far, once).
So run the forward AND the backward of every micro-batch but the last inside it, and the
last one's forward and backward outside.

Task: write ``accumulation_step(model, optimizer, loss_fn, micro_batches)``: one
optimizer step from the list of ``(x, y)`` micro-batches of this process, such that

- the weights afterwards equal those after ONE step on all the micro-batches of all the
  processes together (the loss being the mean over all those samples; every micro-batch
  has the same size);
- the gradients are exchanged between processes ONCE per call, not once per micro-batch;
- it also works with a plain model in one process (which has no ``no_sync``).

Start from zeroed gradients and leave the step done (``optimizer.zero_grad()``,
``loss.backward()``, ``optimizer.step()``).

Check it:  pytest exercises -m ex08     (or: distkit check 08)
Stuck?     distkit check 08 --hint     (or read exercises/hints.md)
"""
import contextlib

import ignite.distributed as idist
import torch


def accumulation_step(model, optimizer, loss_fn, micro_batches) -> None:
    """One optimizer step from ``micro_batches``, as if they were one batch."""
    # TODO: backward every micro-batch (all but the last inside model.no_sync()), with the
    # loss scaled so the total is a mean; then one optimizer step.
    raise NotImplementedError("exercise 08: write accumulation_step")
