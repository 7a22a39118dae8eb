"""Exercise 11: a pipeline schedule, and its bubble predicted then measured.

Pipeline parallelism (notebook 11) cuts a model into stages, one per rank, and the batch
into micro-batches that flow through them. In a step of the GPipe schedule each stage
runs all the micro-batches' forwards, then all their backwards; at the start and the end
some stages wait for the others: the *bubble*. The check runs your schedule on 2 gloo
ranks with stages whose forward and backward take a known time, measures the share of
the step each stage sat idle, and sets it against your prediction; then on 3 and 4
ranks (stages in the middle) with several micro-batch counts, against the reference.

Task:

1. ``bubble_fraction(stages, microbatches)``: the share of a step that each stage is
   idle, for ``stages`` equal stages and ``microbatches`` micro-batches, when sending
   costs nothing. (Draw it: how many time slots does a step last, and in how many of
   them does one stage work?)
2. ``pipeline_step(stage_module, stage_index, num_stages, inputs, targets,
   n_microbatches)``: one training step (forward and backward, no optimizer) of this
   rank's stage with ``torch.distributed.pipelining``: wrap ``stage_module`` in a
   ``PipelineStage`` (on the CPU), make a ``ScheduleGPipe`` with ``n_microbatches``
   micro-batches and the loss ``F.mse_loss``, and run ``schedule.step``: the first
   stage gives it ``inputs`` (the whole batch: the schedule cuts it), the last stage
   ``target=targets`` and a list to collect each micro-batch's loss in (``losses=``);
   a stage in the middle gets neither (it receives and sends only).
   Return the mean of those losses as a Python float on the last stage, None elsewhere.

Check it:  pytest exercises -m ex11     (or: distkit check 11)
Stuck?     distkit check 11 --hint     (or read exercises/hints.md)
"""
import torch
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def bubble_fraction(stages, microbatches):
    """The idle share of a GPipe step with equal stages and free communication."""
    # The first micro-batch needs stages - 1 slots to reach the last stage, and its
    # gradient as many to come back: the step lasts microbatches + stages - 1 slots.
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    """One GPipe step of this rank's stage; the mean micro-batch loss on the last stage."""
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    if stage_index == 0:
        schedule.step(inputs)  # cut into micro-batches and sent on
        return None
    if stage_index < num_stages - 1:
        schedule.step()  # a middle stage: receives and sends only
        return None
    losses = []
    schedule.step(target=targets, losses=losses)
    return torch.stack(losses).mean().item()
