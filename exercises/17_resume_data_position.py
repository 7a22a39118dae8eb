"""Exercise 17: where each rank resumes when the world size changes.

A run trained on ``world_size`` processes was stopped, and comes back on
``new_world_size`` processes (a preempted job back with fewer nodes, a run moved from a
laptop to a cluster). Its checkpoint records where it stood: ignite's iteration (the
steps trained since the start, every epoch together), the iterations per epoch, the
world size and each rank's batch. Resume it so that **no sample is trained twice and
none is skipped**, and every global batch after the resume is the one the run would
have trained had it never stopped.

How the data is dealt (``torch.utils.data.distributed.DistributedSampler``): every rank
draws the same order of the epoch's samples (the same seed and ``set_epoch(epoch)``),
whatever the world size. Number that order's places 0, 1, ..., ``epoch_size - 1`` (the
*positions*: the sampler reads the sample at each position). Each step trains a GLOBAL
batch of ``world_size * batch_per_rank`` consecutive positions, and rank ``r`` of ``W``
takes every ``W``-th position of it, starting at its ``r``-th; the next step goes on
where this one ended. So a position does not depend on the world size: it is what makes
a resume on another layout possible.

Task:

1. ``resume_position(iteration, epoch_length, world_size, batch_per_rank)``: where the
   checkpoint stands, ``(epoch, consumed)``: the epoch the resumed run trains in
   (counted from 0, as ``set_epoch`` counts), and how many positions of that epoch were
   trained before the stop. A checkpoint at the end of an epoch resumes at the start of
   the next one (``consumed`` is then 0).
2. ``new_batch_per_rank(world_size, batch_per_rank, new_world_size)``: each new rank's
   batch, so that the global batch stays what it was (the same global batches, the same
   learning rate); raise ``ValueError`` when no such batch exists, naming the global
   batch and the world size (a resume must never quietly train other batches).
3. ``rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank)``: the
   positions rank ``rank`` of a run of ``world_size`` processes trains from the resume to
   the end of the epoch, batch by batch: a list of lists of ints. The epoch's last
   global batch may be short (``epoch_size`` need not divide by the global batch): deal
   what is left of it the same way; a rank with nothing left in it has one batch fewer.
   Count every position once (no padding: ``DistributedSampler`` repeats a few samples
   to even the ranks out; here a repeat would be a sample trained twice).

Example: 22 positions, 2 processes of 3 (a global batch of 6, 4 iterations per epoch),
stopped at iteration 5: epoch 1, 6 positions trained; on 3 processes each takes 2, and
rank 0 trains ``[[6, 9], [12, 15], [18, 21]]``, rank 2 ``[[8, 11], [14, 17], [20]]``.

The check draws the layouts (world sizes 1 to 4 before and after, epochs whose size does
not divide by the global batch, stops anywhere, at an epoch's end too) and compares the
run resumed with your functions against the run that never stopped, and your batches
against ``DistributedSampler``'s own.

Check it:  pytest exercises -m ex17     (or: distkit check 17)
Stuck?     distkit check 17 --hint     (or read exercises/hints.md)
"""


def resume_position(iteration, epoch_length, world_size, batch_per_rank):
    """Where the checkpoint stands in the data: ``(epoch, consumed)``."""
    # TODO: which epoch is the run in after `iteration` steps, and how many positions of it
    # did the steps already trained in it cover (each step is a GLOBAL batch)?
    raise NotImplementedError("exercise 17: write resume_position")


def new_batch_per_rank(world_size, batch_per_rank, new_world_size):
    """Each new rank's batch, so that the global batch stays what it was."""
    # TODO: the global batch, shared out over the new processes; refuse when it cannot be.
    raise NotImplementedError("exercise 17: write new_batch_per_rank")


def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    """The positions this rank trains from the resume to the end of the epoch, batch by batch."""
    # TODO: the positions left in the epoch, dealt as DistributedSampler deals them, in batches.
    raise NotImplementedError("exercise 17: write rank_batches")
