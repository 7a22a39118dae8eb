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


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_attention_replays_are_right_by_default_and_each_mistake_differs(seed, n):
    import torch.nn.functional as F

    check = load_check("test_13_ring_attention")
    q, k, v = check.qkv(seed, n)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    right = check.replay(q, k, v, n)
    assert all(check.same(out, check.block(full, rank)) for rank, out in enumerate(right))
    replays = [(change, check.replay(q, k, v, n, **change)) for change, _ in check.MISTAKES]
    # some mistakes only show in some layouts (why the check runs them all): with one rank
    # there is one block (nothing to skip, mask or rescale), with two the next rank is the
    # previous one (the ring has no direction)
    hidden = {1: {"backwards", "skip_later", "mask_earlier", "rescale"}, 2: {"backwards"}}.get(n, set())
    replays = [(c, r) for c, r in replays if not hidden & set(c)]
    for i, (change, rows) in enumerate(replays):
        assert not all(check.same(a, b) for a, b in zip(rows, right)), f"{change} replays the right answer"
        for other, earlier in replays[:i]:
            assert not all(check.same(a, b) for a, b in zip(rows, earlier)), \
                f"{change} and {other} give the same rows: the check could not tell them apart"


def test_the_adversarial_inputs_are_adversarial():
    """Head 1's scores are all near -200 (a running maximum started at 0 underflows), head
    0's of magnitude about 100 and both signs; no input is exact in bfloat16."""
    check = load_check("test_13_ring_attention")
    q, k, v = check.qkv(3, 2)
    scores = q @ k.transpose(-2, -1) / check.HEAD_DIM ** 0.5
    assert scores[:, 1].max() < -150 and scores[:, 0].min() < -50 and scores[:, 0].max() > 50
    for t in (q, k, v):
        assert (t.bfloat16().float() != t).float().mean() > 0.9
