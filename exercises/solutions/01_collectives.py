"""Exercise 01: average a number across ranks with a collective. (Solution.)

See ``exercises/01_collectives.py`` for the task.
"""
import ignite.distributed as idist


def average_across_ranks(value: float) -> float:
    """The mean of ``value`` over all ranks, returned on every rank."""
    # all_reduce, not reduce: `reduce` leaves the result on one rank only, and the other
    # ranks would go on with a wrong number. all_reduce sums over all ranks and hands the
    # sum back to every rank. With one plain process idist returns the value unchanged.
    total = idist.all_reduce(float(value))
    # Every rank divides by the same world size, so every rank gets the same mean.
    return total / idist.get_world_size()
