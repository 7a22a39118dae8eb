"""Exercise 09 (advanced): a two-stage pipeline with micro-batches. (Solution.)

See ``exercises/09_pipeline.py`` for the task.
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def pipeline_step(stage, inputs, targets, activation_shape):
    """Forward and backward of one batch through a 2-stage pipeline, in micro-batches."""
    if idist.get_rank() == 0:
        outputs = []
        for x in inputs:
            out = stage(x)
            # Send a plain tensor: the autograd graph stays here, in `outputs`. While
            # rank 1 works on this micro-batch, rank 0 already computes the next one.
            dist.send(out.detach(), dst=1)
            outputs.append(out)
        for out in outputs:
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            # Continue the backward pass through stage 0 from d(loss)/d(activations).
            out.backward(grad)
        return None

    n = len(targets)
    total, sent = 0.0, []
    for y in targets:
        a = torch.empty(activation_shape)
        dist.recv(a, src=0)
        # A leaf that requires grad: backward() fills a.grad, the gradient rank 0 needs.
        a.requires_grad_()
        # Each micro-batch's mean, divided by n: their sum is the mean over the batch,
        # so the accumulated .grad equals the whole batch's gradient. Computed as soon as
        # this micro-batch has arrived, while rank 0 computes (and sends) the next one.
        loss = F.cross_entropy(stage(a), y) / n
        loss.backward()
        # isend: returns at once, so this rank goes on to receive the next micro-batch
        # (a blocking send would wait for rank 0, which is still sending: both would wait)
        sent.append(dist.isend(a.grad, dst=0))
        total += loss.item()
    for request in sent:
        request.wait()  # the gradients must have left before their buffers go
    return total
