"""The site's exercise pages, made at build time from ``exercises/`` (scripts/site_hooks.py).

Each exercise ``exercises/NN_topic.py`` gets a page ``exercises/NN_topic.md`` of the site:
its task (the stub's docstring), the stub's code, how to check it (``distkit check NN``),
its hint behind a click (the section of ``exercises/hints.md`` that ``distkit check NN
--hint`` prints), and the notebooks that lead to it. ``exercises/index.md`` lists them all
and says how an answer is checked. Nothing is copied by hand: a changed stub or hint
changes its page at the next build.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
INDEX = "exercises/index.md"

# The notebooks whose topic an exercise practises (their pages link to the exercise).
LEADS_TO = {
    "01": ("01",), "02": ("04",), "03": ("05",), "04": ("01", "04"), "05": ("07",),
    "06": ("08",), "07": ("04", "09"), "08": ("08",), "09": ("11",), "10": ("10",),
    "11": ("11",), "12": ("11", "12"), "13": ("13",), "14": ("14",), "15": ("15",),
    "16": ("01", "15", "16"),
    "17": ("10",),
}


def stubs(folder: Path = EXERCISES) -> dict[str, Path]:
    """``{"01": exercises/01_collectives.py, ...}``."""
    return {p.name[:2]: p for p in sorted(folder.glob("[0-9][0-9]_*.py"))}


def page_uri(stub: Path) -> str:
    return f"exercises/{stub.stem}.md"


def task_and_code(stub: Path) -> tuple[str, str, str]:
    """(title, the docstring less its first line, the code after the docstring)."""
    source = stub.read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    first, _, rest = doc.partition("\n")
    level = re.match(r"^Exercise \d+\s*(?:\((\w+)\))?:\s*", first)
    title = first[level.end():].rstrip(".") + (f" ({level.group(1)})" if level and level.group(1) else "")
    body_start = tree.body[1].lineno - 1 if len(tree.body) > 1 else len(source.splitlines())
    code = "\n".join(source.splitlines()[body_start:]).strip("\n")
    return title[:1].upper() + title[1:], rest.strip("\n"), code


def docstring_markdown(text: str) -> str:
    """A docstring as Markdown: ``code`` as `code`, :class:`X` as `X`, indented examples as
    code blocks; its own "Check it" / "Stuck?" lines left out (the page has both)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    kept = [ln for ln in text.splitlines() if not ln.startswith(("Check it:", "Stuck?"))]
    return "\n".join(kept).strip()


def hint(number: str, folder: Path = EXERCISES) -> str:
    """The hint ``distkit check NN --hint`` prints, less its heading."""
    from distkit.commands.check import hint_for

    return hint_for(folder, number).split("\n", 1)[1].strip()


def exercise_page(number: str, stub: Path, notebooks: dict[str, tuple[str, str]]) -> str:
    """The Markdown of exercise ``number``'s page; ``notebooks`` maps "04" to (the
    notebook's path in the repository, its title)."""
    title, task, code = task_and_code(stub)
    leads = [f"[{notebooks[n][1]}](../{notebooks[n][0]})" for n in LEADS_TO.get(number, ()) if n in notebooks]
    hinted = textwrap.indent(hint(number), "    ")
    return f"""# Exercise {number} · {title}

{docstring_markdown(task)}

{"Before it: " + ", ".join(leads) + "." if leads else ""}

## Your file

In your clone of the course, `exercises/{stub.name}` holds this; replace its `# TODO`
with your code:

```python
{code}
```

## Check it

```bash
distkit check {number}
```

It runs your function for real (on several processes where the topic is distributed)
and says in plain words what is wrong, or that it passes. How that works:
[how your answer is checked](index.md#how-your-answer-is-checked).

## Hint

Try without it first. `distkit check {number} --hint` prints the same.

??? tip "Show the hint"

{hinted}
"""


def index_page(titles: dict[str, str], grading: bool) -> str:
    """The Markdown of ``exercises/index.md``: every exercise, and how one is checked."""
    rows = "\n".join(f"| {n} | [{t}]({Path(page_uri(s)).name}) |" for n, (s, t) in titles.items())
    more = ("\n\nAn instructor may grade your files for the whole class: what you then see is in "
            "[Grading a class](../docs/grading.md).") if grading else ""
    return f"""# Exercises

Each exercise is a file in `exercises/` of the course's repository, with the task in its
docstring, a `# TODO` and `raise NotImplementedError`: you replace the TODO with your
code. Do them after the notebooks that lead to them (each page names them).

| # | exercise |
| --- | --- |
{rows}

## How your answer is checked

In a clone of the repository, install the checks once and run the one you want:

```bash
pip install -e ".[exercises]"     # pytest only
distkit check 03                  # check exercise 03
distkit check                     # check all of them
distkit check 03 --hint           # its hint (the same as on its page)
distkit check 03 --solution       # the reference answer, when you are done
```

The check imports your file and calls your function for real: on 2 or more processes
talking through gloo where the exercise is about several processes, in one process
otherwise. It compares what your function does with a reference on inputs it draws, and
prints one of three things:

- your exercise is not solved yet (it still raises `NotImplementedError`);
- what is wrong, in plain words, with the numbers that show it (which rank got which
  sample, which value differs and by how much);
- that it passes.

A check never needs a GPU or a network; most take a few seconds, the multi-process ones
up to a minute on a 2-core laptop.{more}
"""


def pages(notebooks: dict[str, tuple[str, str]], grading: bool = False) -> dict[str, str]:
    """``{path on the site: Markdown}``: the index and one page per exercise."""
    found = stubs()
    made = {page_uri(s): exercise_page(n, s, notebooks) for n, s in found.items()}
    titles = {n: (s, task_and_code(s)[0]) for n, s in found.items()}
    return {INDEX: index_page(titles, grading), **made}


def nav_titles() -> list[dict[str, str]]:
    """The exercises' entries in the site's navigation."""
    return [{f"{n} · {task_and_code(s)[0]}": page_uri(s)} for n, s in stubs().items()]
