"""The package's shape is its architecture: arrows point one way (DESIGN.md, issue 10).
The core never imports ``distkit.lessons``, ``distkit.commands``, ``distkit.bench`` or ``distkit.grade``;
notebooks and exercises import library code, never a command-line module."""
from __future__ import annotations

import ast
import json

import pytest

from support import REPO_ROOT

SRC = REPO_ROOT / "src" / "distkit"
CORE_ROOMS = ("host", "compat", "builtin", "checkpoint", "observe", "train", "launch")
CORE = sorted([p for p in SRC.glob("*.py") if p.name != "__main__.py"]  # __main__ is the CLI's door
              + [p for room in CORE_ROOMS for p in (SRC / room).rglob("*.py")])
NOT_FOR_CORE = ("distkit.lessons", "distkit.commands", "distkit.bench", "distkit.grade")


def imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)  # from distkit import lessons
    return names


def offending(names, prefixes):
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(SRC)))
def test_core_module_imports_no_lesson_command_or_bench(path):
    bad = offending(imported_modules(path.read_text()), NOT_FOR_CORE)
    assert not bad, f"src/distkit/{path.name} imports {bad}: the core must not depend on them"


def test_the_check_catches_a_core_module_that_imports_a_lesson():
    assert offending(imported_modules("from distkit.lessons import scaling"), NOT_FOR_CORE)
    assert offending(imported_modules("from distkit import commands"), NOT_FOR_CORE)
    assert not offending(imported_modules("from distkit import sharding"), NOT_FOR_CORE)


def notebook_sources():
    for path in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        code = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith(("!", "%")))
        yield path.name, code
    for path in sorted((REPO_ROOT / "exercises").rglob("*.py")):
        yield str(path.relative_to(REPO_ROOT)), path.read_text()


TEACHING = list(notebook_sources())


@pytest.mark.parametrize("name,source", TEACHING, ids=[name for name, _ in TEACHING])
def test_teaching_material_imports_no_command_module(name, source):
    bad = offending(imported_modules(source), ("distkit.commands",))
    assert not bad, f"{name} imports {bad}: import the library (distkit.train.training, ...), not the CLI"
