"""Exercises 12 and 13 (the transformer track): each has at least four plausible wrong
answers, each expecting its own message; and the replayed mistakes the ring-attention
check names are really different from the right answer and from each other (a replay
that equalled the right rows could never be told apart). The wrong answers themselves
are graded by test_exercises.py with all the others."""
from __future__ import annotations

import copy
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

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


# --- judged outside the sandbox: no data the learner's process writes passes unless right ----

PROPERTY_SEED = int(os.environ.get("DISTKIT_PROPERTY_SEED") or random.randrange(2 ** 32))
_JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                    max_size=3),
                     max_leaves=8)
_OPS = ["all_reduce", "all_gather", "broadcast", "reduce", "send", "recv", "isend", "irecv", "wait", "matmul"]


@pytest.fixture(scope="module")
def references():
    """``references(NN)``: (check, every part's reference data, check seed), collected once
    in real gloo processes, as the grader collects it."""
    found = {}

    def get(number):
        if number not in found:
            check = kit_check(number)
            who = check.harness.REFERENCE
            seed = PROPERTY_SEED % 10 ** 6
            found[number] = (check, {p: check.collect(p, (who,), seed)[who] for p in check.PARTS}, seed)
        return found[number]
    return get


def _tensor_like(t):
    """A tensor of ``t``'s shape and dtype with drawn values (never the right ones)."""
    import torch

    return st.lists(st.floats(-1e3, 1e3), min_size=t.numel(), max_size=t.numel()).map(
        lambda v: torch.tensor(v, dtype=t.dtype).reshape(t.shape))


def _spoiled_out(data, out):
    import torch

    how = data.draw(st.sampled_from(["junk", "drawn values", "one entry off", "NaN", "dtype", "shape"]))
    if how == "junk":
        return how, data.draw(_JUNK)
    if how == "drawn values":
        return how, data.draw(_tensor_like(out))
    spoilt, at = out.clone(), data.draw(st.integers(0, out.numel() - 1))
    if how == "one entry off":
        spoilt.view(-1)[at] += data.draw(st.sampled_from([-1, 1])) * data.draw(st.floats(0.05, 1e3))
    elif how == "NaN":
        spoilt.view(-1)[at] = float("nan")
    elif how == "dtype":
        spoilt = spoilt.to(data.draw(st.sampled_from([torch.float64, torch.bfloat16, torch.float16])))
    else:
        spoilt = spoilt.reshape(-1)[: data.draw(st.integers(0, out.numel() - 1))]
    return how, spoilt


def _spoiled_log(data, number, rank, n, log):
    """The reference's calls changed in one way that makes them wrong (only ways that are
    wrong whatever else the log holds), or junk in the log's shape."""
    transfers = [i for i, c in enumerate(log) if c["op"] in ("all_reduce", "send", "recv", "isend", "irecv")]
    how = data.draw(st.sampled_from(["junk entries", "a transfer dropped", "a transfer made twice",
                                     "another op", "another device", "another shape"]
                                    + (["another peer", "no wait", "a block held too long"] if number == "13"
                                       else ["another tensor sent"])))
    spoilt = copy.deepcopy(log)
    if how == "junk entries":
        entry = st.fixed_dictionaries({"op": st.sampled_from(_OPS)}, optional={
            "shapes": st.lists(st.lists(st.integers(0, 9), max_size=4).map(tuple), max_size=2),
            "devices": st.lists(st.sampled_from(["cpu", "cuda:0", "x"]), max_size=2), "peer": _JUNK,
            "of": st.integers(-2, 40), "received_alive": st.integers(-1, 9), "copy": _JUNK})
        return how, data.draw(st.lists(entry, max_size=12) | _JUNK)
    at = data.draw(st.sampled_from(transfers))
    if how == "a transfer dropped":
        del spoilt[at]
    elif how == "a transfer made twice":
        spoilt.insert(at, copy.deepcopy(spoilt[at]))
    elif how == "another op":
        spoilt[at]["op"] = data.draw(st.sampled_from([op for op in _OPS[:4] if op != spoilt[at]["op"]]))
    elif how == "another device":
        spoilt[at]["devices"] = ["cuda:0"] * len(spoilt[at]["devices"])
    elif how == "another shape" and number == "13":
        spoilt[at]["shapes"] = [data.draw(st.lists(st.integers(1, 9), min_size=4, max_size=4).map(tuple)
                                          .filter(lambda shape: shape != tuple(log[at]["shapes"][0])))]
    elif how == "another shape" or how == "another tensor sent":  # 12: the tensor is what is judged
        sent = spoilt[at]["copy"]
        spoilt[at]["copy"] = data.draw(_tensor_like(sent) | st.just(sent.double()) | st.just(sent[:1]))
    elif how == "another peer":
        spoilt[at]["peer"] = data.draw(st.integers(-1, n + 1).filter(lambda p: p != log[at]["peer"]))
    elif how == "no wait":
        spoilt = [c for c in spoilt if c["op"] != "wait"]
    else:
        products = [c for c in spoilt if c["op"] == "matmul"]
        data.draw(st.sampled_from(products))["received_alive"] = data.draw(st.integers(5, 40))
    return how, spoilt


def _spoiled(data, number, parts):
    """The reference's data of every part with one thing drawn and changed; what was changed."""
    part = data.draw(st.sampled_from(sorted(parts)))
    ranks = copy.deepcopy(parts[part])
    n, rank = len(ranks), data.draw(st.integers(0, len(ranks) - 1))
    what = data.draw(st.sampled_from(["out", "rank", "ranks"] + (["log"] if n > 1 else [])
                                     + (["unplaced"] if number == "13" else [])))
    if what == "out":
        how, ranks[rank]["out"] = _spoiled_out(data, ranks[rank]["out"])
    elif what == "log":
        how, ranks[rank]["log"] = _spoiled_log(data, number, rank, n, ranks[rank]["log"])
    elif what == "unplaced":  # a tensor made with no device, on the learner's own line
        how, ranks[rank]["unplaced"] = "some", data.draw(
            st.lists(st.tuples(st.text(max_size=8), st.integers()), min_size=1, max_size=3)
            | _JUNK.filter(bool))
    elif what == "rank":
        how, ranks[rank] = "junk", data.draw(_JUNK | st.fixed_dictionaries({}, optional={
            "out": _JUNK, "log": _JUNK, "unplaced": _JUNK}))
    else:
        how = data.draw(st.sampled_from(["a rank less", "a rank more", "junk"]))
        ranks = ranks[1:] if how == "a rank less" else ranks + ranks[:1] if how == "a rank more" \
            else data.draw(_JUNK)
    return f"{part}: {what} ({how}) of rank {rank}", {**parts, part: ranks}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("number", ["12", "13"])
def test_the_graders_judge_passes_only_the_right_data(number, references):
    """distkit grade judges 12 and 13 from the data a learner's process writes: the reference's
    own data passes, and each drawn change of it (in the shapes of the real data: outputs,
    records of calls, tensors made with no device, ranks) fails, judged by the grader's code
    (a failure, never a crash that earns marks)."""
    from distkit.grade import outside

    check, parts, check_seed = references(number)
    reference = outside.to_bytes({"parts": parts, "failure": None})
    print(f"{number}: check seed {check_seed}; DISTKIT_PROPERTY_SEED={PROPERTY_SEED} python -m pytest "
          f"tests/exercises/test_exercises_parallel.py -k graders_judge -p no:cacheprovider", flush=True)
    assert outside.verdict(check, reference, reference, check_seed)[0] == "passed"

    @hyp_seed(PROPERTY_SEED)
    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def judged(data):
        what, spoilt = _spoiled(data, number, parts)
        status, message = outside.verdict(check, outside.to_bytes({"parts": spoilt, "failure": None}),
                                          reference, check_seed)
        assert status != "passed", f"{what} passed: {message}"

    judged()


def test_13s_judge_names_every_transfer_to_or_from_a_rank_off_the_ring(references):
    """Each transfer of the reference's record, in every layout with a ring, given every
    other peer (-1 to N): the grader's judge fails it (on 2 ranks the next rank is also the
    previous one, and a receive from nowhere once passed there)."""
    from distkit.grade import outside

    check, parts, check_seed = references("13")
    reference = outside.to_bytes({"parts": parts, "failure": None})
    tried = 0
    for part, ranks in parts.items():
        n = len(ranks)
        for rank, r in enumerate(ranks):
            for at, call in enumerate(r["log"]):
                if call["op"] not in ("send", "recv", "isend", "irecv"):
                    continue
                for peer in set(range(-1, n + 1)) - {call["peer"]}:
                    spoilt = copy.deepcopy(parts)
                    spoilt[part][rank]["log"][at]["peer"] = peer
                    status, message = outside.verdict(check, outside.to_bytes({"parts": spoilt, "failure": None}),
                                                      reference, check_seed)
                    assert status == "failed" and "ring neighbours" in message, (part, rank, call, peer, message)
                    tried += 1
    assert tried > 100, tried
