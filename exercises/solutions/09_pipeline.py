"""Exercise 09 (advanced): a pipeline of N stages with micro-batches, one stage per rank.
(Solution.)

See ``exercises/09_pipeline.py`` for the task.
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    """Forward and backward of one batch through this rank's stage, in micro-batches (GPipe)."""
    # idist works with and without a process group: 1 process is rank 0 of 1, first and last.
    rank, world_size = idist.get_rank(), idist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    received, outputs, sends = [], [], []
    total = 0.0

    # Forward of every micro-batch, in order. Each one is computed as soon as it has arrived
    # and passed on at once: while the next stage works on micro-batch k, this one already
    # computes k + 1.
    for k in range(n_microbatches):
        if first:
            x = inputs[k]
        else:
            x = torch.empty(activation_shape, device=idist.device())
            dist.recv(x, src=rank - 1)  # blocking: there is nothing to compute without it
            # A leaf that requires grad: its .grad is what the previous stage needs back.
            x.requires_grad_()
        out = stage(x)
        if last:
            # Each micro-batch's mean loss divided by their number: the sum is the batch's
            # mean loss, so the accumulated .grad equals the whole batch's gradient.
            out = F.cross_entropy(out, targets[k]) / n_microbatches
            total += out.item()
        else:
            # isend returns at once: this stage goes on with micro-batch k + 1 instead of
            # waiting until the next stage has posted its receive. Send a plain tensor: the
            # autograd graph stays here, in `outputs`.
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        received.append(x)
        outputs.append(out)

    # Backward of every micro-batch, in the same order on every stage, so that each
    # gradient received pairs with the output it belongs to.
    for k in range(n_microbatches):
        if last:
            outputs[k].backward()
        else:
            grad = torch.empty_like(outputs[k])
            dist.recv(grad, src=rank + 1)  # d(loss)/d(this stage's output k)
            outputs[k].backward(grad)
        if not first:
            # isend again: the previous stage may still be busy with its own backward.
            sends.append(dist.isend(received[k].grad, dst=rank - 1))

    for request in sends:
        request.wait()  # a tensor must have left before its buffer goes
    return total if last else None
