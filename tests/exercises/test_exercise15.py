"""Exercise 15 (reading a merged trace) checked both ways, as test_exercises.py checks
the others: the untouched stub fails for the right reason, the solution passes (the
trace built by hand and the real 3-process run with a planted straggler), and each
plausible wrong answer of ``wrong_answers_trace.WRONG_ANSWERS_15`` is rejected with the
sentence the learner reads (graded on the hand-built traces whose numbers are known, in
this process: the check's first test starts no process)."""
from __future__ import annotations

import re

import pytest

from support import kit_check

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


@pytest.fixture(scope="module")
def check15():
    """The check module of exercise 15, imported here: its first test reads hand-built traces
    only (no process starts), so every wrong answer is graded in this process, in
    milliseconds, instead of a pytest subprocess each (10 to 20 s apiece on a loaded
    2-core machine, 2026-11-26)."""
    return kit_check("15")


@pytest.mark.parametrize("name,change,expected", [(n, c, e) for _, n, c, e in WRONG_ANSWERS_15],
                         ids=[n for _, n, _, _ in WRONG_ANSWERS_15])
def test_wrong_answer_is_rejected_with_the_learners_message(tmp_path, monkeypatch, check15, name, change,
                                                            expected):
    folder = tmp_path / "wrong"
    folder.mkdir()
    filename = next(SOLUTIONS.glob("15_*.py")).name
    (folder / filename).write_text(wrong_source("15", name, change))
    monkeypatch.setenv("DISTKIT_EXERCISES", str(folder))
    with pytest.raises(check15.harness.ExerciseFailure) as failure:
        check15.test_a_trace_whose_numbers_are_known()
    message = str(failure.value)
    assert re.search(expected, message, flags=re.S), f"{name!r}: expected /{expected}/, the learner read:\n{message}"
    assert not isinstance(failure.value, check15.harness.NotSolved)
