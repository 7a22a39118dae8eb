"""Every check the grader judges outside the sandbox, found in exercises/checks rather than
listed (a check that defines ``PARTS``, ``collect`` and ``judge``), held to the grader's
promise, in this process with ``distkit.grade.outside``'s own functions:

- the solution, handed in as a learner's file, passes (a judge that fails it would fail
  every learner);
- a wrong answer, drawn from the exercise's wrong answers (tests/exercises), collected
  alone, as the sandbox collects it, and judged against the reference's data collected
  apart, fails with the message ``distkit check`` gives it;
- plain data drawn by Hypothesis in place of the learner's (what a file that writes on
  the grader's pipe itself could send; it has no reference to copy) never earns a pass.

Each case prints its seed; ``DISTKIT_OUTSIDE_SEED=N`` draws the same wrong answers and data.
"""
from __future__ import annotations

import ast
import os
import random
import re
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from support import kit_check, plain_data
from test_exercises import SOLUTIONS, WRONG_ANSWERS, wrong_source
from wrong_answers_hang import WRONG_ANSWERS_16
from wrong_answers_trace import WRONG_ANSWERS_15

SEED = int(os.environ.get("DISTKIT_OUTSIDE_SEED") or random.randrange(2 ** 32))
CHECKS = SOLUTIONS.parent / "checks"
NUMBERS = sorted(p.name[:2] for p in SOLUTIONS.glob("[0-9][0-9]_*.py"))


def _top_level_names(path) -> set:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)} | \
        {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
         if isinstance(target, ast.Name)}


# read, not imported: every test process collects this file
SPLIT = [n for n in NUMBERS
         if {"PARTS", "collect", "judge"} <= _top_level_names(next(CHECKS.glob(f"test_{n}_*.py")))]



def replay(number: str) -> str:
    return (f"seed {SEED}: DISTKIT_OUTSIDE_SEED={SEED} python -m pytest tests/grade/test_outside_checks.py "
            f"-k {number} -p no:cacheprovider")


# 15's and 16's are graded in this process by their own tests, the others by pytest exercises
EVERY_WRONG_ANSWER = WRONG_ANSWERS + WRONG_ANSWERS_15 + WRONG_ANSWERS_16
_REFERENCES: dict = {}


def reference_bytes(number: str) -> bytes:
    """The reference's data on the check seed ``SEED``, collected once per test process."""
    from distkit.grade import outside

    if number not in _REFERENCES:
        check = kit_check(number)
        data = outside.collect_all(check, check.harness.REFERENCE, SEED % 10 ** 6)
        assert data["failure"] is None, f"the reference of {number} fails its own check: {data['failure']}"
        _REFERENCES[number] = outside.to_bytes(data)
    return _REFERENCES[number]


def test_the_split_checks_are_found():
    assert {"03", "06"} <= set(SPLIT), SPLIT


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", SPLIT)
def test_a_wrong_answer_judged_outside_fails_as_distkit_check_says(number, tmp_path, monkeypatch):
    check = kit_check(number)
    assert learners_verdict(check, number, "solutions") == \
        ("passed", f"all {len(check.PARTS)} parts passed, judged outside the sandbox")
    answers = [(name, change, expected) for n, name, change, expected in EVERY_WRONG_ANSWER if n == number]
    name, change, expected = random.Random(SEED).choice(answers)
    print(f"{number}: the wrong answer {name!r}; {replay(number)}", flush=True)
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / next(SOLUTIONS.glob(f"{number}_*.py")).name).write_text(wrong_source(number, name, change))
    status, message = learners_verdict(check, number, str(folder))
    assert status == "failed" and re.search(expected, message, flags=re.S), (name, status, message)


def learners_verdict(check, number: str, folder: str) -> tuple:
    """The grader's verdict on the file of ``folder`` (``DISTKIT_EXERCISES``), its data
    collected as the sandbox collects it, judged against the reference's collected apart."""
    from distkit.grade import outside

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTKIT_EXERCISES", folder)
        sys.modules.pop(f"distkit_exercise_{number}", None)
        learner = outside.to_bytes(outside.collect_all(check, check.harness.LEARNER, SEED % 10 ** 6))
    sys.modules.pop(f"distkit_exercise_{number}", None)
    return outside.verdict(check, learner, reference_bytes(number), SEED % 10 ** 6)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", SPLIT)
def test_no_drawn_data_earns_a_pass_from_a_kit_check(number):
    from distkit.grade import outside

    check, check_seed = kit_check(number), SEED % 10 ** 6
    reference = reference_bytes(number)
    print(f"{number}: {replay(number)}", flush=True)
    data = plain_data() | st.lists(plain_data(), min_size=1, max_size=4)

    @seed(SEED)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(parts=st.fixed_dictionaries({part: data for part in check.PARTS}),
           failure=st.none() | st.text(max_size=20))
    def judged(parts, failure):
        status, message = outside.verdict(check, outside.to_bytes({"parts": parts, "failure": failure}),
                                          reference, check_seed)
        assert status in ("failed", "no verdict"), (status, message, parts)

    judged()
