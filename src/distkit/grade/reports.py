"""What ``distkit grade`` writes from its results (:class:`distkit.grade.runner.Result`):

- ``grades.csv``: one row per learner, ``learner, ex01 ... , total`` (1 passed, else 0);
- ``<learner>/results.json``: Gradescope's format, one test per exercise;
- ``<learner>/report.html``: each exercise, its verdict, the message, the time, what was stopped;
- ``<learner>/NN.output.txt``: what the check printed (1 MB at most);
- ``summary.html`` and ``summary.csv``: the exercises most often failed, and the messages
  most often met (numbers in them folded, so one mistake with different values counts once).
"""
from __future__ import annotations

import csv
import html
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .6em;"
         "border-bottom:1px solid #ddd;vertical-align:top;text-align:left}.passed{color:#060}"
         ".failed,.stopped,.no{color:#a00}.missing{color:#777}pre{white-space:pre-wrap;margin:0}")


def by_learner(results) -> dict:
    grouped = defaultdict(list)
    for result in results:
        grouped[result.learner].append(result)
    return dict(grouped)


def write_all(results, numbers, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    grouped = by_learner(results)
    write_grades(grouped, numbers, out / "grades.csv")
    for learner, mine in grouped.items():
        folder = out / learner
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(gradescope(mine), indent=1, ensure_ascii=False))
        (folder / "report.html").write_text(learner_page(learner, mine))
        for r in mine:
            if r.output:  # what the check printed, bounded by the sandbox: for the instructor
                (folder / f"{r.exercise}.output.txt").write_text(r.output)
    rows = summary_rows(results)
    write_summary_csv(rows, out / "summary.csv")
    (out / "summary.html").write_text(summary_page(grouped, numbers, rows))


def write_grades(grouped: dict, numbers, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["learner", *(f"ex{n}" for n in numbers), "total"])
        for learner, mine in grouped.items():
            marks = {r.exercise: int(r.passed) for r in mine}
            row = [marks.get(n, 0) for n in numbers]
            writer.writerow([learner, *row, sum(row)])


def gradescope(mine) -> dict:
    """Gradescope's results.json: one visible test of 1 point per exercise."""
    tests = [{"name": f"{r.exercise} {r.name}", "score": int(r.passed), "max_score": 1,
              "output": _learner_text(r), "visibility": "visible"} for r in mine]
    return {"score": sum(t["score"] for t in tests), "execution_time": round(sum(r.seconds for r in mine), 1),
            "output": f"{sum(r.passed for r in mine)} of {len(mine)} exercises passed", "tests": tests}


def _learner_text(result) -> str:
    notes = "".join(f"\n({note})" for note in result.notes)
    return f"{result.status}: {result.message}{notes}"


def learner_page(learner: str, mine) -> str:
    rows = "".join(
        f"<tr><td>{r.exercise}</td><td>{html.escape(r.name)}</td><td class='{r.status.split()[0]}'>"
        f"{r.status}</td><td>{r.seconds:.0f} s</td><td><pre>{html.escape(r.message)}</pre>"
        f"{''.join(f'<p><b>{html.escape(n)}</b></p>' for n in r.notes)}</td></tr>" for r in mine)
    total = sum(r.passed for r in mine)
    return _page(f"{learner}: {total} of {len(mine)}",
                 f"<table><tr><th>#</th><th>file</th><th>verdict</th><th>time</th><th>what the check said"
                 f"</th></tr>{rows}</table>")


def mistake(message: str) -> str:
    """The message's first line, its numbers folded: one mistake, whatever the values."""
    first = (message.strip().splitlines() or [""])[0]
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", first)[:200]


def summary_rows(results) -> list:
    """``(exercise, learners who failed it, mistake, learners with that mistake)``, most common first."""
    failed = Counter(r.exercise for r in results if not r.passed)
    mistakes = Counter((r.exercise, r.status if r.status == "missing" else mistake(r.message))
                       for r in results if not r.passed)
    rows = [(ex, failed[ex], text, count) for (ex, text), count in mistakes.items()]
    return sorted(rows, key=lambda row: (-row[1], row[0], -row[3], row[2]))


def write_summary_csv(rows, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["exercise", "learners_failed", "mistake", "learners_with_it"])
        writer.writerows(rows)


def summary_page(grouped: dict, numbers, rows) -> str:
    passed = {n: sum(1 for mine in grouped.values() for r in mine if r.exercise == n and r.passed)
              for n in numbers}
    head = "".join(f"<tr><td>{n}</td><td>{passed[n]} of {len(grouped)}</td></tr>" for n in numbers)
    body = "".join(f"<tr><td>{ex}</td><td>{count}</td><td><pre>{html.escape(text)}</pre></td></tr>"
                   for ex, _, text, count in rows)
    learners = "".join(f"<li><a href='{html.escape(name)}/report.html'>{html.escape(name)}</a>: "
                       f"{sum(r.passed for r in mine)}</li>" for name, mine in grouped.items())
    return _page(f"The class: {len(grouped)} learners",
                 f"<h2>Passed, per exercise</h2><table>{head}</table>"
                 f"<h2>The most common mistakes</h2><table><tr><th>exercise</th><th>learners</th>"
                 f"<th>mistake</th></tr>{body}</table><h2>Learners</h2><ul>{learners}</ul>")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style><h1>{html.escape(title)}</h1>{body}\n")
