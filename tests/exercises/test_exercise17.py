"""Exercise 17's check against EVERY mutant of its reference (tests/mutants.py), in this
process: the check starts no process (its functions are pure), so each mutant costs its
four tests' calls, about a second, instead of a ``pytest exercises`` subprocess each
(about 35 s on the loaded 2-core VM). Every mutant must fail a test, and no message may
print a line of the solution. The hand-written wrong answers (tests/wrong_answers_ex17.py)
are graded with the others by test_exercises.py."""
from __future__ import annotations

import random
import traceback
from pathlib import Path

import pytest

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support import as_lists, judged_outside, kit_check, outcomes

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


# --- judged outside the sandbox: what the grader's judge accepts -----------------------------

JUNK_SEED = random.randrange(1, 10**6)


@pytest.fixture(scope="module")
def reference17(check17):
    """The reference's data of every part for JUNK_SEED (the check's cases drawn from it)."""
    print(f"exercise 17's cases: DISTKIT_CHECK_SEED={JUNK_SEED}")
    harness = check17.harness
    return {part: check17.collect(part, (harness.REFERENCE,), JUNK_SEED)[harness.REFERENCE]
            for part in check17.PARTS}


def test_the_references_data_passes_outside(check17, reference17):
    from distkit.grade import outside

    reference = outside.to_bytes({"parts": reference17, "failure": None})
    assert outside.verdict(check17, reference, reference, JUNK_SEED) == \
        ("passed", "all 4 parts passed, judged outside the sandbox")


def _case_of(part):
    if part in ("rank_batches",):
        return st.fixed_dictionaries({"batches": st.lists(outcomes(), max_size=4)}) | outcomes()
    if part == "a resumed run against the run that never stopped":
        return st.fixed_dictionaries({"position": outcomes(), "batch": outcomes(),
                                      "batches": st.lists(outcomes(), max_size=4)}) | outcomes()
    return outcomes()


@settings(max_examples=100, deadline=None, print_blob=True)
@given(data=st.data())
def test_no_drawn_case_earns_a_pass(check17, reference17, data):
    """The reference's data with ONE case (of about 150 per part) replaced by drawn plain data
    in its shape, or cut short, or wholly drawn: never passed; the part named fails."""
    part = data.draw(st.sampled_from(check17.PARTS), label="part")
    cases = list(reference17[part])
    how = data.draw(st.sampled_from(["one case", "cut short", "all drawn"]), label="how")
    if how == "one case":
        index = data.draw(st.integers(0, len(cases) - 1), label="case")
        junk = data.draw(_case_of(part), label="junk")
        wanted = cases[index]
        assume(as_lists(junk) != as_lists({k: v for k, v in wanted.items() if k != "sampler"}))
        if isinstance(junk, dict) and isinstance(wanted, dict) and "raised" in junk and "raised" in wanted:
            assume("ValueError" not in junk["classes"])  # a refusal, any words: the refusal asked for
        cases[index] = junk
    elif how == "cut short":
        cases = cases[:data.draw(st.integers(0, len(cases) - 1), label="kept")]
    else:
        cases = data.draw(st.lists(_case_of(part), max_size=3) | _case_of(part), label="all")
    assert judged_outside(check17, part, cases, reference17[part], JUNK_SEED) == "failed"
