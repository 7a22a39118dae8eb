"""Exercises 10 (bytes per rank under DDP and FSDP) and 11 (a pipeline schedule and its
bubble), checked both ways as tests/test_exercises.py checks 01-09: the untouched stubs
fail with NotImplementedError, the solutions pass, and plausible wrong answers are
rejected with the sentence that names the learner's mistake."""
from __future__ import annotations

import re

import pytest

from test_exercises import by_exercise, run_checks, wrong_source

MINE = ["10", "11"]
ONLY_MINE = "ex10 or ex11"

# (exercise, what the learner did, the change to the solution, what the learner must read)
WRONG_ANSWERS = [
    # 10 sharded memory
    ("10", "FSDP predicted like DDP", [('shards = world_size if strategy == "fsdp" else 1', "shards = 1")],
     r"under FSDP with 2 ranks you predicted \d+ bytes of params .*that is what DDP keeps; under "
     r"FSDP each of the 2 ranks keeps 1/2"),
    ("10", "DDP divided by the world size too",
     [('shards = world_size if strategy == "fsdp" else 1', "shards = world_size")],
     r"under DDP with 2 ranks .*under DDP every rank keeps the WHOLE model: do not divide"),
    ("10", "one Adam moment", [('"optimizer": 2 * FP32_BYTES', '"optimizer": FP32_BYTES')],
     r"bytes of optimizer per rank.*Adam keeps TWO moments per parameter"),
    ("10", "values, not bytes", '''
def predict_bytes_per_rank(num_params, world_size, strategy):
    shards = world_size if strategy == "fsdp" else 1
    return {"params": num_params // shards, "grads": num_params // shards,
            "optimizer": 2 * num_params // shards}
''', r"you counted values, not bytes: an fp32 value takes 4 bytes"),
    ("10", "a fixed 2 for the world size",
     [('shards = world_size if strategy == "fsdp" else 1', 'shards = 2 if strategy == "fsdp" else 1')],
     r"with 4 ranks under FSDP you predicted .*divide by world_size, not by a fixed number"),
    ("10", "only the root sharded",
     [("            fully_shard(layer)  # one unit per layer: only one layer's full weight at a time\n",
       "            pass\n")],
     r"only 0 of the 3 nn.Linear layers are FSDP units of their own"),
    ("10", "the root left out", [("    fully_shard(model)  # the root\n", "")],
     r"the model itself is not sharded: .*fully_shard\(model\)"),
    ("10", "the model not returned", [("    fully_shard(model)  # the root\n    return model",
                                       "    fully_shard(model)  # the root")],
     r"shard\(model\) returned NoneType, not the model"),
    # 11 pipeline bubble
    ("11", "(p-1)/m", [("return (stages - 1) / (microbatches + stages - 1)", "return (stages - 1) / microbatches")],
     r"you predicted a bubble of 0\.5 for 2 stages and 2 micro-batches; measured: .*\(p-1\)/m leaves "
     r"out the slots"),
    ("11", "a formula for 2 stages only",
     [("return (stages - 1) / (microbatches + stages - 1)", "return 1 / (microbatches + 1)")],
     r"bubble_fraction\(4, 8\) returned 0\.111.*fits 2 stages but not 4"),
    ("11", "n_microbatches ignored",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=num_stages,")],
     r"with n_microbatches=4 and a batch of 16, rank 0 sent 2 activation tensor\(s\) of shape \(8, 8\)"),
    ("11", "the sum of the losses",
     [("return torch.stack(losses).mean().item()", "return torch.stack(losses).sum().item()")],
     r"4x the batch's loss .*SUM of the 4 micro-batch losses; return their mean"),
    ("11", "a tensor returned",
     [("return torch.stack(losses).mean().item()", "return torch.stack(losses).mean()")],
     r"the last stage returned 'tensor\(.*return the mean of the micro-batch losses as a Python float"),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_untouched_stubs_fail_with_not_implemented(tmp_path):
    grouped = by_exercise(run_checks(tmp_path, "stubs", "-m", ONLY_MINE))
    assert sorted(grouped) == MINE
    for n, tests in grouped.items():
        for test_id, outcome, message in tests:
            assert outcome == "failed", f"{test_id}: {outcome} with the stub\n{message[:2000]}"
            assert f"exercise {n} is not solved yet" in message and "NotImplementedError" in message, message[:2000]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_solutions_pass(tmp_path):
    results = run_checks(tmp_path, "solutions", "-m", ONLY_MINE)
    assert sorted(by_exercise(results)) == MINE
    failed = {t: m[:2000] for t, (o, m) in results.items() if o != "passed"}
    assert not failed, failed


def test_every_wrong_answer_still_applies_and_each_exercise_has_three():
    for number, name, change, _ in WRONG_ANSWERS:
        compile(wrong_source(number, name, change), f"{number}: {name}", "exec")
    counts = {n: sum(1 for m, *_ in WRONG_ANSWERS if m == n) for n in MINE}
    assert all(c >= 3 for c in counts.values()), counts


@pytest.fixture(scope="module")
def wrong_answer_results(tmp_path_factory):
    """Grade the wrong answers in rounds (one file per exercise and round)."""
    rounds, seen = {}, {}
    for number, name, change, _ in WRONG_ANSWERS:
        index = seen.get(number, 0)
        seen[number] = index + 1
        rounds.setdefault(index, []).append((number, name))
        folder = tmp_path_factory.getbasetemp() / f"wrong-10-11-round-{index}"
        folder.mkdir(exist_ok=True)
        from test_exercises import SOLUTIONS

        filename = next(SOLUTIONS.glob(f"{number}_*.py")).name
        (folder / filename).write_text(wrong_source(number, name, change))
    graded = {}
    for index, members in rounds.items():
        folder = tmp_path_factory.getbasetemp() / f"wrong-10-11-round-{index}"
        marker = " or ".join(f"ex{n}" for n in sorted({n for n, _ in members}))
        grouped = by_exercise(run_checks(folder, str(folder), "-m", marker))
        for number, name in members:
            graded[(number, name)] = grouped.get(number, [])
    return graded


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number,name,expected", [(n, w, e) for n, w, _, e in WRONG_ANSWERS],
                         ids=[f"{n}-{w}" for n, w, _, _ in WRONG_ANSWERS])
def test_wrong_answer_is_rejected_with_the_learners_message(wrong_answer_results, number, name, expected):
    tests = wrong_answer_results[(number, name)]
    assert tests, f"exercise {number}: no check ran for the wrong answer {name!r}"
    failures = [message for _, outcome, message in tests if outcome == "failed"]
    assert failures, f"exercise {number}: the wrong answer {name!r} passed every check"
    assert any(re.search(expected, m, flags=re.S) for m in failures), \
        f"exercise {number}, {name!r}: expected /{expected}/, the learner read:\n" + "\n---\n".join(failures)
    assert not any("not solved yet" in m for m in failures)
