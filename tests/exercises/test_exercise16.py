"""Exercise 16 (reading a hung run's records) checked both ways, as test_exercises.py
checks the others: the untouched stub fails for the right reason, the solution passes
(hand-built records, then records with a disagreement planted anew each run), and each
plausible wrong answer of ``wrong_answers_hang.WRONG_ANSWERS_16`` is rejected with the
sentence the learner reads. The check starts no process, so every wrong answer is graded
in this process, in milliseconds, with the check's own seed (printed: a failure replays
with ``DISTKIT_CHECK_SEED``)."""
from __future__ import annotations

import copy
import os
import random
import re

import pytest

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support import as_lists, judged_outside, kit_check, outcomes

from test_exercises import SOLUTIONS, by_exercise, run_checks, wrong_source
from wrong_answers_hang import WRONG_ANSWERS_16


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stub_fails_and_solution_passes(tmp_path):
    stub = by_exercise(run_checks(tmp_path, "stubs", "-m", "ex16"))["16"]
    assert len(stub) == 2
    for test_id, outcome, message in stub:
        assert outcome == "failed" and "exercise 16 is not solved yet" in message, (test_id, message)
    solved = by_exercise(run_checks(tmp_path, "solutions", "-m", "ex16"))["16"]
    assert [outcome for _, outcome, _ in solved] == ["passed", "passed"], solved


def test_every_wrong_answer_still_applies_to_its_solution():
    assert len(WRONG_ANSWERS_16) >= 3
    for number, name, change, _ in WRONG_ANSWERS_16:
        compile(wrong_source(number, name, change), f"{number}: {name}", "exec")


@pytest.fixture(scope="module")
def check16():
    """The check module of exercise 16, imported here."""
    return kit_check("16")


def run_check(check16):
    check16.test_records_whose_answer_is_known()
    check16.test_records_with_a_planted_disagreement_of_every_family()


@pytest.fixture
def seed(monkeypatch):
    chosen = int(os.environ.get("DISTKIT_CHECK_SEED") or random.randrange(1, 10**6))
    print(f"exercise 16's records: DISTKIT_CHECK_SEED={chosen}")
    monkeypatch.setenv("DISTKIT_CHECK_SEED", str(chosen))
    return chosen


def test_the_solution_passes_records_of_many_seeds(monkeypatch, check16, seed):
    # the planted records change with the seed: the reference must pass them all
    monkeypatch.setenv("DISTKIT_EXERCISES", "solutions")
    for k in range(200):
        monkeypatch.setenv("DISTKIT_CHECK_SEED", str(seed + k))
        run_check(check16)


@pytest.mark.parametrize("name,change,expected", [(n, c, e) for _, n, c, e in WRONG_ANSWERS_16],
                         ids=[n for _, n, _, _ in WRONG_ANSWERS_16])
def test_wrong_answer_is_rejected_with_the_learners_message(tmp_path, monkeypatch, check16, seed, name, change,
                                                            expected):
    folder = tmp_path / "wrong"
    folder.mkdir()
    filename = next(SOLUTIONS.glob("16_*.py")).name
    (folder / filename).write_text(wrong_source("16", name, change))
    monkeypatch.setenv("DISTKIT_EXERCISES", str(folder))
    with pytest.raises(check16.harness.ExerciseFailure) as failure:
        run_check(check16)
    message = str(failure.value)
    assert re.search(expected, message, flags=re.S), f"{name!r}: expected /{expected}/, the learner read:\n{message}"
    assert not isinstance(failure.value, check16.harness.NotSolved)
    from mutants import leaked_lines  # a message that prints a line of the solution gives it away

    assert not leaked_lines("16", message, wrong_source("16", name, change))


def test_the_exercises_records_are_the_doctors(check16, seed):
    """The records the check plants are what distkit's hang doctor reads: its verdict on
    each names the odd rank and, where the rank is at a line, that line (every family, 3 to
    6 ranks, records in any order, 50 record sets from the printed seed)."""
    from distkit.observe import hangs

    rng = random.Random(seed)
    for _ in range(5):
        for family in check16.KIND_OF:
            world = rng.randint(3, 6)
            planted = check16.Planted(rng, family, world, rng.randrange(world),
                                      order=rng.sample(range(world), world))
            rank, _, line = planted.answer
            said = hangs.verdict(copy.deepcopy(planted.dumps))
            assert re.search(rf"\brank {rank}\b", said) and (line is None or line in said), \
                (family, planted.answer, said)


# --- judged outside the sandbox: what the grader's judge accepts -----------------------------

JUNK_SEED = random.randrange(1, 10**6)


@pytest.fixture(scope="module")
def reference16(check16):
    print(f"exercise 16's records: DISTKIT_CHECK_SEED={JUNK_SEED}")
    harness = check16.harness
    return {part: check16.collect(part, (harness.REFERENCE,), JUNK_SEED)[harness.REFERENCE]
            for part in check16.PARTS}


def test_the_references_data_passes_outside(check16, reference16):
    from distkit.grade import outside

    reference = outside.to_bytes({"parts": reference16, "failure": None})
    assert outside.verdict(check16, reference, reference, JUNK_SEED) == \
        ("passed", "all 2 parts passed, judged outside the sandbox")


_ANSWERS = st.tuples(st.integers(-1, 7), st.sampled_from(["op", "shape", "dtype", "missing", "extra", "x"]),
                     st.none() | st.sampled_from(["train.py:21", "train.py:19", "eval.py:7"]) | st.text(max_size=5))


@settings(max_examples=150, deadline=None, print_blob=True)
@given(data=st.data())
def test_no_drawn_answer_earns_a_pass(check16, reference16, data):
    """The reference's answers with ONE replaced by a drawn one (a plausible tuple, or any
    plain data in an outcome), or cut short, or wholly drawn: never passed."""
    part = data.draw(st.sampled_from(check16.PARTS), label="part")
    cases = list(reference16[part])
    how = data.draw(st.sampled_from(["one case", "cut short", "all drawn"]), label="how")
    if how == "one case":
        index = data.draw(st.integers(0, len(cases) - 1), label="case")
        junk = data.draw(st.fixed_dictionaries({"returned": _ANSWERS}) | outcomes(), label="junk")
        assume(as_lists(junk) != as_lists(cases[index]))
        cases[index] = junk
    elif how == "cut short":
        cases = cases[:data.draw(st.integers(0, len(cases) - 1), label="kept")]
    else:
        cases = data.draw(st.lists(outcomes(), max_size=3) | outcomes(), label="all")
    assert judged_outside(check16, part, cases, reference16[part], JUNK_SEED) == "failed"
