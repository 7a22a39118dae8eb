"""The judges of exercises 05, 07 and 08, as distkit grade runs them: on data that came back
as bytes (``grade.outside.verdict``), never on a learner's objects.

For each exercise the real data is collected once, in this process's forked ranks: the
reference's half, and the solution's as a learner's. Then:

- the solution's data passes every part (a judge that refuses everything would pass the
  property below);
- data drawn by Hypothesis in the shape of the solution's (every number, string, flag and
  tensor of one part redrawn, the other parts the solution's) never passes, and never
  crashes the grader: it fails with a message;
- so does any plain data in place of one part.

What the grader cannot tell from data: values computed right by other means than the
learner's functions (docs/grading.md says what each judge decides from).

Every case prints its seed; ``DISTKIT_PROPERTY_SEED=N`` draws the same cases again.
"""
from __future__ import annotations

import math
import os
import random

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from support import kit_check

SEED = int(os.environ.get("DISTKIT_PROPERTY_SEED") or random.randrange(2 ** 32))
CHECK_SEED = random.Random(SEED).randrange(1, 10 ** 6)  # the check's random inputs
NUMBERS = ("05", "07", "08")
DRAWN = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
             suppress_health_check=list(HealthCheck), max_examples=40, print_blob=True)


def replay_line(test: str) -> str:
    """The line that draws the same cases again (``test``: a -k expression for one test)."""
    return (f"seed {SEED} (check seed {CHECK_SEED}): DISTKIT_PROPERTY_SEED={SEED} python -m pytest "
            f"tests/exercises/test_judges_05_07_08.py -k '{test}' -p no:cacheprovider")


_COLLECTED = {}


def collected(number: str) -> tuple:
    """``(check, solution's data as a learner's, reference's data as bytes)`` of exercise
    ``number``: every part collected once per test session, in real gloo ranks."""
    if number not in _COLLECTED:
        import sys

        from distkit.grade import outside

        check = kit_check(number)
        harness = check.harness
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setenv("DISTKIT_EXERCISES", "solutions")
            sys.modules.pop(f"distkit_exercise_{number}", None)
            data = {part: check.collect(part, (harness.LEARNER, harness.REFERENCE), CHECK_SEED)
                    for part in check.PARTS}
            sys.modules.pop(f"distkit_exercise_{number}", None)
        learner = {part: d[harness.LEARNER] for part, d in data.items()}
        reference = outside.to_bytes({"parts": {part: d[harness.REFERENCE] for part, d in data.items()},
                                      "failure": None})
        _COLLECTED[number] = (check, learner, reference)
    return _COLLECTED[number]


def judged(number: str, parts: dict) -> tuple:
    from distkit.grade import outside

    check, _, reference = collected(number)
    return outside.verdict(check, outside.to_bytes({"parts": parts, "failure": None}), reference, CHECK_SEED)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("number", NUMBERS)
def test_the_solutions_data_passes_every_part(number):
    print(replay_line(f"passes_every_part[{number}]"), flush=True)
    check, learner, _ = collected(number)
    assert judged(number, learner) == ("passed", f"all {len(check.PARTS)} parts passed, judged outside the sandbox")


# --- junk in the shape of the real data ---------------------------------------------------

def _tensor_like(value):
    import torch

    fills = st.sampled_from([0.0, 1.0, -1.0, 1e-7, 1e30, math.nan, math.inf])
    return st.tuples(st.integers(0, 2 ** 31), fills, st.booleans()).map(
        lambda d: (torch.randn(value.shape, generator=torch.Generator().manual_seed(d[0])) * d[1] if d[2]
                   else torch.full(value.shape, d[1])).to(value.dtype))


def shaped(value):
    """A strategy for data of ``value``'s shape: the same containers and keys, every leaf
    redrawn (a number any number, a string any string, a tensor of its shape any values)."""
    import torch

    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-10 ** 6, 10 ** 6)
    if isinstance(value, float):
        return st.floats()
    if isinstance(value, str):
        return st.text(max_size=12)
    if value is None:
        return st.none() | st.floats() | st.text(max_size=4)
    if isinstance(value, torch.Tensor):
        return _tensor_like(value)
    if isinstance(value, tuple):
        return st.tuples(*map(shaped, value))
    if isinstance(value, list):
        return st.tuples(*map(shaped, value)).map(list) if value else st.lists(st.integers(), max_size=3)
    if isinstance(value, dict):
        return st.fixed_dictionaries({key: shaped(v) for key, v in value.items()})
    raise AssertionError(f"the collector sent {type(value).__name__}, not plain data")


_PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3),
                      max_leaves=10)


def _drawn_part(number, data):
    check, learner, _ = collected(number)
    part = data.draw(st.sampled_from(check.PARTS), label="part")
    junk = data.draw(shaped(learner[part]) | _PLAIN, label="junk")
    return part, junk, learner


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", NUMBERS)
@seed(SEED)
@settings(**DRAWN)
@given(data=st.data())
def test_no_data_in_the_shape_of_a_part_earns_a_pass(number, data):
    """One part's data redrawn (the others the solution's): the grader fails it, with a
    message, whatever was drawn."""
    print(replay_line(f"earns_a_pass[{number}]"), flush=True)
    part, junk, learner = _drawn_part(number, data)
    status, message = judged(number, {**learner, part: junk})
    assert status == "failed" and message, (part, status, message)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_timer_refuses_times_no_run_measures():
    """05's timer part on the solution's own run, with its measured times changed as a
    forger would: all the same, or below what was slept."""
    print(replay_line("refuses_times"), flush=True)
    check, learner, _ = collected("05")
    run = learner[check.TIMER]
    for key in ("steps", "fetches", "logged"):
        for forged in ([1.0] * len(run[key]), [t / 2 for t in run[key]], run[key][:-1]):
            status, message = judged("05", {**learner, check.TIMER: {**run, key: forged}})
            assert (status, message) == ("failed", f"the timer's run: {key} are not what a run measures: no marks")
    status, message = judged("05", {**learner, check.TIMER: {**run, "value": math.nan}})
    assert status == "failed" and "its value is nan: no marks" in message, message
