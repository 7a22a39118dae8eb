"""Exercise 01: average a number across ranks with a collective.

Topic: processes, ranks and collectives. Every process (a "rank") computes its own
number, for example the loss on its own shard of the data. To report ONE number for the
whole run, every rank has to end up with the same average:

    rank 0: average_across_ranks(1.0)  ->  2.5
    rank 1: average_across_ranks(4.0)  ->  2.5

Task: write ``average_across_ranks(value)``. Called on every rank with that rank's
``value``, it returns, on EVERY rank, the mean of all ranks' values, as a Python float.
It must also work in one plain process (world size 1), where it returns ``value``.

Tools: ``idist.all_reduce`` (it accepts a float or a tensor), ``idist.get_world_size()``.

Check it:  pytest exercises -m ex01     (or: distkit check 01)
Stuck?     distkit check 01 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist


def average_across_ranks(value: float) -> float:
    """The mean of ``value`` over all ranks, returned on every rank."""
    # TODO: combine the values of all ranks with a collective, then turn the sum into a mean.
    raise NotImplementedError("exercise 01: write average_across_ranks")
