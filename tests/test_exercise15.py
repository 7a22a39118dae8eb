"""Exercise 15 (reading a merged trace) checked both ways, as test_exercises.py checks
the others: the untouched stub fails for the right reason, the solution passes (the
trace built by hand and the real 3-process run with a planted straggler), and each
plausible wrong answer of ``wrong_answers_trace.WRONG_ANSWERS_15`` is rejected with the
sentence the learner reads (graded on the trace whose numbers are known: one quick
pytest subprocess per wrong answer, no processes started)."""
from __future__ import annotations

import re

import pytest

from test_exercises import SOLUTIONS, by_exercise, run_checks, wrong_source
from wrong_answers_trace import WRONG_ANSWERS_15


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stub_fails_and_solution_passes(tmp_path):
    stub = by_exercise(run_checks(tmp_path, "stubs", "-m", "ex15"))["15"]
    assert len(stub) == 2
    for test_id, outcome, message in stub:
        assert outcome == "failed" and "exercise 15 is not solved yet" in message, (test_id, message)
    solved = by_exercise(run_checks(tmp_path, "solutions", "-m", "ex15"))["15"]
    assert [outcome for _, outcome, _ in solved] == ["passed", "passed"], solved


def test_there_are_at_least_three_wrong_answers_and_each_applies():
    assert len(WRONG_ANSWERS_15) >= 3
    for number, name, change, _ in WRONG_ANSWERS_15:
        compile(wrong_source(number, name, change), f"{number}: {name}", "exec")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,change,expected", [(n, c, e) for _, n, c, e in WRONG_ANSWERS_15],
                         ids=[n for _, n, _, _ in WRONG_ANSWERS_15])
def test_wrong_answer_is_rejected_with_the_learners_message(tmp_path, name, change, expected):
    folder = tmp_path / "wrong"
    folder.mkdir()
    filename = next(SOLUTIONS.glob("15_*.py")).name
    (folder / filename).write_text(wrong_source("15", name, change))
    tests = by_exercise(run_checks(tmp_path, str(folder), "-m", "ex15", "-k", "numbers_are_known"))["15"]
    failures = [message for _, outcome, message in tests if outcome == "failed"]
    assert failures, f"the wrong answer {name!r} passed"
    assert any(re.search(expected, m, flags=re.S) for m in failures), \
        f"{name!r}: expected /{expected}/, the learner read:\n" + "\n---\n".join(failures)
    assert not any("not solved yet" in m for m in failures)
