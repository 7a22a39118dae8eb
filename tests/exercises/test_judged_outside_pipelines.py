"""Exercises 09, 10 and 11 are judged outside the learner's process: ``distkit grade``'s
sandbox only collects the learner's data, the reference's is collected apart, and the
grader's own code (``distkit.grade.outside.verdict``) judges both. With the data the
solution and the reference really give (collected once per exercise, on a printed seed):

- the solution's data passes, the stub's failure is its message;
- the fields that decide a verdict are read from the reference's data, never from the
  learner's: learner data that forges them (the whole model's gradients, the reference's
  bytes, "the outputs are the same") is judged on what it computed;
- data drawn by Hypothesis in the shape of the real data (each value replaced by a drawn
  one of its kind, or by any plain value) never earns a pass.

Every case prints its seeds; ``DISTKIT_PROPERTY_SEED=N`` draws the same cases again and
``DISTKIT_CHECK_SEED=N`` collects the same data.
"""
from __future__ import annotations

import os
import random
import re

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from support import kit_harness, solutions_data

SEED = int(os.environ.get("DISTKIT_PROPERTY_SEED") or random.randrange(2 ** 32))
CHECK_SEED = int(os.environ.get("DISTKIT_CHECK_SEED") or random.randrange(1, 10 ** 6))
NUMBERS = ("09", "10", "11")


def replay_line() -> str:
    return (f"seeds: DISTKIT_PROPERTY_SEED={SEED} DISTKIT_CHECK_SEED={CHECK_SEED} python -m pytest "
            f"tests/exercises/test_judged_outside_pipelines.py -p no:cacheprovider")


@pytest.fixture(scope="module")
def collected():
    """``{number: (check, the solution's parts, the reference's parts)}``, collected as
    distkit check collects them, in real processes."""
    return {number: solutions_data(number, CHECK_SEED) for number in NUMBERS}


def verdict(check, parts, reference, failure=None) -> tuple:
    from distkit.grade import outside

    return outside.verdict(check, outside.to_bytes({"parts": parts, "failure": failure}),
                           outside.to_bytes({"parts": reference, "failure": None}), CHECK_SEED)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", NUMBERS)
def test_the_solutions_data_passes_and_a_failure_is_its_message(collected, number):
    print(f"{number}: {replay_line()}", flush=True)
    check, got, expected = collected[number]
    passed = f"all {len(check.PARTS)} parts passed, judged outside the sandbox"
    assert verdict(check, got, expected) == ("passed", passed)
    first = {check.PARTS[0]: got[check.PARTS[0]]}
    said = "exercise 99 is not solved yet: ..."
    assert verdict(check, first, expected, said) == ("failed", said)


def _zeroed(value):
    """``value`` with every tensor in it made zero (a wrong answer's gradients or output)."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_zeroed(v) for v in value)
    if isinstance(value, dict):
        return {k: _zeroed(v) for k, v in value.items()}
    return value


def _forged(number, part, got):
    """The learner's data of ``part`` with its tensors zeroed, each rank also carrying the
    fields that would pass it if the judge read them from the learner's data."""
    forged = []
    for rank in _zeroed(got):
        rank = dict(rank)
        if number == "09":
            for run in rank["runs"].values():
                run["wanted"], run["loss"] = list(run["grads"]), run["returned"]
        elif number == "10":
            rank.update(same_output=True, ddp_out=rank["out"], reference=rank["predicted"])
        else:
            rank.update(wanted=list(rank["grads"]), loss=rank["returned"])
        forged.append(rank)
    return forged


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", NUMBERS)
def test_fields_that_would_pass_are_read_from_the_reference_only(collected, number):
    print(f"{number}: {replay_line()}", flush=True)
    check, got, expected = collected[number]
    part = check.PARTS[0]  # each exercise's first part runs the learner's code on ranks
    parts = {**got, part: _forged(number, part, got[part])}
    status, message = verdict(check, parts, expected)
    assert status == "failed", (status, message)
    wanted = {"09": "gradients", "10": "computes other outputs than the plain one",
              "11": "other gradients than the whole model"}[number]
    assert re.search(wanted, message), message
    assert "no marks" not in message, message


_PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3),
                      max_leaves=6)


def _apart(real, drawn) -> bool:
    return kit_harness().difference(real, drawn, rtol=1e-3, atol=1e-3) is not None


def shaped(value):
    """Values in the shape of ``value``: each leaf a drawn value of its kind (a tensor of its
    shape filled at random), now and then any plain value instead of a leaf or a subtree; in
    a long list (a log of calls, predictions at many points) one item drawn, the rest kept."""
    import torch

    if isinstance(value, torch.Tensor):
        of_kind = st.integers(0, 2 ** 32 - 1).map(
            lambda s: torch.randn(value.shape, generator=torch.Generator().manual_seed(s)).to(value.dtype))
    elif isinstance(value, bool):
        of_kind = st.booleans()
    elif isinstance(value, int):
        of_kind = st.integers()
    elif isinstance(value, float):
        of_kind = st.floats()
    elif isinstance(value, str):
        of_kind = st.text(max_size=8)
    elif isinstance(value, (list, tuple)) and len(value) > 8:
        # the drawn item clearly differs from the real one (the same value would rightly pass)
        of_kind = st.integers(0, len(value) - 1).flatmap(
            lambda i: shaped(value[i]).filter(lambda item: _apart(value[i], item)).map(
                lambda item: type(value)([*value[:i], item, *value[i + 1:]])))
    elif isinstance(value, (list, tuple)):
        of_kind = st.tuples(*[shaped(v) for v in value]).map(type(value)) if value else st.just(value)
    elif isinstance(value, dict):
        of_kind = st.fixed_dictionaries({k: shaped(v) for k, v in value.items()})
    else:
        of_kind = st.none()
    return st.integers(0, 15).flatmap(lambda k: _PLAIN if k == 0 else of_kind)


@pytest.mark.slow
@pytest.mark.timeout(900)
@seed(SEED)
@settings(max_examples=90, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), number=st.sampled_from(NUMBERS))
def test_no_drawn_data_in_the_shape_of_the_real_one_earns_a_pass(collected, data, number):
    """One part drawn (the others the solution's, which pass): the verdict never passes."""
    check, got, expected = collected[number]
    part = data.draw(st.sampled_from(check.PARTS), label="part")
    print(f"{number}, {part}: {replay_line()}", flush=True)
    drawn = data.draw(shaped(got[part]), label="data")
    status, message = verdict(check, {**got, part: drawn}, expected)
    assert status in ("failed", "no verdict"), (status, message)
