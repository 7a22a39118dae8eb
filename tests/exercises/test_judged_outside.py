"""Exercises 01, 02 and 04 are judged from data alone, as ``distkit grade`` judges them outside
the sandbox: the solution's data (collected once, by the check's own ``collect``, beside the
reference's) passes; the same data with one value the judge decides on made wrong fails with
the learner's message, whatever a field of the learner's data claims; and data drawn in the
shape of the real data (every leaf replaced by a drawn value, or a tensor by one of its shape
filled with a drawn number) never passes and never crashes the grader.

Every case prints its seed; ``DISTKIT_PROPERTY_SEED=N`` draws the same cases again.
"""
from __future__ import annotations

import copy
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from support import solutions_data

NUMBERS = ("01", "02", "04")
SEED = int(os.environ.get("DISTKIT_PROPERTY_SEED") or random.randrange(2 ** 32))
CHECK_SEED = 4242  # the seed of the checks' own random inputs (01's values)
DRAWN = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
             suppress_health_check=list(HealthCheck), max_examples=60)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def replay_line(test: str) -> str:
    return (f"seed {SEED}: DISTKIT_PROPERTY_SEED={SEED} python -m pytest "
            f"tests/exercises/test_judged_outside.py -k {test} -p no:cacheprovider")


@pytest.fixture(scope="module")
def collected():
    """``{number: (check, the solution's parts, the reference's parts)}``, collected as
    distkit check collects them, in real processes."""
    return {number: solutions_data(number, CHECK_SEED) for number in NUMBERS}


def judged(check, got: dict, expected: dict) -> tuple:
    """``(status, message)`` as ``distkit grade`` says it for the learner's data ``got``."""
    from distkit.grade import outside

    return outside.verdict(check, outside.to_bytes({"parts": got, "failure": None}),
                           outside.to_bytes({"parts": expected, "failure": None}), CHECK_SEED)


def a_learners_message(status: str, message: str) -> bool:
    """A verdict of the check's own judge, not the grader's "that is not the check's data"."""
    return status == "failed" and "the data is not what the check collects" not in message


@pytest.mark.parametrize("number", NUMBERS)
def test_the_solutions_data_passes(collected, number):
    check, got, expected = collected[number]
    assert judged(check, got, expected) == \
        ("passed", f"all {len(check.PARTS)} parts passed, judged outside the sandbox")


# --- one decisive value made wrong -----------------------------------------------------------

@seed(SEED)
@settings(**DRAWN)
@given(data=st.data())
def test_01_a_wrong_average_fails_whatever_its_data_claims(collected, data):
    check, got, expected = collected["01"]
    part = data.draw(st.sampled_from(check.PARTS), label="layout")
    rank = data.draw(st.integers(0, len(got[part]) - 1), label="rank")
    index = data.draw(st.integers(0, 2), label="set (fixed, random, adversarial)")
    # off by more than the judge allows (1e-6 of the largest value, about 1e5 at most)
    off = data.draw(st.floats(1.0, 1e6) | st.floats(-1e6, -1.0), label="off by")
    print(f"01: {part}, rank {rank}, set {index}, value off by {off}; {replay_line('test_01')}", flush=True)
    wrong = copy.deepcopy(got)
    entry = wrong[part][rank]["sets"][index]
    entry["value"] = entry["value"] + off
    entry["expected"] = entry["value"]  # a claim of the learner's data, never the reference's
    wrong[part][rank]["device"] = "anything"
    status, message = judged(check, wrong, expected)
    assert a_learners_message(status, message), (status, message)
    assert f"rank {rank}" in message or "every rank returned" in message, message


@seed(SEED)
@settings(**DRAWN)
@given(data=st.data())
def test_02_a_step_off_by_any_amount_fails(collected, data):
    check, got, expected = collected["02"]
    part = data.draw(st.sampled_from(check.PARTS), label="layout")
    # far enough that 3 processes' tolerance (1e-6) does not cover it
    shift = data.draw(st.integers(2 ** 14, 2 ** 22), label="ulps")
    print(f"02: {part}, rank 0's exact step moved by {shift} ulps; {replay_line('test_02')}", flush=True)
    wrong = copy.deepcopy(got)
    after = wrong[part][0]["exact_step"]["after"]
    moved = after.view(torch.int32) + shift * torch.sign(after).to(torch.int32)
    wrong[part][0]["exact_step"]["after"] = moved.view(torch.float32)
    wrong[part][0]["passed"] = True
    status, message = judged(check, wrong, expected)
    assert a_learners_message(status, message), (status, message)
    assert "rank 0's" in message and "step" in message, message


@seed(SEED)
@settings(**DRAWN)
@given(data=st.data())
def test_04_downloads_at_once_or_a_changed_byte_fail(collected, data):
    check, got, expected = collected["04"]
    part = data.draw(st.sampled_from(check.PARTS), label="layout")
    mistake = data.draw(st.sampled_from(["two downloads at once", "a byte changed"]), label="mistake")
    print(f"04: {part}, {mistake}; {replay_line('test_04')}", flush=True)
    wrong = copy.deepcopy(got)
    for r in wrong[part]["ranks"]:
        r["node"] = 0  # where a rank ran is the layout's to say
        for o in r["outcome"]:
            o["lacking"] = None
    if mistake == "two downloads at once":
        first = wrong[part]["ranks"][0]["outcome"][0]
        row = first["downloads_so_far"][0]
        first["downloads_so_far"] = [row, (row[0] + 1, row[1] + 0.1, row[2] + 0.1, row[3])]
        expected_text = "downloaded the dataset at the same time"
    else:
        at = data.draw(st.integers(0, wrong[part]["datasets"][0].numel() - 1), label="byte")
        wrong[part]["datasets"][0][at] += 1
        expected_text = "the dataset: 1 of 16384 entries differ"
    status, message = judged(check, wrong, expected)
    assert a_learners_message(status, message), (status, message)
    assert expected_text in message, message


# --- junk in the shape of the real data ----------------------------------------------------

_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
_PLAIN = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


LONG = 8  # a longer list is drawn whole (plain junk) or kept: drawing each entry overran Hypothesis


def shaped_like(value):
    """A strategy for data of ``value``'s shape: the same keys and lengths, each leaf drawn
    (a tensor: one of its shape and dtype filled with a drawn number, or plain junk)."""
    if isinstance(value, dict):
        return st.fixed_dictionaries({k: shaped_like(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and len(value) > LONG:
        return _PLAIN | st.just(value)  # a sample's indices, say: the tensors beside them are drawn
    if isinstance(value, (list, tuple)):
        return st.tuples(*[shaped_like(v) for v in value]).map(list)
    if isinstance(value, torch.Tensor):
        filled = st.floats(-4, 4).map(lambda x: torch.full(tuple(value.shape), x).to(value.dtype))
        return filled | _PLAIN
    return _PLAIN


@pytest.mark.parametrize("number", NUMBERS)
def test_no_drawn_data_in_the_shape_of_the_real_data_passes(collected, number):
    check, got, expected = collected[number]
    print(f"{number}: {replay_line('test_no_drawn_data')}", flush=True)

    @seed(SEED)
    @settings(**{**DRAWN, "max_examples": 25})
    @given(junk=shaped_like(got))
    def never_passes(junk):
        status, message = judged(check, junk, expected)
        assert status in ("failed", "no verdict"), (status, message)
        assert isinstance(message, str) and message

    never_passes()
