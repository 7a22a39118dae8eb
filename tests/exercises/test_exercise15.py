"""Exercise 15 (reading a merged trace) checked both ways, as test_exercises.py checks
the others: the untouched stub fails for the right reason, the solution passes (the
trace built by hand and the real 3-process run with a planted straggler), and each
plausible wrong answer of ``wrong_answers_trace.WRONG_ANSWERS_15`` is rejected with the
sentence the learner reads (graded on the hand-built traces whose numbers are known, in
this process: the check's first test starts no process)."""
from __future__ import annotations

import copy
import re

import pytest

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support import as_lists, judged_outside, kit_check, outcomes, plain_data

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


# --- judged outside the sandbox: what the grader's judge accepts -----------------------------

@pytest.fixture(scope="module")
def right15(check15):
    """Right data of both parts: the reference's answers on the known traces, and on a trace
    of 3 ranks built to look like the check's real run (the judge cannot tell it from one: a
    limit of judging outside, said in the check)."""
    harness = check15.harness
    known = check15.collect(check15.KNOWN, (harness.REFERENCE,), 1)[harness.REFERENCE]
    trace = check15.slimmed(check15.built_trace(ranks=3, slow=check15.SLOW, steps_ms=(100,) * check15.STEPS["active"]))
    ref = harness.load_reference("15")
    real = {"trace": trace, **check15.answers(ref, trace, list(check15._facts(trace)[0]))}
    return {check15.KNOWN: known, check15.REAL: real}


def test_right_data_passes_outside(check15, right15):
    from distkit.grade import outside

    data = outside.to_bytes({"parts": right15, "failure": None})
    reference = outside.to_bytes({"parts": {check15.KNOWN: None, check15.REAL: None}, "failure": None})
    assert outside.verdict(check15, data, reference, 1) == ("passed", "all 2 parts passed, judged outside the sandbox")


@settings(max_examples=150, deadline=None, print_blob=True)
@given(data=st.data())
def test_no_drawn_answer_earns_a_pass(check15, right15, data):
    """Right data with ONE answer (or the real run's trace) replaced by drawn plain data: never passed."""
    part = data.draw(st.sampled_from(check15.PARTS), label="part")
    got = copy.deepcopy(right15[part])
    case = got[data.draw(st.integers(0, len(got) - 1), label="trace")] if part == check15.KNOWN else got
    key = data.draw(st.sampled_from(["covered", "slow", "fraction"] + (["trace"] * (part == check15.REAL))),
                    label="key")
    junk = data.draw(plain_data() if key == "trace" else st.fixed_dictionaries({"returned": st.floats() | st.integers(
        -1, 10**6)}) | outcomes(), label="junk")
    if key == "covered":
        index = data.draw(st.integers(0, len(case["covered"]) - 1), label="rank")
        assume(as_lists(junk) != as_lists(case["covered"][index]))
        case["covered"][index] = junk
    else:
        assume(as_lists(junk) != as_lists(case[key]))
        case[key] = junk
    assert judged_outside(check15, part, got, None, 1) == "failed"
