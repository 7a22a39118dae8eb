"""Exercise 09 (advanced): a pipeline of N stages with micro-batches, one stage per rank.

Beyond the notebooks. Data parallelism keeps a WHOLE copy of the model in every process;
when the model does not fit in one device, that is not enough. Pipeline parallelism cuts
the model into stages, one per process: rank 0 runs the first layers and sends their
output (the activations) to rank 1, which runs the next layers and sends its output to
rank 2, and so on; the last rank runs the last layers and the loss. In the backward pass
the gradients flow the other way: the last rank sends back the gradient of the loss with
respect to the activations it received, each rank in the middle continues the backward
pass through its layers with the gradient it received and sends the gradient of ITS
input back, down to rank 0.

Why micro-batches: with the whole batch at once only one stage works at a time, the
others wait. Cut into micro-batches, stage 1 computes micro-batch 1 while stage 0 already
computes micro-batch 2: the stages work at the same time. This is the GPipe schedule:
every stage runs the forward of every micro-batch, then the backward of every one.

Task: write ``pipeline_step(stage, inputs, targets, activation_shape, n_microbatches)``,
called on every rank at once (world size N, N >= 1). Rank r holds stage r:

- ``stage``: this rank's layers (an ``nn.Module``);
- ``inputs``: on rank 0 only, the list of the ``n_microbatches`` micro-batches of
  inputs; None on the other ranks;
- ``targets``: on the last rank (N - 1) only, the list of the micro-batches' class labels;
  None on the other ranks;
- ``activation_shape``: the shape of one micro-batch's activations between two stages
  (the same between every pair), to make the buffers ``recv`` fills;
- ``n_microbatches``: how many micro-batches (a middle rank gets no list to count).

With one process (no process group at all) rank 0 is both the first and the last stage:
it runs the whole model and sends and receives nothing. ``idist.get_rank()`` and
``idist.get_world_size()`` work there too (0 and 1); ``torch.distributed``'s do not.

The order, on rank r: the forward of micro-batch k = 0, 1, ...: rank 0 takes
``inputs[k]``, every other rank receives micro-batch k's activations from rank r - 1;
the stage computes on it at once (before the next micro-batch arrives) and sends its
output to rank r + 1, or, on the last rank, computes the loss. Then the backward of
micro-batch k = 0, 1, ... in the same order: every rank but the last receives the
gradient of its output k from rank r + 1 and backpropagates it; every rank but the first
sends the gradient of the input it received for k to rank r - 1. Send each micro-batch's
activations (and each gradient) as a tensor of its own, of ``activation_shape``; sends and
receives pair up in the same order on both sides of each link.

A blocking ``dist.send`` returns only once the peer has posted the matching ``recv``: a
stage would stand still while the next one is busy, and two ranks both blocked in a
``send`` to each other wait forever. Send with ``dist.isend`` (it returns at once with a
handle) and ``wait()`` on the handles before returning.

Afterwards each stage's parameters must hold in ``.grad`` exactly the gradients that one
process would compute for the whole model on the whole batch, with the loss
``cross_entropy`` averaged over all samples (every micro-batch has the same size). Return
that loss (a Python float) on the last rank and None on the others. Do not step an
optimizer. Make the buffers you receive into on ``idist.device()`` (the CPU under gloo,
this rank's GPU under nccl).

Tools: ``dist.recv(tensor, src)`` (blocks until the tensor has arrived),
``dist.isend(tensor, dst)`` (returns a handle to ``wait()`` on), ``dist.send(tensor,
dst)`` (point to point; ``idist`` has no wrapper for them), ``tensor.detach()``,
``requires_grad_()``, ``tensor.backward(gradient)``.

Check it:  pytest exercises -m ex09     (or: distkit check 09)
Stuck?     distkit check 09 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    """Forward and backward of one batch through this rank's stage, in micro-batches (GPipe)."""
    # TODO: forward every micro-batch (take it or receive it, compute, send it on or take
    # the loss), then backward every micro-batch in the same order (receive the output's
    # gradient or start from the loss, backpropagate, send the input's gradient back).
    raise NotImplementedError("exercise 09: write pipeline_step")
