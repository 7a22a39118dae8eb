"""Exercise 14's check judged outside the sandbox (distkit grade): the reference's data
passes, and no plain data drawn in place of one of its answers (a count, an MFU, a measured
step, a rank's values) earns a pass. Its wrong answers are graded by test_exercises.py."""
from __future__ import annotations

import copy
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support import as_lists, judged_outside, kit_check, outcomes, plain_data

JUNK_SEED = random.randrange(1, 10**6)


@pytest.fixture(scope="module")
def check14():
    return kit_check("14")


@pytest.fixture(scope="module")
def reference14(check14):
    """The reference's data of every part for JUNK_SEED (one 2-node run of 2 processes each)."""
    print(f"exercise 14's cases: DISTKIT_CHECK_SEED={JUNK_SEED}")
    harness = check14.harness
    return {part: check14.collect(part, (harness.REFERENCE,), JUNK_SEED)[harness.REFERENCE]
            for part in check14.PARTS}


def test_the_references_data_passes_outside(check14, reference14):
    from distkit.grade import outside

    reference = outside.to_bytes({"parts": reference14, "failure": None})
    assert outside.verdict(check14, reference, reference, JUNK_SEED) == \
        ("passed", "all 3 parts passed, judged outside the sandbox")


_NUMBER = st.floats() | st.integers(-1, 10**12)


@settings(max_examples=120, deadline=None, print_blob=True)
@given(data=st.data())
def test_no_drawn_answer_earns_a_pass(check14, reference14, data):
    """The reference's data with ONE answer, the measured step or one rank's value replaced by
    drawn plain data: never passed."""
    part = data.draw(st.sampled_from(check14.PARTS), label="part")
    got = copy.deepcopy(reference14[part])
    if part == check14.FLOPS:
        index = data.draw(st.integers(0, len(got) - 1), label="shape")
        junk = data.draw(st.fixed_dictionaries({"returned": _NUMBER}) | outcomes(), label="junk")
        assume(as_lists(junk) != as_lists(got[index]))
        got[index] = junk
    elif part == check14.MFU:
        key = data.draw(st.sampled_from(["results", "measured"]), label="key")
        if key == "measured":
            junk = data.draw(st.tuples(_NUMBER, _NUMBER, _NUMBER) | plain_data(), label="junk")
            assume(as_lists(junk) != as_lists(got["measured"]))
            got["measured"] = junk
        else:
            index = data.draw(st.integers(0, len(got["results"]) - 1), label="case")
            junk = data.draw(st.fixed_dictionaries({"returned": _NUMBER}) | outcomes(), label="junk")
            assume(as_lists(junk) != as_lists(got["results"][index]))
            got["results"][index] = junk
    else:
        rank = data.draw(st.integers(0, len(got) - 1), label="rank")
        key = data.draw(st.sampled_from(["mfu", "flops"]), label="key")
        junk = data.draw(_NUMBER | plain_data(), label="junk")
        assume(as_lists(junk) != as_lists(got[rank][key]))
        got[rank][key] = junk
    assert judged_outside(check14, part, got, reference14[part], JUNK_SEED) == "failed"
