"""Every check the grader judges outside the sandbox, found in exercises/checks rather than
listed (a check that defines ``PARTS``, ``collect`` and ``judge``), held to the grader's
promise, with ``distkit.grade.outside``'s own collector (a process of its own, as in the
sandbox, without the sandbox) and judge:

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
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from support import kit_check, plain_data, subprocess_env
from test_exercises import SOLUTIONS, WRONG_ANSWERS, wrong_source
from wrong_answers_hang import WRONG_ANSWERS_16
from wrong_answers_trace import WRONG_ANSWERS_15

SEED = int(os.environ.get("DISTKIT_OUTSIDE_SEED") or random.randrange(2 ** 32))
CHECK_SEED = SEED % 10 ** 6  # the seed the checks draw their inputs from
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


def reference_bytes(number: str, tmp_path) -> bytes:
    """The reference's data on the check seed, collected by the grader's own call (a process
    of its own), once per test process."""
    from distkit.grade import outside

    if number not in _REFERENCES:
        _REFERENCES[number] = outside.reference_data(CHECKS, number, CHECK_SEED, 600, tmp_path / "reference.pt")
    return _REFERENCES[number]


def learners_data(number: str, folder: str, tmp_path) -> bytes:
    """The data of the file in ``folder``, collected as the sandbox's collector does (the
    same command, here without the sandbox)."""
    out = tmp_path / f"learner-{len(list(tmp_path.glob('learner-*')))}.pt"
    proc = subprocess.run([sys.executable, "-m", "distkit.grade.outside", str(CHECKS), number, str(CHECK_SEED),
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env=subprocess_env(DISTKIT_EXERCISES=folder, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    return out.read_bytes()


def every_message(check, learner: bytes, reference: bytes) -> list:
    """The messages of every part the learner's data fails (the grader shows the first;
    ``pytest exercises`` runs every test, so a wrong answer's expected message may be any)."""
    from distkit.grade import outside

    data, expected = outside.from_bytes(learner), outside.from_bytes(reference)["parts"]
    messages = []
    for part in check.PARTS:
        if part not in data["parts"]:  # the collector stopped at this part: its failure
            return messages + ([data["failure"]] if data["failure"] else [])
        try:
            check.judge(part, data["parts"][part], expected[part], CHECK_SEED)
        except check.harness.ExerciseFailure as error:
            messages.append(str(error))
    return messages


def test_the_split_checks_are_found():
    assert {"03", "06"} <= set(SPLIT), SPLIT


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", SPLIT)
def test_a_wrong_answer_judged_outside_fails_as_distkit_check_says(number, tmp_path):
    from distkit.grade import outside

    check = kit_check(number)
    reference = reference_bytes(number, tmp_path)
    assert outside.verdict(check, learners_data(number, "solutions", tmp_path), reference, CHECK_SEED) == \
        ("passed", f"all {len(check.PARTS)} parts passed, judged outside the sandbox")
    answers = [(name, change, expected) for n, name, change, expected in EVERY_WRONG_ANSWER if n == number]
    name, change, expected = random.Random(SEED).choice(answers)
    print(f"{number}: the wrong answer {name!r}; {replay(number)}", flush=True)
    folder = tmp_path / "learner"
    folder.mkdir()
    (folder / next(SOLUTIONS.glob(f"{number}_*.py")).name).write_text(wrong_source(number, name, change))
    learner = learners_data(number, str(folder), tmp_path)
    status, message = outside.verdict(check, learner, reference, CHECK_SEED)
    messages = every_message(check, learner, reference)
    assert status == "failed" and message == messages[0], (name, status, message)
    assert any(re.search(expected, m, flags=re.S) for m in messages), (name, expected, messages)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("number", SPLIT)
def test_no_drawn_data_earns_a_pass_from_a_kit_check(number, tmp_path):
    from distkit.grade import outside

    check = kit_check(number)
    reference = reference_bytes(number, tmp_path)
    print(f"{number}: {replay(number)}", flush=True)
    data = plain_data() | st.lists(plain_data(), min_size=1, max_size=4)

    @seed(SEED)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(parts=st.fixed_dictionaries({part: data for part in check.PARTS}),
           failure=st.none() | st.text(max_size=20))
    def judged(parts, failure):
        status, message = outside.verdict(check, outside.to_bytes({"parts": parts, "failure": failure}),
                                          reference, CHECK_SEED)
        assert status in ("failed", "no verdict"), (status, message, parts)

    judged()
