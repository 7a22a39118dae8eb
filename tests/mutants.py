"""Mutants of the reference solutions, graded by the exercise checks.

A mutant is a reference solution with ONE small change made on its syntax tree, the kind
of slip a learner makes: an operator swapped, a keyword argument dropped, a constant off by
one, a statement moved out of its ``with`` block, an ``isend`` made blocking, a device
named, two arguments swapped, a comparison negated, a statement deleted. Each mutant is
graded the way tests/exercises/test_exercises.py grades the hand-written wrong answers (a pytest
subprocess over ``exercises/``, one file per exercise and round). A mutant that passes
every check is a *survivor*: either it computes the same thing (an equivalent mutant,
listed with the reason in ``tests/mutants_survivors.toml``) or the checks have a gap.

Only the functions the learner writes are mutated: not the classes and the functions the
stub gives ready-made (docstring "Given:").

    python tests/mutants.py --list [--exercises 01,05]           # what would be graded
    python tests/mutants.py --exercises 05 --out run.json        # grade them all
    python tests/mutants.py --sample 3 --seed 7                   # 3 drawn per exercise
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE.parent / "exercises" / "solutions"
SURVIVORS_FILE = HERE / "mutants_survivors.toml"
_BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
           ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.MatMult: ast.Mult}
_NEGATED = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt,
            ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
            ast.In: ast.NotIn, ast.NotIn: ast.In}
_REDUCE_OPS = ("SUM", "AVG", "MAX")
_REDUCING = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
_BLOCKING = {"isend": "send", "irecv": "recv"}


@dataclass(frozen=True)
class Mutant:
    number: str
    ident: str      # stable while the mutated function is unchanged: names it in the survivors file
    operator: str
    function: str
    line: int
    what: str       # "line 12: a + b  ->  a - b"
    source: str     # the whole mutated file


def _text(node) -> str:
    return ast.unparse(node).replace("\n", " ")[:90]


def _learner_functions(tree: ast.Module) -> list:
    """The top-level functions the learner writes (the stub gives the others)."""
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and not (ast.get_docstring(node) or "").startswith("Given:")]


def _nodes(function: ast.FunctionDef):
    """Every node of ``function`` but its docstring, in a fixed order."""
    body = function.body[1:] if ast.get_docstring(function) else function.body
    for statement in body:
        yield from ast.walk(statement)


def _statement_lists(function: ast.FunctionDef):
    """``(owner, field, list)`` for every list of statements, the function's own first."""
    yield function, "body", function.body
    for node in _nodes(function):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                yield node, field, statements


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _swap_binop(node):
    def apply():
        old = _text(node)
        node.op = _BINOPS[type(node.op)]()
        return f"{old}  ->  {_text(node)}"
    return apply


def _sites(function: ast.FunctionDef, operator: str):
    """Callables, each making one mutation of ``operator`` in ``function`` (in place) and
    returning what it did; the same order on every copy of the tree."""
    nodes = list(_nodes(function))
    if operator == "binop":
        for node in nodes:
            if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOPS:
                yield _swap_binop(node)
    elif operator == "reduce_op":
        for node in nodes:
            if isinstance(node, ast.Call) and _call_name(node) in _REDUCING:
                yield from _reduce_op_sites(node)
    elif operator == "drop_kwarg":
        for node in nodes:
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg is not None:
                        yield _drop_keyword(node, keyword)
    elif operator == "index_base":
        for node in nodes:
            if isinstance(node, ast.Constant) and type(node.value) is int:
                for delta in (1, -1):
                    yield _shift_constant(node, delta)
    elif operator == "out_of_with":
        for owner, field, statements in _statement_lists(function):
            for position, statement in enumerate(statements):
                if isinstance(statement, ast.With):
                    for inner in range(len(statement.body)):
                        yield _move_out_of_with(statements, position, inner)
    elif operator == "blocking_p2p":
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr in _BLOCKING:
                yield _make_blocking(function, node)
    elif operator == "device_cpu":
        for node in nodes:
            if isinstance(node, ast.Call) and _text(node) == "idist.device()":
                yield _name_cpu(node)
    elif operator == "swap_args":
        for node in nodes:
            if isinstance(node, ast.Call):
                for i in range(len(node.args) - 1):
                    if not any(isinstance(a, ast.Starred) for a in node.args[i:i + 2]):
                        yield _swap_arguments(node, i)
    elif operator == "negate":
        for node in nodes:
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _NEGATED:
                yield _negate_compare(node)
            elif isinstance(node, (ast.If, ast.IfExp, ast.While)) and not isinstance(node.test, ast.Compare):
                yield _negate_test(node)
    elif operator == "delete":
        for owner, field, statements in _statement_lists(function):
            start = 1 if owner is function and ast.get_docstring(function) else 0
            for position in range(start, len(statements)):
                yield _delete_statement(statements, position)
    else:
        raise ValueError(operator)


def _reduce_op_sites(call: ast.Call):
    op = next((k for k in call.keywords if k.arg == "op"), None)
    current = None
    if op is not None:
        value = op.value
        current = value.value if isinstance(value, ast.Constant) else getattr(value, "attr", None)
    is_idist = _text(call.func).startswith("idist.")
    for name in _REDUCE_OPS:
        if name == (current or "SUM") or (name == "AVG" and not is_idist and op is None):
            continue
        def apply(name=name):
            old = _text(call)
            new = ast.Constant(name) if is_idist else ast.parse(f"dist.ReduceOp.{name}").body[0].value
            call.keywords = [k for k in call.keywords if k.arg != "op"] + [ast.keyword("op", new)]
            return f"{old}  ->  {_text(call)}"
        yield apply


def _drop_keyword(call, keyword):
    def apply():
        old = _text(call)
        call.keywords.remove(keyword)
        return f"{old}  ->  {_text(call)}"
    return apply


def _shift_constant(node, delta):
    def apply():
        old = node.value
        node.value = old + delta
        return f"the constant {old}  ->  {node.value}"
    return apply


def _move_out_of_with(statements, position, inner):
    def apply():
        block = statements[position]
        moved = block.body.pop(inner)
        if not block.body:
            block.body.append(ast.Pass())
        statements.insert(position + 1, moved)
        return f"{_text(moved)}  moved out of  with {_text(block.items[0])}"
    return apply


def _make_blocking(function, attribute):
    def apply():
        old = attribute.attr
        attribute.attr = _BLOCKING[old]
        # send/recv return None: every .wait() on a request must tolerate it
        for node in _nodes(function):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                    and _call_name(node.value) == "wait" and isinstance(node.value.func, ast.Attribute):
                target = _text(node.value.func.value)
                node.value = ast.parse(f"None if {target} is None else {target}.wait()").body[0].value
        return f"{old}  ->  {attribute.attr} (blocking; its waits skipped)"
    return apply


def _name_cpu(call):
    def apply():
        call.func = ast.parse('__import__("torch").device').body[0].value
        call.args = [ast.Constant("cpu")]
        return 'idist.device()  ->  torch.device("cpu")'
    return apply


def _swap_arguments(call, i):
    def apply():
        old = _text(call)
        call.args[i], call.args[i + 1] = call.args[i + 1], call.args[i]
        return f"{old}  ->  {_text(call)}"
    return apply


def _negate_compare(node):
    def apply():
        old = _text(node)
        node.ops = [_NEGATED[type(node.ops[0])]()]
        return f"{old}  ->  {_text(node)}"
    return apply


def _negate_test(node):
    def apply():
        old = _text(node.test)
        node.test = ast.UnaryOp(ast.Not(), node.test)
        return f"the condition {old}  ->  not ({old})"
    return apply


def _delete_statement(statements, position):
    def apply():
        old = statements[position]
        statements[position] = ast.Pass()
        return f"{_text(old)}  deleted"
    return apply


OPERATORS = ("binop", "reduce_op", "drop_kwarg", "index_base", "out_of_with", "blocking_p2p",
             "device_cpu", "swap_args", "negate", "delete")


def solution_file(number: str) -> Path:
    return next(SOLUTIONS.glob(f"{number}_*.py"))


@functools.cache
def mutants(number: str) -> tuple:
    """Every mutant of exercise ``number``'s solution, without duplicates or mutants that
    do not compile, in a fixed order."""
    tree = ast.parse(solution_file(number).read_text())
    found, seen = [], {ast.unparse(tree)}
    for index, function in enumerate(_learner_functions(tree)):
        for operator in OPERATORS:
            for k in range(len(list(_sites(function, operator)))):
                mutated = copy.deepcopy(tree)
                target = _learner_functions(mutated)[index]
                line = list(_sites(target, operator))[k]
                what = line()
                source = ast.unparse(ast.fix_missing_locations(mutated))
                if source in seen:
                    continue
                seen.add(source)
                try:
                    compile(source, number, "exec")
                except SyntaxError:
                    continue
                digest = hashlib.sha1(ast.unparse(target).encode()).hexdigest()[:8]
                found.append(Mutant(number, f"{number}-{operator}-{function.name}-{digest}",
                                    operator, function.name, _line_of(function, target), what, source))
    return tuple(found)


def _line_of(original, mutated) -> int:
    """The first line of ``original`` whose statement the mutation changed."""
    old = [ast.unparse(s) for s in ast.walk(original) if isinstance(s, ast.stmt)]
    new = [ast.unparse(s) for s in ast.walk(mutated) if isinstance(s, ast.stmt)]
    statements = [s for s in ast.walk(original) if isinstance(s, ast.stmt)]
    changed = [statement.lineno for statement, a, b in zip(statements, old, new) if a != b
               and not isinstance(statement, (ast.FunctionDef, ast.For, ast.If, ast.With, ast.While))]
    return min(changed, default=original.lineno)


def identity_source(number: str) -> str:
    """The solution as the mutants are written (``ast.unparse``: no comments): it must pass,
    or the kills would be the unparsing's, not the mutations'."""
    return ast.unparse(ast.parse(solution_file(number).read_text()))


def numbers() -> list:
    return sorted(p.name[:2] for p in SOLUTIONS.glob("[0-9][0-9]_*.py"))


def survivors_explained() -> dict:
    """``{mutant id: (kind, why)}`` from ``mutants_survivors.toml``: kind ``equivalent``
    (the mutant computes what the solution computes, for the reason given) or ``gap`` (a
    mistake the checks cannot see yet, and why)."""
    import tomllib

    table = tomllib.loads(SURVIVORS_FILE.read_text())
    return {ident: (entry["kind"], entry["why"]) for ident, entry in table.items()}


def draw(sample: int, seed: int, chosen=None) -> list:
    """``sample`` mutants of every exercise (all of them where it has fewer), drawn with
    ``seed``."""
    rng = random.Random(seed)
    drawn = []
    for number in chosen or numbers():
        every = mutants(number)
        drawn += list(every) if sample <= 0 or sample >= len(every) else rng.sample(every, sample)
    return drawn


# --- grading ---------------------------------------------------------------------------------

def grade(drawn: list, folder: Path, *, rounds_at_once: int = 2, identity: bool = True) -> dict:
    """Grade ``drawn`` mutants; returns ``{id: [(test id, outcome, message)]}`` (the id
    ``NN-identity`` for each exercise's unmutated file when ``identity``). The k-th mutant
    of every exercise goes to round k, one pytest subprocess per round; an exercise's checks
    stop at its first failure (a killed mutant needs one), a hang fails after 10 s."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(HERE / "exercises"))  # tests/exercises/test_exercises.py
    from test_exercises import by_exercise, run_checks

    rounds, seen = {}, {}
    entries = [(f"{n}-identity", n, identity_source(n)) for n in sorted({m.number for m in drawn})] \
        if identity else []
    entries += [(m.ident, m.number, m.source) for m in drawn]
    for ident, number, source in entries:
        index = seen.get(number, 0)
        seen[number] = index + 1
        rounds.setdefault(index, []).append((ident, number))
        place = folder / f"mutant-round-{index}"
        place.mkdir(parents=True, exist_ok=True)
        (place / solution_file(number).name).write_text(source)

    def run(index):
        place = folder / f"mutant-round-{index}"
        marker = " or ".join(f"ex{n}" for n in sorted({n for _, n in rounds[index]}))
        results = run_checks(place, str(place), "-m", marker, "-p", "mutants", "-o", "timeout=90",
                             env={"DISTKIT_CHECK_TIMEOUT": "10",
                                  "PYTHONPATH": _pythonpath()})
        return index, by_exercise(results)

    graded = {}
    with ThreadPoolExecutor(max_workers=rounds_at_once) as pool:
        for index, grouped in pool.map(run, sorted(rounds)):
            for ident, number in rounds[index]:
                graded[ident] = grouped.get(number, [])
    return graded


def grade_in_process(drawn: list, folder: Path, *, at_once: int = 2, identity: bool = True) -> dict:
    """Like :func:`grade`, cheaper: one Python process per exercise imports the exercise's
    check module once and runs its check functions on each mutant in turn (the ranks are
    forked from that warm process), instead of a pytest subprocess per mutant that imports
    torch, ignite and the checks again. Only for checks whose functions take no fixture but
    ``tmp_path``; the verdicts have the same form."""
    import json
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    entries = {}
    for number in sorted({m.number for m in drawn}):
        entries[number] = [(f"{number}-identity", identity_source(number))] if identity else []
    for m in drawn:
        entries[m.number].append((m.ident, m.source))

    def run(number):
        place = folder / f"in-process-{number}"
        jobs = []
        for k, (ident, source) in enumerate(entries[number]):
            (place / str(k)).mkdir(parents=True, exist_ok=True)
            (place / str(k) / solution_file(number).name).write_text(source)
            jobs.append([ident, str(place / str(k))])
        (place / "jobs.json").write_text(json.dumps(jobs))
        env = {**os.environ, "DISTKIT_CHECK_TIMEOUT": "10", "PYTHONPATH": _pythonpath(),
               "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, __file__, "--worker", number, str(place)], env=env,
                              capture_output=True, text=True, timeout=60 + 150 * len(jobs))
        out = place / "verdicts.json"
        assert out.exists(), f"the in-process grader of {number} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return json.loads(out.read_text())

    graded = {}
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        for verdicts in pool.map(run, sorted(entries)):
            graded.update({ident: [tuple(t) for t in tests] for ident, tests in verdicts.items()})
    return graded


def _worker(number: str, place: Path) -> None:
    """Grade the mutant folders listed in ``place/jobs.json`` with exercise ``number``'s
    checks, in this process; write ``place/verdicts.json``."""
    import inspect
    import json
    import os
    import signal
    import tempfile
    import traceback
    import warnings

    import torch

    torch.set_num_threads(1)  # as exercises/checks/conftest.py
    checks = HERE.parent / "exercises" / "checks"
    sys.path.insert(0, str(checks))
    import harness
    from distkit.grade.outside import check_module

    path = next(checks.glob(f"test_{number}_*.py"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = check_module(checks, number)  # as the grader imports it
    tests = [f for name, f in vars(module).items() if name.startswith("test_") and callable(f)]
    tests.sort(key=lambda f: f.__code__.co_firstlineno)
    fixtures = {p for f in tests for p in inspect.signature(f).parameters} - {"tmp_path"}
    assert not fixtures, f"exercise {number}'s checks take fixtures {fixtures}: grade it with grade()"

    def hung(*_):
        raise TimeoutError("the check ran past 150 s")

    signal.signal(signal.SIGALRM, hung)
    verdicts = {}
    for ident, folder in json.loads((place / "jobs.json").read_text()):
        os.environ["DISTKIT_EXERCISES"] = folder
        sys.modules.pop(f"distkit_exercise_{number}", None)
        results = []
        for test in tests:
            test_id = f"checks.{path.stem}::{test.__name__}"
            if results and results[-1][1] == "failed":
                results.append((test_id, "skipped", "an earlier check of this exercise already rejected the mutant"))
                continue
            kwargs = {"tmp_path": Path(tempfile.mkdtemp(dir=folder))} \
                if "tmp_path" in inspect.signature(test).parameters else {}
            signal.alarm(150)
            try:
                test(**kwargs)
                results.append((test_id, "passed", ""))
            except harness.ExerciseFailure as failure:
                results.append((test_id, "failed", str(failure)))
            except NotImplementedError as error:
                results.append((test_id, "failed", harness.not_solved_message(error)))
            except Exception:  # noqa: BLE001 - pytest would report the mutant's error as a failure
                results.append((test_id, "failed", traceback.format_exc()[-3000:]))
            finally:
                signal.alarm(0)
        verdicts[ident] = results
        (place / "verdicts.json").write_text(json.dumps(verdicts))
    (place / "verdicts.json").write_text(json.dumps(verdicts))


def _pythonpath() -> str:
    import os

    return os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)


def killed(tests: list) -> bool:
    return any(outcome in ("failed", "error") for _, outcome, _ in tests)


# The pytest plugin (``-p mutants``) that stops an exercise's checks at its first failure.
_FAILED_FILES: set = set()


def pytest_runtest_setup(item):
    if item.path in _FAILED_FILES:
        pytest.skip("an earlier check of this exercise already rejected the mutant")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _FAILED_FILES.add(item.path)
    return report


# --- messages that give the answer away --------------------------------------------------------

def solution_lines(number: str, minimum: int = 24) -> set:
    """The statements of the learner's functions in the solution (and the right-hand side
    of each), without spaces, longer than ``minimum`` characters (shorter ones are an
    API's name, ``idist.get_world_size()``): a failure message that contains one prints
    the answer."""
    tree = ast.parse(solution_file(number).read_text())
    lines = set()
    for function in _learner_functions(tree):
        for node in _nodes(function):
            parts = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)):
                parts = [node] + ([node.value] if node.value is not None else [])
            for part in parts:
                text = re.sub(r"\s+", "", ast.unparse(part))
                if len(text) > minimum and not text.startswith(("'", '"')):
                    lines.add(text)
    return lines


def leaked_lines(number: str, message: str, answer: str = "") -> list:
    """The solution's lines that ``message`` prints and the graded ``answer`` (its source)
    does not contain: a line of the learner's own code quoted back (a traceback) is not a
    leak."""
    squeezed = re.sub(r"\s+", "", message)
    try:
        own = re.sub(r"\s+", "", ast.unparse(ast.parse(answer)))
    except SyntaxError:
        own = ""
    return sorted(line for line in solution_lines(number) if line in squeezed and line not in own)


# --- the command line ------------------------------------------------------------------------------

def main(argv=None) -> int:
    import argparse
    import json
    import os
    import tempfile
    import time

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercises", default="", help="e.g. 01,05 (default: all)")
    parser.add_argument("--sample", type=int, default=0, help="mutants per exercise (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="grade these mutant ids (comma-separated), or "
                        "the survivors of an earlier --out file")
    parser.add_argument("--list", action="store_true", help="print the mutants, grade none")
    parser.add_argument("--rounds-at-once", type=int, default=2)
    parser.add_argument("--in-process", action="store_true", help="one process per exercise grades its "
                        "mutants in turn (cheaper; checks whose functions take no fixture but tmp_path)")
    parser.add_argument("--out", type=Path, help="write every verdict as JSON here")
    args = parser.parse_args(argv)
    chosen = [n for n in args.exercises.split(",") if n] or None
    drawn = draw(args.sample, args.seed, chosen)
    if args.only:
        only = set(args.only.split(","))
        if args.only.endswith(".json"):
            earlier = json.loads(Path(args.only).read_text())["verdicts"]
            only = {i for i, v in earlier.items() if not v["killed"]}
        drawn = [m for m in drawn if m.ident in only]
    if args.list:
        for m in drawn:
            print(f"{m.ident}  line {m.line}: {m.what}")
        print(f"{len(drawn)} mutants")
        return 0
    start, load = time.monotonic(), os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        graded = (grade_in_process(drawn, Path(folder), at_once=args.rounds_at_once) if args.in_process
                  else grade(drawn, Path(folder), rounds_at_once=args.rounds_at_once))
    explained = survivors_explained()
    verdicts = {}
    for m in drawn:
        tests = graded.get(m.ident, [])
        verdicts[m.ident] = {"killed": killed(tests), "what": f"line {m.line}: {m.what}",
                             "explained": explained.get(m.ident, (None, None))[0],
                             "messages": [msg[:600] for _, o, msg in tests if o == "failed"]}
    for number in sorted({m.number for m in drawn}):
        mine = [i for i in verdicts if i.startswith(number + "-")]
        dead = sum(verdicts[i]["killed"] for i in mine)
        ok = not killed(graded.get(f"{number}-identity", [("", "failed", "")]))
        print(f"{number}: {dead}/{len(mine)} killed" + ("" if ok else "  (THE UNMUTATED FILE FAILS)"))
        for i in mine:
            v = verdicts[i]
            if not v["killed"]:
                print(f"   survived [{v['explained'] or 'UNEXPLAINED'}] {i}  {v['what']}")
    took = time.monotonic() - start
    print(f"{len(drawn)} mutants in {took:.0f} s; load average at start {load[0]:.1f}, "
          f"at end {os.getloadavg()[0]:.1f}")
    if args.out:
        args.out.write_text(json.dumps({"seconds": took, "load": [load[0], os.getloadavg()[0]],
                                        "verdicts": verdicts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker(sys.argv[2], Path(sys.argv[3])))
    sys.exit(main())
