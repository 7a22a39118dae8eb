"""Checks for exercise 01: ``average_across_ranks`` on 1 and on 2 processes."""
import math

import pytest

import harness

pytestmark = pytest.mark.ex01

VALUES = [1.0, 4.0]  # rank r passes VALUES[r]: mean 2.5, sum 5.0, distinct from both


def on_rank():
    import ignite.distributed as idist

    ex = harness.load("01")
    return ex.average_across_ranks(VALUES[idist.get_rank()])


def explain(rank, got, values):
    expected = sum(values) / len(values)
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return (f"rank {rank} returned {got!r} ({type(got).__name__}); return a Python float "
                f"(a tensor's number is tensor.item())")
    if math.isclose(got, expected, rel_tol=1e-6):
        return None
    common = (f"the values of the ranks are {values}, their average is {expected}, and every "
              f"rank must get it")
    if math.isclose(got, sum(values), rel_tol=1e-6):
        return (f"rank {rank} returned {got}, the SUM over the {len(values)} ranks: divide by "
                f"idist.get_world_size() to get the average ({common})")
    if math.isclose(got, values[rank], rel_tol=1e-6):
        return (f"rank {rank} returned {got}, its own value: nothing was combined across "
                f"ranks ({common}; all_reduce hands the result to every rank, reduce to one)")
    return f"rank {rank} returned {got}, but {common} (all_reduce, not reduce to one rank)"


def test_one_process_returns_its_value():
    ex = harness.load("01")
    problem = explain(0, ex.average_across_ranks(3.0), [3.0])
    if problem:
        raise harness.ExerciseFailure(f"with a single process (world size 1): {problem}")


def test_every_rank_gets_the_average():
    results = harness.run_ranks(on_rank)
    for rank, got in enumerate(results):
        problem = explain(rank, got, VALUES)
        if problem:
            raise harness.ExerciseFailure(problem)
