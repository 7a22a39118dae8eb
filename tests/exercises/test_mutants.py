"""The exercise checks against mutants of the reference solutions (tests/mutants.py).

Every mutant the checks let through is listed in tests/mutants_survivors.toml with why
(an equivalent mutant, or a gap the checks cannot close, and why); the slow test grades a
seeded sample of every exercise's mutants and fails on a survivor that is not listed, and
on a failure message that prints a line of the solution.
"""
from __future__ import annotations

import os
import random

import pytest

import mutants
from mutants import OPERATORS


def test_every_exercise_has_mutants_and_every_operator_makes_some():
    made = {n: mutants.mutants(n) for n in mutants.numbers()}
    assert all(made.values()), {n: len(m) for n, m in made.items()}
    every = [m for ms in made.values() for m in ms]
    idents = [m.ident for m in every]
    assert len(idents) == len(set(idents)), "two mutants share an id"
    assert {m.operator for m in every} == set(OPERATORS)


def test_every_listed_survivor_is_a_mutant_of_today_with_a_reason():
    # a survivor's id hashes its mutated function: an entry whose solution changed is stale
    idents = {m.ident for n in mutants.numbers() for m in mutants.mutants(n)}
    for ident, (kind, why) in mutants.survivors_explained().items():
        assert ident in idents, f"{ident} is no longer a mutant: remove or renew its entry"
        assert kind in ("equivalent", "gap") and len(why.split()) >= 5, ident


SAMPLE = '''
import ignite.distributed as idist
import torch.distributed as dist

def given():
    """Given: not the learner's."""
    return 1 + 1

def step(x, peer):
    """Doc."""
    with ctx():
        y = x * 2
        z = y + 1
    request = dist.isend(z, dst=peer)
    total = idist.all_reduce(float(y), op="MAX")
    if peer == 0:
        request.wait()
    return f(total, idist.device())
'''


def mutated(tmp_path, monkeypatch, operator) -> list:
    folder = tmp_path / "solutions"
    folder.mkdir(exist_ok=True)
    (folder / "99_sample.py").write_text(SAMPLE)
    monkeypatch.setattr(mutants, "SOLUTIONS", folder)
    mutants.mutants.cache_clear()
    return [m for m in mutants.mutants("99") if m.operator == operator]


@pytest.mark.parametrize("operator,expected", [
    ("binop", ["y = x / 2", "z = y - 1"]),
    ("reduce_op", ["op='SUM'", "op='AVG'"]),
    ("drop_kwarg", ["dist.isend(z)", "idist.all_reduce(float(y))"]),
    ("index_base", ["x * 3", "x * 1", "y + 2", "y + 0", "peer == 1", "peer == -1"]),
    ("out_of_with", ["with ctx():\n        z = y + 1\n    y = x * 2",
                     "with ctx():\n        y = x * 2\n    z = y + 1"]),
    ("blocking_p2p", ["request = dist.send(z, dst=peer)"]),
    ("device_cpu", ["__import__('torch').device('cpu')"]),
    ("swap_args", ["f(idist.device(), total)"]),
    ("negate", ["peer != 0"]),
    ("delete", ["request.wait()"]),  # (one of the deletions: the wait's line becomes pass)
])
def test_each_operator_makes_the_mutation_it_names(tmp_path, monkeypatch, operator, expected):
    made = mutated(tmp_path, monkeypatch, operator)
    assert all("return 1 + 1" in m.source for m in made), "a given function was mutated"
    if operator == "delete":
        assert len(made) == 8 and any("request.wait()" not in m.source for m in made)
        return
    assert len(made) == len(expected), [m.what for m in made]
    for text in expected:
        assert any(text in m.source for m in made), (text, [m.what for m in made])
    if operator == "blocking_p2p":
        assert "None if request is None else request.wait()" in made[0].source


def test_a_message_that_prints_a_solution_line_is_caught():
    number = "01"
    line = next(iter(sorted(mutants.solution_lines(number), key=len)))
    assert mutants.leaked_lines(number, f"try this:  {line}") == [line]
    assert mutants.leaked_lines(number, "divide by the world size") == []
    # quoting the learner's own line back (a traceback) gives nothing away
    assert mutants.leaked_lines(number, f"line 3: {line}", answer=mutants.identity_source(number)) == []


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_drawn_sample_of_mutants_is_killed_or_explained(tmp_path):
    seed = int(os.environ.get("DISTKIT_MUTANT_SEED", random.randrange(10**6)))
    per_exercise = int(os.environ.get("DISTKIT_MUTANTS_PER_EXERCISE", "2"))
    print(f"mutant sample: DISTKIT_MUTANT_SEED={seed} DISTKIT_MUTANTS_PER_EXERCISE={per_exercise}")
    drawn = mutants.draw(per_exercise, seed)
    graded = mutants.grade(drawn, tmp_path)
    broken = [n for n in mutants.numbers() if mutants.killed(graded[f"{n}-identity"])]
    assert not broken, f"the unparsed solutions of {broken} fail their checks: the kills would mean nothing"
    explained = mutants.survivors_explained()
    unexplained = [f"{m.ident}  line {m.line}: {m.what}" for m in drawn
                   if not mutants.killed(graded[m.ident]) and m.ident not in explained]
    assert not unexplained, f"seed {seed}: mutants that pass every check:\n" + "\n".join(unexplained)
    leaks = {m.ident: mutants.leaked_lines(m.number, message, m.source) for m in drawn
             for _, outcome, message in graded[m.ident] if outcome == "failed"}
    leaks = {k: v for k, v in leaks.items() if v}
    assert not leaks, f"seed {seed}: messages that print a line of the solution: {leaks}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_mutant_of_13_is_killed_or_explained(tmp_path):
    # Exercise 13 has the most mutants (97), more than a drawn sample reaches: all are graded,
    # in one process that runs the check on each in turn (grade_in_process: about 2 s a
    # mutant on the loaded 2-core VM, where a pytest subprocess each took about 70 s)
    drawn = list(mutants.mutants("13"))
    graded = mutants.grade_in_process(drawn, tmp_path)
    assert not mutants.killed(graded["13-identity"]), graded["13-identity"]
    explained = mutants.survivors_explained()
    unexplained = [f"{m.ident}  line {m.line}: {m.what}" for m in drawn
                   if not mutants.killed(graded[m.ident]) and m.ident not in explained]
    assert not unexplained, "mutants of 13 that pass every check:\n" + "\n".join(unexplained)
    leaks = {m.ident: mutants.leaked_lines("13", message, m.source) for m in drawn
             for _, outcome, message in graded[m.ident] if outcome == "failed"}
    assert not {k: v for k, v in leaks.items() if v}, leaks
