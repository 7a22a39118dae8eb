"""The documented examples run as written: every ```python block of README.md and
docs/course.md, and the examples in the public API's docstrings, each in a fresh
interpreter, as a script (so spawn re-imports it, as it would for a reader).

A python block in the docs starts with ``# file: NAME.py``: it is written under that name
(a later block may import an earlier one, as ``train_course.py`` imports ``course.py``),
and every file with an ``if __name__ == "__main__":`` guard is run with ``python NAME.py``.
"""
from __future__ import annotations

import doctest
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import script_files

from distkit.lessons.multinode import clean_env, log_tail

REPO = Path(__file__).resolve().parents[2]
DOCS = {"README.md": ["val accuracy"], "docs/course.md": ["val mse", "2 ranks, 2 epochs, test loss"]}


def run_script(folder: Path, name: str, timeout=240):
    out = subprocess.run([sys.executable, name], cwd=folder, env=clean_env(), capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"{name} failed:\n{log_tail(out.stderr, 40)}"
    return out.stdout


def test_every_doc_python_block_is_a_named_script():
    for doc in DOCS:
        files = script_files(REPO / doc)
        assert files and any('if __name__ == "__main__":' in code for code in files.values())
    assert "docs/course.md" in (REPO / "README.md").read_text(), "README links the course guide"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("doc", sorted(DOCS))
def test_doc_examples_run_as_scripts_under_spawn(doc, tmp_path):
    files = script_files(REPO / doc)
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    printed = ""
    for name, code in files.items():
        if 'if __name__ == "__main__":' in code:
            printed += run_script(tmp_path, name)
    for words in DOCS[doc]:
        assert words in printed, printed[-2000:]


# --- docstrings of the public API ---------------------------------------------------------

DOCTESTED = ["distkit.tasks", "distkit.train.training", "distkit.train.schedules", "distkit.builtin.data", "distkit.launch.checks", "distkit.launch.checks",
             "distkit.host.facts", "distkit.observe.reporting", "distkit.builtin.models", "distkit.train.agreement",
             "distkit.checkpoint.saver"]
# public callables whose docstring example is a script (a literal block after "::")
SCRIPTED = {"distkit.launch.entry:run": "val accuracy", "distkit.launch.entry:launch_function": "2 ranks",
            "distkit.tasks": None}


def literal_block(doc: str) -> str:
    """The indented block after the first '::' of a docstring."""
    m = re.search(r"::\n\n((?:[ \t]+.*\n|\n)+)", doc + "\n")
    assert m, "no '::' example in the docstring"
    return textwrap.dedent(m.group(1))


def test_every_touched_public_function_has_an_example():
    import distkit
    from distkit.launch import entry as launch
    from distkit import tasks
    from distkit.train import training

    for fn in (distkit.Task, distkit.resolve_task, training.training, launch.run,
               launch.launch_function):
        doc = inspect.getdoc(fn) or ""
        assert ">>>" in doc or "::" in doc, f"{fn.__qualname__} has no example"
    assert "::" in (tasks.__doc__ or "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", DOCTESTED)
def test_docstring_doctests_pass(module, tmp_path):
    code = (f"import doctest, importlib; m = importlib.import_module({module!r}); "
            "r = doctest.testmod(m); print(r.attempted, r.failed)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=280)
    attempted, failed = map(int, out.stdout.split()[-2:])
    assert attempted > 0 and failed == 0, out.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", sorted(SCRIPTED))
def test_docstring_scripts_run_under_spawn(where, tmp_path):
    import importlib

    module, _, name = where.partition(":")
    obj = importlib.import_module(module)
    obj = getattr(obj, name) if name else obj
    code = literal_block(inspect.getdoc(obj) or obj.__doc__)
    (tmp_path / "example.py").write_text(code)
    printed = run_script(tmp_path, "example.py")
    if SCRIPTED[where]:
        assert SCRIPTED[where] in printed, printed[-2000:]
