"""Checks for exercise 01: ``average_across_ranks`` in every layout (1 process with no
process group, 2 and 3 processes, 2 nodes x 2 processes), against the reference solution
on the same values (in the same processes under ``distkit check``; in a process of its own
under ``distkit grade``, which judges outside the sandbox): fixed values (whose mistakes
have a name), seeded random ones, and adversarial ones (large, of both signs, not exact in
bfloat16 or float16, so a sum in low precision shows)."""
import math
import sys

import pytest

import harness

pytestmark = pytest.mark.ex01

VALUES = [1.0, 4.0]  # rank r passes VALUES[r]: mean 2.5, sum 5.0, distinct from both
NODE_VALUES = [1.0, 4.0, 2.0, 9.0]  # on 2 nodes of 2 processes: mean 4.0, sum 16.0
FIXED = {1: [3.0], 2: VALUES, 3: [1.0, 4.0, 2.5], 4: NODE_VALUES}
# The learner's mean against the reference's (float64 through idist): a float32 sum is
# within about 1e-7 x the largest value; one value's share of the mean, or a bfloat16 sum
# (about 4e-3 relative), is far outside.
RTOL = 1e-6


def inputs(seed, world):
    """``[(name, [the value of each rank])]``: fixed, seeded random, adversarial."""
    import random

    rng = random.Random(seed * 10 + world)
    uniform = [round(rng.uniform(-50, 50), 6) for _ in range(world)]
    # magnitudes near 1e5 of both signs: the mean is small beside them, and neither
    # bfloat16 nor float16 holds them (float16 has no 1e5 at all)
    big = [rng.choice((-1, 1)) * (1e5 + rng.uniform(0, 1000)) + 0.1 for _ in range(world)]
    return [("fixed", FIXED[world]), ("random", uniform), ("adversarial", big)]


def on_rank(seed, whos):
    """Per answer in ``whos``, the reference's first (a learner's call that only some ranks
    make cannot pair with the reference's): what ``average_across_ranks`` returned for each
    set of values, the collectives it ran; and where this rank runs."""
    import ignite.distributed as idist

    rank, world = idist.get_rank(), idist.get_world_size()
    sets = inputs(seed, world)
    found = {}
    for who in sorted(whos, key=lambda who: who != harness.REFERENCE):
        average = harness.answer("01", who).average_across_ranks
        found[who] = {"sets": [returned(average, values[rank]) for _, values in sets],
                      "nproc_per_node": idist.get_nproc_per_node(), "device": str(idist.device())}
    return found


def returned(average, value):
    """What ``average(value)`` returned, as plain data: a number, None or a tensor as is,
    anything else as its text (and its kind), with the collectives it ran and their log."""
    import torch
    from distkit.lessons.sharded import CommCounter

    with CommCounter() as comm, harness.Recorder() as record:  # which collectives the answer ran
        got = average(value)
    kind = harness.describe(got) if isinstance(got, (list, tuple)) else type(got).__name__
    if isinstance(got, bool) or got is None:
        pass
    elif isinstance(got, int):
        got = int(got)  # a subclass of int or float (numpy's) travels as the number it is
    elif isinstance(got, float):
        got = float(got)
    elif _is_tensor(got):
        got = got.detach().cpu().as_subclass(torch.Tensor)
    else:
        got = repr(got)[:200]  # whatever it is, the judge gets its text (and kind)
    log = [{"op": c["op"], "devices": list(c.get("devices", ())),
            "copy": None if c.get("copy") is None else c["copy"].detach().cpu()} for c in record.log]
    return {"value": got, "kind": kind, "collectives": dict(comm.calls), "log": log}


def explain(rank, got, values, kind=None):
    """What rank ``rank`` got wrong, or None; ``kind``: the type of what the answer returned
    (``got`` is then its text, for anything but a number, None or a tensor)."""
    expected = sum(values) / len(values)
    if _is_tensor(got):
        return (f"rank {rank} returned a tensor ({got!r}), not a Python float: all_reduce hands "
                f"back what it was given, so pass it float(value) or return tensor.item()")
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        shown = got if kind and isinstance(got, str) else repr(got)
        return (f"rank {rank} returned {shown} ({kind or type(got).__name__}); return a Python float")
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
    problems = [explain(rank, g, values, results[rank].get("kind")) for rank, g in enumerate(got)]
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



def judge_layout(ranks, where, seed):
    """The learner's message for the first thing wrong in one layout (``ranks``: what
    :func:`merged` gives for each rank)."""
    world = len(ranks)
    for index, (name, values) in enumerate(inputs(seed, world)):
        results = [r["sets"][index] for r in ranks]
        shown = "" if name == "fixed" else f"with {name} values {harness.replay(seed)}, "
        for rank, r in enumerate(ranks):
            wrong_device = harness.on_device([c for c in results[rank]["log"] if c["op"] != "wait"],
                                             r["device"])
            if wrong_device:
                raise harness.ExerciseFailure(f"{where}rank {rank}: {wrong_device}")
        if world == 4 and name == "fixed":
            per_node = ranks[0]["nproc_per_node"]
            for rank, r in enumerate(results):
                got = r["value"]
                if isinstance(got, (int, float)) and math.isclose(got, sum(values) / per_node) \
                        and not math.isclose(got, sum(values) / world):
                    raise harness.ExerciseFailure(
                        f"{where}rank {rank} returned {got}, the sum {sum(values)} divided by "
                        f"{per_node}, the processes of ONE node (idist.get_nproc_per_node()): "
                        f"the average is over every process of every node, so divide by "
                        f"idist.get_world_size() ({world})")
        if name == "fixed":
            check_ranks(results, values, where)
            continue
        # against the reference, within one term's share: the mistakes with a name were
        # looked for on the fixed values
        scale = max(abs(v) for v in values)
        for rank, r in enumerate(results):
            got, want = r["value"], r["expected"]
            if isinstance(got, (int, float)) and not isinstance(got, bool) and \
                    math.isclose(got, want, rel_tol=0, abs_tol=RTOL * scale):
                continue
            problem = explain(rank, got, values) if _is_number(got) else None
            low = [c["copy"].dtype for c in r["log"] if c.get("copy") is not None
                   and c["copy"].is_floating_point() and c["copy"].element_size() < 4]
            why = (f": the all_reduce was given a {str(low[0]).replace('torch.', '')} tensor, "
                   f"which cannot hold these values (its sum is off by more than one value's "
                   f"share); reduce the value as a Python float or float32/float64 tensor"
                   if low else (f" ({problem})" if problem else ""))
            raise harness.ExerciseFailure(
                f"{where}{shown}rank {rank}: average_across_ranks({values[rank]!r}) should return "
                f"{want!r}, the reference solution's mean of {values}, got "
                f"{harness.describe(got)}{why}")


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# where each layout's message starts (the 1-process layout has no process group at all)
WHERE = {harness.LAYOUTS[0][0]: "with a single process (world size 1, no process group): ",
         harness.LAYOUTS[1][0]: "",
         harness.LAYOUTS[2][0]: "on 3 processes: ",
         harness.LAYOUTS[3][0]: "on 2 nodes of 2 processes each (world size 4): "}


def merged(got, expected):
    """What :func:`judge_layout` judges, for each rank: the learner's results with the
    reference's beside them, and where the rank ran (the reference's run says that)."""
    ranks = []
    for g, e in zip(harness.same_ranks(got, expected), expected):
        sets = g["sets"]
        if not isinstance(sets, list) or len(sets) != len(e["sets"]):
            raise harness.ExerciseFailure(f"the check's data should hold {len(e['sets'])} sets of values, "
                                          f"got {harness.describe(sets)}")
        ranks.append({"sets": [{**mine, "expected": theirs["value"]} for mine, theirs in zip(sets, e["sets"])],
                      "nproc_per_node": e["nproc_per_node"], "device": e["device"]})
    return ranks


def test_one_process_returns_its_value():
    harness.judge_here(sys.modules[__name__], [PARTS[0]], harness.check_seed())


def test_every_rank_gets_the_average():
    harness.judge_here(sys.modules[__name__], [PARTS[1]], harness.check_seed())


def test_three_processes_get_the_average():
    harness.judge_here(sys.modules[__name__], [PARTS[2]], harness.check_seed())


def test_every_rank_of_two_nodes_gets_the_average():
    # 2 nodes x 2 processes: the world size (4) is not the processes per node (2).
    harness.judge_here(sys.modules[__name__], [PARTS[3]], harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.LAYOUTS)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` in the layout ``part`` names."""
    harness.preload_for("01", whos)
    layout = harness.LAYOUTS[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    judge_layout(merged(got, expected), WHERE[part], seed)
