"""``distkit grade --dir`` on a course's own check without halves, which runs inside the
sandbox beside its reference (docs/grading.md, "A check of your own without halves"):
the right answer passes with the report saying where it was checked; a stub, a forged
verdict, a check patched while it runs, an answer borrowed from the reference or from the
check's memory, and an exit with status 0 each earn nothing, with the reason said."""
from __future__ import annotations

import json
import shutil

import pytest

from support import REPO_ROOT
from test_grade import FORGE_THEN_EXIT, PATCH_THE_CHECK, _grade, _grades, ensure_bwrap

KIT = REPO_ROOT / "exercises"
NAME = "01_mean.py"

STUB = '''
def mean_of(values):
    """The mean of a non-empty list of numbers."""
    raise NotImplementedError("TODO: the mean of values")
'''

SOLUTION = '''
def mean_of(values):
    """The mean of a non-empty list of numbers."""
    return sum(values) / len(values)
'''

# Written the way a course writes a check: the learner's function beside the reference's,
# on inputs drawn from the check's seed, in one process.
CHECK = '''
import random

import pytest

import harness

pytestmark = pytest.mark.ex01


def _compare(lists):
    learner, reference = harness.load("01"), harness.load_reference("01")
    for values in lists:
        want = reference.mean_of(values)
        got = harness.call_answer("mean_of", learner.mean_of, values)
        if got != pytest.approx(want):
            raise harness.ExerciseFailure(f"mean_of({values}) returned {got}; the mean is {want}")


def test_one_value():
    _compare([[3.0], [-1.5]])


def test_drawn_lists():
    rng = random.Random(harness.check_seed())
    _compare([[rng.uniform(-9, 9) for _ in range(rng.randint(2, 9))] for _ in range(20)])
'''

LEARNERS = {
    "right": SOLUTION,
    "stub": STUB,
    "forger": FORGE_THEN_EXIT,
    "patcher": PATCH_THE_CHECK + SOLUTION.replace("sum(values) / len(values)", "0.0"),
    "borrows the reference": '''
import harness

def mean_of(values):
    return harness.load_reference("01").mean_of(values)
''',
    "reads the check's memory": '''
import sys

def mean_of(values):
    return sys._getframe(2).f_locals["want"]
''',
    "exits at import": "import os\nos._exit(0)\n",
}


def _course_kit(folder):
    """A course's exercises folder: its stub, its solution, its check, the kit's harness."""
    (folder / "checks").mkdir(parents=True)
    (folder / "solutions").mkdir()
    for shared in ("checks/harness.py", "checks/conftest.py"):
        shutil.copyfile(KIT / shared, folder / shared)
    (folder / "pytest.ini").write_text("[pytest]\ntestpaths = checks\nmarkers =\n    ex01: the mean\n")
    (folder / NAME).write_text(STUB)
    (folder / "solutions" / NAME).write_text(SOLUTION)
    (folder / "checks" / "test_01_mean.py").write_text(CHECK)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_course_check_without_halves_is_guarded_inside_the_sandbox(tmp_path):
    ensure_bwrap()
    kit = _course_kit(tmp_path / "course")
    for learner, source in LEARNERS.items():
        (tmp_path / "subs" / learner).mkdir(parents=True)
        (tmp_path / "subs" / learner / NAME).write_text(source)
    report = tmp_path / "report"
    proc = _grade(tmp_path / "subs", "--out", report, "--dir", kit, "--timeout", 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    totals = {learner: int(row["total"]) for learner, row in _grades(report).items()}
    assert totals == {learner: int(learner == "right") for learner in LEARNERS}, totals
    said = {learner: json.loads((report / learner / "results.json").read_text())["tests"][0]["output"]
            for learner in LEARNERS}
    assert "all 2 checks passed" in said["right"], said["right"]
    assert "checked inside the sandbox" in (report / "right" / "report.html").read_text()
    assert "exercise 01 is not solved yet: mean_of() in 01_mean.py:4" in said["stub"], said["stub"]
    assert "imitating the grader's verdict" in said["forger"], said["forger"]
    assert "the file changed the check while it ran" in said["patcher"], said["patcher"]
    assert "called the reference's mean_of()" in said["borrows the reference"], said
    assert "looked into the check's memory" in said["reads the check's memory"], said
    assert "the check stopped before it finished" in said["exits at import"], said["exits at import"]
