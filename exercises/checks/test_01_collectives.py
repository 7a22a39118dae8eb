"""Checks for exercise 01: ``average_across_ranks`` on 1 and on 2 processes."""
import math

import pytest

import harness

pytestmark = pytest.mark.ex01

VALUES = [1.0, 4.0]  # rank r passes VALUES[r]: mean 2.5, sum 5.0, distinct from both


NODE_VALUES = [1.0, 4.0, 2.0, 9.0]  # on 2 nodes of 2 processes: mean 4.0, sum 16.0


def on_rank(values=VALUES):
    import ignite.distributed as idist
    from distkit.lessons.sharded import CommCounter

    ex = harness.load("01")
    with CommCounter() as comm:  # which collectives the answer ran
        got = ex.average_across_ranks(values[idist.get_rank()])
    return {"value": got, "collectives": dict(comm.calls),
            "nproc_per_node": idist.get_nproc_per_node(), "local_rank": idist.get_local_rank()}


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


def combined_by_op(results, values, where):
    """Every rank ran an all_reduce and returned the same number, the largest or smallest
    value (divided by the world size or not): the all_reduce was asked for MAX or MIN.
    Judged over all ranks: one rank's own value may be the extreme too, and alone it would
    read as "nothing was combined"."""
    got = [r["value"] for r in results]
    world, mean = len(values), sum(values) / len(values)
    if world < 2 or not all("all_reduce" in r["collectives"] for r in results) or \
            not all(isinstance(g, (int, float)) and not isinstance(g, bool) for g in got) or \
            len(set(got)) != 1 or math.isclose(got[0], mean, rel_tol=1e-6):
        return
    for name, op, extreme in (("LARGEST", "MAX", max(values)), ("SMALLEST", "MIN", min(values))):
        for combined, shown in ((extreme / world, f" divided by {world}"), (extreme, "")):
            if math.isclose(got[0], combined, rel_tol=1e-6):
                raise harness.ExerciseFailure(
                    f"{where}every rank returned {got[0]}, the {name} of the values "
                    f"({extreme}){shown}: the all_reduce combined them with op='{op}'; an "
                    f"average needs their SUM, all_reduce's default (op='SUM'), divided by "
                    f"idist.get_world_size() (the values of the ranks are {values}, their "
                    f"average is {mean})")


def check_ranks(results, values, where=""):
    got = [r["value"] for r in results]
    combined_by_op(results, values, where)
    problems = [explain(rank, g, values) for rank, g in enumerate(got)]
    right = [rank for rank, problem in enumerate(problems) if problem is None]
    if right and len(right) < len(results):
        wrong = next(rank for rank, problem in enumerate(problems) if problem)
        mean = sum(values) / len(values)
        calls = results[wrong]["collectives"]
        if "reduce" in calls and "all_reduce" not in calls:
            raise harness.ExerciseFailure(
                f"{where}rank {right[0]} got the average {mean}, but {problems[wrong]}: the "
                f"result must reach EVERY rank, so use all_reduce, not reduce (which leaves it "
                f"on one rank only)")
        if isinstance(got[wrong], (int, float)) and math.isclose(got[wrong], sum(values)):
            raise harness.ExerciseFailure(
                f"{where}rank {right[0]} got the average {mean}, but rank {wrong} returned "
                f"{got[wrong]}, the SUM: only some ranks divided it; every rank must divide "
                f"what all_reduce returned by idist.get_world_size()")
        raise harness.ExerciseFailure(
            f"{where}rank {right[0]} got the average {mean}, but {problems[wrong]}: the result "
            f"must reach EVERY rank, and every rank must return it")
    for rank, problem in enumerate(problems):
        calls = results[rank]["collectives"]
        if problem and "broadcast" in calls and "all_reduce" not in calls:
            raise harness.ExerciseFailure(
                f"{where}rank {rank} returned {got[rank]!r}: a broadcast copies ONE rank's value "
                f"to every rank; all_reduce sums them all, then divide by the world size")
        if problem and not results[rank]["collectives"] and isinstance(got[rank], (int, float)) \
                and math.isclose(got[rank], values[rank]):
            raise harness.ExerciseFailure(f"{where}{problem}; no collective ran")
        if problem:
            raise harness.ExerciseFailure(where + problem)


def test_every_rank_gets_the_average():
    check_ranks(harness.run_ranks(on_rank), VALUES)


def test_every_rank_of_two_nodes_gets_the_average():
    # 2 nodes x 2 processes: the world size (4) is not the processes per node (2).
    results = harness.run_nodes(on_rank, NODE_VALUES)
    where = "on 2 nodes of 2 processes each (world size 4): "
    mean = sum(NODE_VALUES) / len(NODE_VALUES)
    for rank, r in enumerate(results):
        got = r["value"]
        if isinstance(got, (int, float)) and math.isclose(got, sum(NODE_VALUES) / r["nproc_per_node"]) \
                and not math.isclose(got, mean):
            raise harness.ExerciseFailure(
                f"{where}rank {rank} returned {got}, the sum {sum(NODE_VALUES)} divided by "
                f"{r['nproc_per_node']}, the processes of ONE node (idist.get_nproc_per_node()): "
                f"the average is over every process of every node, so divide by "
                f"idist.get_world_size() ({len(NODE_VALUES)})")
    check_ranks(results, NODE_VALUES, where)
