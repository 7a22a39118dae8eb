"""Exercises 12 and 13 (the transformer track): each has at least four plausible wrong
answers, each expecting its own message; and the replayed mistakes the ring-attention
check names are really different from the right answer and from each other (a replay
that equalled the right rows could never be told apart). The wrong answers themselves
are graded by test_exercises.py with all the others."""
from __future__ import annotations


import pytest

from support import kit_check, kit_harness
from wrong_answers_parallel import WRONG_ANSWERS_12_13


@pytest.mark.parametrize("number", ["12", "13"])
def test_at_least_four_wrong_answers_each_with_its_own_message(number):
    answers = [(name, expected) for n, name, _, expected in WRONG_ANSWERS_12_13 if n == number]
    assert len(answers) >= 4, answers
    assert len({expected for _, expected in answers}) == len(answers), "two wrong answers expect the same message"


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_attention_replays_are_right_by_default_and_each_mistake_differs(seed, n):
    import torch.nn.functional as F

    check = kit_check("13")
    q, k, v = check.qkv(seed, n)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    right = check.replay(q, k, v, n)
    assert all(check.same(out, check.block(full, rank)) for rank, out in enumerate(right))
    replays = [(change, check.replay(q, k, v, n, **change)) for change, _ in check.MISTAKES]
    # some mistakes only show in some layouts (why the check runs them all): with one rank
    # there is one block (nothing to skip, mask or rescale), with two the next rank is the
    # previous one (the ring has no direction); one rank's only block is its own, so never
    # using the blocks received, or never updating the running maximum after it, changes nothing
    hidden = {1: {"backwards", "skip_later", "mask_earlier", "rescale", "stale", "keep_m"},
              2: {"backwards"}}.get(n, set())
    replays = [(c, r) for c, r in replays if not hidden & set(c)]
    for i, (change, rows) in enumerate(replays):
        assert not all(check.same(a, b) for a, b in zip(rows, right)), f"{change} replays the right answer"
        for other, earlier in replays[:i]:
            assert not all(check.same(a, b) for a, b in zip(rows, earlier)), \
                f"{change} and {other} give the same rows: the check could not tell them apart"


def test_the_adversarial_inputs_are_adversarial():
    """Head 1's scores are all near -200 (a running maximum started at 0 underflows), head
    0's of magnitude about 100 and both signs; no input is exact in bfloat16."""
    check = kit_check("13")
    q, k, v = check.qkv(3, 2)
    scores = q @ k.transpose(-2, -1) / check.HEAD_DIM ** 0.5
    assert scores[:, 1].max() < -150 and scores[:, 0].min() < -50 and scores[:, 0].max() > 50
    for t in (q, k, v):
        assert (t.bfloat16().float() != t).float().mean() > 0.9


def where_am_i():
    import ignite.distributed as idist
    import torch.distributed as dist

    return (idist.get_rank(), idist.get_world_size(), idist.get_local_rank(), idist.get_nproc_per_node(),
            idist.get_node_rank(), dist.is_available() and dist.is_initialized())


@pytest.mark.slow
def test_every_layout_is_what_it_says():
    """The four layouts really differ: no process group at all; 2 and 3 processes on one
    node; 2 nodes of 2 processes, where the world size is not the processes per node and
    the global ranks of the second node are not its local ranks."""
    harness = kit_harness()
    seen = harness.run_layouts(where_am_i)
    assert seen == {
        "1 process (no process group)": [(0, 1, 0, 1, 0, False)],
        "2 processes": [(r, 2, r, 2, 0, True) for r in range(2)],
        "3 processes": [(r, 3, r, 3, 0, True) for r in range(3)],
        "2 nodes x 2 processes": [(r, 4, r % 2, 2, r // 2, True) for r in range(4)],
    }, seen


def test_difference_names_what_differs_whatever_it_is_given():
    import torch

    harness = kit_harness()
    t = torch.arange(6.0).reshape(2, 3)
    assert harness.difference(t, t.clone()) is None
    assert harness.difference(t, None) == "the output should be a float32 tensor of shape (2, 3), got None"
    assert harness.difference(t, [t]) == "the output should be a float32 tensor of shape (2, 3), got a list of 1"
    assert harness.difference(t, t.T) == "the output should have shape (2, 3), got shape (3, 2)"
    assert "should be a float32 tensor" in harness.difference(t, t.bfloat16())
    assert harness.difference(t, t + torch.tensor([0, 0, 1.0])).startswith(
        "the output: 2 of 6 entries differ; at index (0, 2) expected 2, got 3")
    assert "holds NaN at 1 of 6" in harness.difference(t, t.masked_fill(t == 0, float("nan")))
    assert harness.difference([1.0, 2], [1.0, 3]) == "the output[1] should be 2, got 3"
    assert harness.difference(1.0, "1.0") == "the output should be a number (1.0), got '1.0'"
    assert harness.difference({"a": 1}, {"b": 1}).startswith("the output should be a dict with keys ['a']")


class Unequal:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")


def test_difference_never_raises():
    harness = kit_harness()
    assert "could not be compared" in harness.difference("x", Unequal())
