"""Hints teach: each hint (exercises/hints.md, what ``distkit check NN --hint`` prints)
points at the idea and the API to read, never at the line to type. A hint fails when it
holds its solution's key line (a code line of exercises/solutions/NN_*.py that the stub
does not have, longer than 20 characters, compared without spaces or comments) or one of
the solution's own calls with the same arguments (``PiecewiseLinear(optimizer, "lr",
...)``). Exercise 14's answer is printed neither by the kit's GPT nor by its check."""
from __future__ import annotations

import ast
import re

import pytest

from support import REPO_ROOT
from distkit.commands.check import hint_for

EXERCISES = REPO_ROOT / "exercises"
NUMBERS = sorted(p.name[:2] for p in EXERCISES.glob("[0-9][0-9]_*.py"))
KEY_LINE_CHARS = 20
# a call shorter than this is a name, not an answer (``get_world_size()``)
KEY_CALL_CHARS = 16


def squeezed(text: str) -> str:
    """Code or prose compared as characters: no spaces, backticks or quotes' kind."""
    return re.sub(r"[\s`]", "", text).replace("'", '"')


def code_lines(source: str) -> set[str]:
    lines = set()
    for line in source.splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith(("#", '"""', "'''")):
            lines.add(squeezed(line))
    return lines


def calls(source: str) -> set[str]:
    """Every call with arguments in ``source``, as written (squeezed). A call without
    arguments names an API (``idist.get_world_size()``): a hint may name it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (node.args or node.keywords):
            found.add(squeezed(ast.unparse(node)))
    return found


def solution_and_stub(number: str) -> tuple[str, str]:
    (stub,) = EXERCISES.glob(f"{number}_*.py")
    return (EXERCISES / "solutions" / stub.name).read_text(), stub.read_text()


def key_lines(number: str) -> tuple[set[str], set[str]]:
    """(code lines, calls) of the solution that its stub does not have: the answer."""
    solution, stub = solution_and_stub(number)
    lines = {ln for ln in code_lines(solution) - code_lines(stub) if len(ln) > KEY_LINE_CHARS}
    answer_calls = {c for c in calls(solution) - calls(stub) if len(c) >= KEY_CALL_CHARS}
    return lines, answer_calls


def given_away(hint: str, number: str) -> list[str]:
    lines, answer_calls = key_lines(number)
    text = squeezed(hint)
    return sorted(ln for ln in lines | answer_calls if ln in text)


@pytest.mark.parametrize("number", NUMBERS)
def test_the_hint_does_not_hold_its_solutions_key_line(number):
    hint = hint_for(EXERCISES, number)
    lines, answer_calls = key_lines(number)
    print(f"exercise {number}: {len(lines)} key lines, {len(answer_calls)} calls compared with its hint")
    assert lines or answer_calls, f"exercise {number}: nothing to compare (is the solution its stub?)"
    assert not given_away(hint, number), (number, given_away(hint, number))


def test_the_comparison_catches_a_hint_that_gives_the_line_away():
    """The check can fail: a hint that quotes its solution's line (spaced differently),
    or one of its calls, is caught; a hint that names the API is not."""
    solution, _ = solution_and_stub("06")
    quoted = next(ln for ln in solution.splitlines() if "PiecewiseLinear(" in ln)
    assert given_away(f"Try `{quoted.strip()}`.", "06")
    assert given_away("peak = base_lr*idist.get_world_size()", "06")
    assert not given_away("Read `ignite.handlers.PiecewiseLinear` and `idist.get_world_size`.", "06")
    solution, _ = solution_and_stub("10")
    assert given_away("fully_shard(layer)  then the root", "10") or "fully_shard(layer)" not in solution


def test_exercise_14s_answer_is_not_printed_by_the_kits_gpt():
    """The kit's GPT documents its sizes, not the FLOPs formula the exercise asks for."""
    from distkit.builtin import models

    solution, _ = solution_and_stub("14")
    lines, answer_calls = key_lines("14")
    texts = [models.__doc__ or "", models.GPT.__doc__ or ""]
    texts += [getattr(models.GPT, name).__doc__ or "" for name in dir(models.GPT)
              if callable(getattr(models.GPT, name, None)) and not name.startswith("__")]
    doc = squeezed("\n".join(texts))
    assert not [ln for ln in lines | answer_calls if ln in doc]
    for formula in ("6N", "6*N", "12*L*T*d", "12LTd", "12*n_layer", "6*n_params"):
        assert squeezed(formula) not in doc.replace("·", "*"), formula
