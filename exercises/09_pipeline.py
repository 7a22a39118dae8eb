"""Exercise 09 (advanced): a two-stage pipeline with micro-batches.

Beyond the notebooks. Data parallelism keeps a WHOLE copy of the model in every process;
when the model does not fit in one device, that is not enough. Pipeline parallelism cuts
the model into stages, one per process: process 0 runs the first layers and sends their
output (the activations) to process 1, which runs the rest and the loss; in the backward
pass process 1 sends back the gradient of the loss with respect to those activations,
and process 0 continues the backward pass with it. The batch is cut into micro-batches
so that both stages can work at the same time (the GPipe schedule: all forwards, then
all backwards).

Task: write ``pipeline_step(stage, inputs, targets, activation_shape)``, called on 2
processes at once:

- rank 0 holds ``stage`` = the first layers, ``inputs`` = list of micro-batches of
  inputs, ``targets`` = None;
- rank 1 holds ``stage`` = the last layers, ``inputs`` = None, ``targets`` = list of
  micro-batches of class labels;
- ``activation_shape``: the shape of one micro-batch's activations (for ``recv``).

Rank 0 sends each micro-batch's activations as its own tensor, and sends those of the
next micro-batch before it waits for the gradient of the previous one (here: all the
forwards, then all the backwards, as GPipe does), and rank 1 computes on each micro-batch
as soon as it has arrived, before the next one arrives, so that the two stages work at the
same time. Sends and receives pair up in the same order on both sides.

Afterwards each stage's parameters must hold in ``.grad`` exactly the gradients that one
process would compute for the whole model on the whole batch, with the loss
``cross_entropy`` averaged over all samples (every micro-batch has the same size). Return
that loss (a Python float) on rank 1 and None on rank 0. Do not step an optimizer.

Tools: ``torch.distributed.send(tensor, dst)`` / ``recv(tensor, src)`` (point to point;
``idist`` has no wrapper for them), ``dist.isend(tensor, dst)`` (returns at once, with a
handle to ``wait()`` on), ``tensor.detach()``, ``requires_grad_()``,
``tensor.backward(gradient)``.

Check it:  pytest exercises -m ex09     (or: distkit check 09)
Stuck?     distkit check 09 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def pipeline_step(stage, inputs, targets, activation_shape):
    """Forward and backward of one batch through a 2-stage pipeline, in micro-batches."""
    # TODO: rank 0: forward every micro-batch, send the activations; then receive their
    # gradients and backpropagate them. Rank 1: receive, forward, loss, backward, send
    # the activations' gradients back.
    raise NotImplementedError("exercise 09: write pipeline_step")
