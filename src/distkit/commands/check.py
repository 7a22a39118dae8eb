"""``distkit check``: grade your exercise files, show a hint, or show a solution.

::

    distkit check             # every exercise (same as: pytest exercises)
    distkit check 03          # exercise 03 only (same as: pytest exercises -m ex03)
    distkit check 03 --hint   # the hint for exercise 03 (from exercises/hints.md)
    distkit check 03 --solution   # print the reference answer
    distkit check --list      # the exercises, in the notebooks' order
    distkit check --solutions # grade the reference answers instead of your files

The exercises live in the cloned repository (``exercises/``), not in the installed
package: run it inside the clone, or pass ``--dir path/to/exercises``.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from distkit.errors import DistkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("exercise", nargs="?", default=None,
                   help="exercise number, e.g. 03 (default: all of them)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--hint", action="store_true", help="print the hint for the exercise")
    what.add_argument("--solution", action="store_true",
                      help="print the reference answer for the exercise")
    what.add_argument("--list", action="store_true", help="list the exercises")
    p.add_argument("--solutions", action="store_true",
                   help="grade exercises/solutions/ instead of your files (for instructors)")
    p.add_argument("--dir", default=None,
                   help="the exercises folder (default: ./exercises, or the one next to "
                        "the distkit sources)")


def find_exercises_dir(given: str | None = None) -> Path:
    """The ``exercises/`` folder: ``given``, else in the current folder or a parent, else
    next to the distkit sources (an editable install of the clone)."""
    if given is not None:
        path = Path(given).expanduser().resolve()
        if not (path / "checks").is_dir():
            raise DistkitError(f"--dir {given}: no exercise checks in it (expected "
                               f"{path / 'checks'}); pass the exercises/ folder of the repository")
        return path
    here = Path.cwd().resolve()
    candidates = [d / "exercises" for d in (here, *here.parents)]
    candidates.append(Path(__file__).resolve().parents[3] / "exercises")  # src/distkit/commands/
    for path in candidates:
        if (path / "checks").is_dir():
            return path
    raise DistkitError("no exercises/ folder here: run distkit check inside the cloned "
                       "distkit repository, or pass --dir path/to/exercises")


def list_exercises(folder: Path) -> dict:
    """``{"01": path, ...}`` for the stubs ``NN_topic.py`` in ``folder``."""
    found = {}
    for path in sorted(folder.glob("[0-9][0-9]_*.py")):
        found[path.name[:2]] = path
    return found


def normalize(number: str, known: dict) -> str:
    digits = re.sub(r"^ex", "", number.strip().lower())
    if not digits.isdigit() or f"{int(digits):02d}" not in known:
        choices = ", ".join(known) or "none"
        raise DistkitError(f"no exercise {number!r}: choose one of {choices} "
                           "(distkit check --list shows them)")
    return f"{int(digits):02d}"


def hint_for(folder: Path, number: str) -> str:
    """The section ``## NN ...`` of ``hints.md``."""
    text = (folder / "hints.md").read_text()
    match = re.search(rf"^## {number}\b.*?(?=^## |\Z)", text, flags=re.M | re.S)
    if not match:
        raise DistkitError(f"exercises/hints.md has no section '## {number}': add one")
    return match.group(0).strip()


def summary_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.splitlines()[0] if doc else path.stem


def main(args) -> int:
    folder = find_exercises_dir(args.dir)
    known = list_exercises(folder)
    number = normalize(args.exercise, known) if args.exercise is not None else None
    if args.list:
        for n, path in known.items():
            print(f"{n}  {summary_line(path)}   ({os.path.relpath(path)})")
        return 0
    if args.hint or args.solution:
        if number is None:
            raise DistkitError(f"--{'hint' if args.hint else 'solution'} needs an exercise "
                               "number, e.g. distkit check 03 --hint")
        if args.hint:
            print(hint_for(folder, number))
        else:
            path = folder / "solutions" / known[number].name
            print(f"# {os.path.relpath(path)}\n")
            print(path.read_text())
        return 0
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise DistkitError("pytest is not installed: pip install -e '.[exercises]' (in the "
                           "cloned repository), then run distkit check again") from None
    command = [sys.executable, "-m", "pytest", str(folder), "-q"]
    if number is not None:
        command += ["-m", f"ex{number}"]
    env = dict(os.environ)
    if args.solutions:
        env["DISTKIT_EXERCISES"] = "solutions"
    return subprocess.call(command, cwd=folder.parent, env=env)
