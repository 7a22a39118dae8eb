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
    if _is_tensor(got):
        return (f"rank {rank} returned a tensor ({got!r}), not a Python float: all_reduce hands "
                f"back what it was given, so pass it float(value) or return tensor.item()")
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return (f"rank {rank} returned {got!r} ({type(got).__name__}); return a Python float")
    if math.isclose(got, expected, rel_tol=1e-6):
        return None
    world = len(values)
    common = (f"the values of the ranks are {values}, their average is {expected}, and every "
              f"rank must get it")
    if math.isclose(got, sum(values), rel_tol=1e-6) and world > 1:
        return (f"rank {rank} returned {got}, the SUM over the {world} ranks: divide by "
                f"idist.get_world_size() to get the average ({common})")
    divisor = sum(values) / got if got else 0
    if world == 1 and divisor > 1.5 and math.isclose(divisor, round(divisor), rel_tol=1e-6):
        return (f"rank {rank} returned {got}, its value divided by {round(divisor)}, but this "
                f"run has 1 process: the divisor must be the world size, "
                f"idist.get_world_size(), not a fixed number")
    if math.isclose(got, values[rank], rel_tol=1e-6):
        return (f"rank {rank} returned {got}, its own value: nothing was combined across "
                f"ranks ({common}; all_reduce hands the result to every rank)")
    return f"rank {rank} returned {got}, but {common}"


def _is_tensor(value):
    import torch

    return isinstance(value, torch.Tensor)


def test_one_process_returns_its_value():
    ex = harness.load("01")
    problem = explain(0, ex.average_across_ranks(3.0), [3.0])
    if problem:
        raise harness.ExerciseFailure(f"with a single process (world size 1): {problem}")


def test_every_rank_gets_the_average():
    results = harness.run_ranks(on_rank)
    problems = [explain(rank, got, VALUES) for rank, got in enumerate(results)]
    right = [rank for rank, problem in enumerate(problems) if problem is None]
    if right and len(right) < len(results):
        wrong = next(rank for rank, problem in enumerate(problems) if problem)
        raise harness.ExerciseFailure(
            f"rank {right[0]} got the average {sum(VALUES) / len(VALUES)}, but "
            f"{problems[wrong]}: the result must reach EVERY rank, so use all_reduce, not "
            f"reduce (which leaves it on one rank only)")
    for problem in problems:
        if problem:
            raise harness.ExerciseFailure(problem)
