"""Exercise 06: scale the learning rate, and warm it up, for a larger world size.

Topic: scaling. With N processes and the same per-process batch, the GLOBAL batch is N
times larger, so each step averages N times more samples and there are N times fewer
steps per epoch. The linear scaling rule (Goyal et al., 2017, "Accurate, Large Minibatch
SGD") compensates: multiply the learning rate by N. A large learning rate at the very
first steps, when the weights are random, can blow training up, so it is reached through
a linear warm-up.

Task: write ``create_lr_scheduler(optimizer, base_lr, warmup_iters, total_iters)``,
returning an ignite parameter scheduler that the trainer calls at every
``Events.ITERATION_STARTED``, such that the learning rate of iteration ``i`` (the first
iteration is i = 1) is the value at step ``i - 1`` of this schedule:

- it rises linearly from 0 at step 0 to ``peak = base_lr * idist.get_world_size()`` at
  step ``warmup_iters``;
- then it falls linearly to 0 at step ``total_iters``.

So with base_lr 0.1, 2 processes, warmup_iters 4, total_iters 12: 0, 0.05, 0.1, 0.15,
0.2, 0.175, 0.15, ... Tool: ``ignite.handlers.PiecewiseLinear(optimizer, "lr",
milestones_values=[(step, value), ...])``.

Check it:  pytest exercises -m ex06     (or: distkit check 06)
Stuck?     distkit check 06 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
from ignite.handlers import PiecewiseLinear


def create_lr_scheduler(optimizer, base_lr: float, warmup_iters: int, total_iters: int):
    """Linear warm-up from 0 to base_lr x world size, then linear decay to 0."""
    # TODO: compute the peak learning rate, then describe the schedule by its milestones.
    raise NotImplementedError("exercise 06: write create_lr_scheduler")
