"""Exercises 12 and 13 (the transformer track): each has at least four plausible wrong
answers, each expecting its own message; and the replayed mistakes the ring-attention
check names are really different from the right answer and from each other (a replay
that equalled the right rows could never be told apart). The wrong answers themselves
are graded by test_exercises.py with all the others."""
from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest

from conftest import REPO_ROOT
from wrong_answers_parallel import WRONG_ANSWERS_12_13


@pytest.mark.parametrize("number", ["12", "13"])
def test_at_least_four_wrong_answers_each_with_its_own_message(number):
    answers = [(name, expected) for n, name, _, expected in WRONG_ANSWERS_12_13 if n == number]
    assert len(answers) >= 4, answers
    assert len({expected for _, expected in answers}) == len(answers), "two wrong answers expect the same message"


def load_check(name):
    checks = REPO_ROOT / "exercises" / "checks"
    sys.path.insert(0, str(checks))  # the checks import their harness
    try:
        spec = importlib.util.spec_from_file_location(f"check_{name}", checks / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        with warnings.catch_warnings():  # its ex13 marker is registered in exercises/pytest.ini only
            warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
            spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(checks))


def test_ring_attention_replays_are_right_by_default_and_each_mistake_differs():
    import torch.nn.functional as F

    check = load_check("test_13_ring_attention")
    q, k, v = check.qkv()
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    right = check.replay()
    assert all(check.close(out, check.block(full, rank)) for rank, out in enumerate(right))
    replays = [check.replay(**change) for change, _ in check.MISTAKES]
    for i, (change, _) in enumerate(check.MISTAKES):
        assert not all(check.close(a, b) for a, b in zip(replays[i], right)), f"{change} replays the right answer"
        for j in range(i):
            assert not all(check.close(a, b) for a, b in zip(replays[i], replays[j])), \
                f"{change} and {check.MISTAKES[j][0]} give the same rows: the check could not tell them apart"
