"""Exercise 17's check against EVERY mutant of its reference (tests/mutants.py), in this
process: the check starts no process (its functions are pure), so each mutant costs its
four tests' calls, about a second, instead of a ``pytest exercises`` subprocess each
(about 35 s on the loaded 2-core VM). Every mutant must fail a test, and no message may
print a line of the solution. The hand-written wrong answers (tests/wrong_answers_ex17.py)
are graded with the others by test_exercises.py."""
from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from support import kit_check

import mutants
from test_exercises import SOLUTIONS


@pytest.fixture(scope="module")
def check17():
    return kit_check("17")


def failures(check, folder) -> list:
    """The messages of the check's tests that fail on the exercise file in ``folder``."""
    tests = [getattr(check, name) for name in dir(check) if name.startswith("test_")]
    found = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTKIT_EXERCISES", str(folder))
        for test in tests:
            try:
                test()
            except Exception as error:  # noqa: BLE001 - any failure kills the mutant, as under pytest
                frame = traceback.extract_tb(error.__traceback__)[-1]
                found.append(f"{test.__name__}: {type(error).__name__}: {error} "
                             f"({Path(frame.filename).name}:{frame.lineno})")
    return found


def test_the_solution_unparsed_passes_and_every_mutant_fails_without_printing_the_answer(tmp_path, check17):
    filename = next(SOLUTIONS.glob("17_*.py")).name
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / filename).write_text(mutants.identity_source("17"))
    assert failures(check17, identity) == [], "the unparsed solution fails: the kills would mean nothing"
    made = mutants.mutants("17")
    assert len(made) >= 20, [m.what for m in made]
    survivors, leaks = [], {}
    for mutant in made:
        folder = tmp_path / mutant.ident
        folder.mkdir()
        (folder / filename).write_text(mutant.source)
        messages = failures(check17, folder)
        if not messages:
            survivors.append(f"{mutant.ident}  line {mutant.line}: {mutant.what}")
        leaked = sorted({line for m in messages for line in mutants.leaked_lines("17", m, mutant.source)})
        if leaked:
            leaks[mutant.ident] = leaked
    print(f"exercise 17: {len(made)} mutants graded in this process")
    assert not survivors, "mutants that pass every check:\n" + "\n".join(survivors)
    assert not leaks, f"messages that print a line of the solution: {leaks}"
