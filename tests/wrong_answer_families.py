"""The families of wrong answers that issue 35 names, and which of them each exercise
must answer: at least ``MINIMUM`` wrong answers of a family for every exercise it applies
to, each rejected with its message asserted (tests/exercises/test_exercises.py grades them).

Any ``tests/wrong_answers_*.py`` module may declare, for the exercises it owns:

- ``FAMILY = {(exercise, wrong answer's name): family}``: the family of each wrong answer
  of those exercises (wherever the answer itself is listed), one of ``TAGS``;
- ``APPLIES = {exercise: (family, ...)}``: the families that apply to the exercise;
- ``NOT_APPLICABLE = {(exercise, family): why}``: the others, each with its reason;
- ``GRADED_APART = [...]``: wrong answers that a test file of their own grades (not
  test_exercises.py's rounds of pytest subprocesses).

Every (exercise, family) pair is decided exactly once, in one module.
"""
from __future__ import annotations

import importlib
from pathlib import Path

FAMILIES = {
    "layout": "right in some layouts only: 1 process with no process group, 3 processes, "
              "2 nodes x 2 processes, a third pipeline stage, another micro-batch count",
    "inputs": "right on benign inputs only: values bfloat16 holds exactly, attention scores of "
              "order 1, sizes that divide by the world size, the task's own example settings",
    "structure": "the right numbers computed the wrong way, where the lesson is the structure "
                 "(overlap, what is held in memory, which operations run)",
    "device": "code written for one machine: a device named, a tensor handed to a collective "
              "that is not on idist.device()",
    "robust": "an answer the check must survive and describe: it returns a list, None, a tensor "
              "of the wrong shape or type, raises, or hangs; the message says what it did and "
              "never names a mistake it did not make",
}
MINIMUM = 6
# a tag for the rest: a mistake of understanding the task itself (the sum for the mean, the
# wrong formula), which comparing with the reference catches; no minimum
TAGS = {**FAMILIES, "understanding": "a mistake of understanding the task itself"}
HERE = Path(__file__).resolve().parent


def modules():
    return [importlib.import_module(p.stem) for p in sorted(HERE.glob("wrong_answers_*.py"))]


def declared():
    """``(family of each answer, families that apply, families that do not, with why)``,
    merged over every module; a pair declared twice is an error."""
    family, applies, not_applicable = {}, {}, {}
    for module in modules():
        for key, value in getattr(module, "FAMILY", {}).items():
            assert key not in family, f"{key} is tagged twice ({module.__name__})"
            assert value in TAGS, f"{key}: unknown family {value!r}"
            family[key] = value
        for number, families in getattr(module, "APPLIES", {}).items():
            for name in families:
                assert name in FAMILIES, f"{number}: unknown family {name!r}"
                assert (number, name) not in applies, f"({number}, {name}) decided twice"
                applies[(number, name)] = module.__name__
        for key, why in getattr(module, "NOT_APPLICABLE", {}).items():
            assert key not in applies and key not in not_applicable, f"{key} decided twice"
            assert why.strip(), f"{key}: say why the family does not apply"
            not_applicable[key] = why
    return family, applies, not_applicable


def shortfalls(answers, numbers):
    """What is missing for exercises ``numbers``, given every wrong answer as
    ``(exercise, name, ...)``: one line per problem, [] when all is well."""
    family, applies, not_applicable = declared()
    problems = []
    for number in numbers:
        names = [name for n, name, *_ in answers if n == number]
        untagged = [name for name in names if (number, name) not in family]
        if untagged:
            problems.append(f"{number}: {len(untagged)} wrong answers have no family: {untagged[:3]}")
        for name in FAMILIES:
            if (number, name) not in applies and (number, name) not in not_applicable:
                problems.append(f"{number}: family {name!r} neither applies nor is said not to")
            elif (number, name) in applies:
                count = sum(1 for answer in names if family.get((number, answer)) == name)
                if count < MINIMUM:
                    problems.append(f"{number}: {count} wrong answers of family {name!r}, "
                                    f"at least {MINIMUM} wanted")
    return problems


def all_answers():
    """Every wrong answer: test_exercises.py's list (which gathers the other modules') and
    those a module grades apart (``GRADED_APART``: exercise 15's and 16's, which
    tests/exercises/test_exercise15.py and test_exercise16.py grade in their own process)."""
    import test_exercises

    return test_exercises.WRONG_ANSWERS + [a for m in modules() for a in getattr(m, "GRADED_APART", [])]


def table(answers, numbers) -> str:
    """A markdown table: per exercise, how many wrong answers of each tag; '-' where the
    family does not apply."""
    family, applies, _ = declared()
    lines = ["| exercise | " + " | ".join(TAGS) + " | all |", "|" + " --- |" * (len(TAGS) + 2)]
    for number in numbers:
        names = [name for n, name, *_ in answers if n == number]
        cells = []
        for tag in TAGS:
            count = sum(1 for name in names if family.get((number, name)) == tag)
            cells.append(str(count) if tag not in FAMILIES or (number, tag) in applies else "-")
        lines.append(f"| {number} | " + " | ".join(cells) + f" | {len(names)} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/wrong_answer_families.py [08 09]: what is missing, and the counts
    import sys

    sys.path[:0] = [str(HERE), str(HERE / "exercises")]  # test_exercises.py lives in tests/exercises
    wanted = sys.argv[1:] or sorted({n for n, *_ in all_answers()})
    print(table(all_answers(), wanted))
    print("\n".join(shortfalls(all_answers(), wanted)) or "nothing missing")
