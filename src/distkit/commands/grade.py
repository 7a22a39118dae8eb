"""``distkit grade``: a class's submissions graded by the exercise checks, each in a sandbox.

::

    distkit grade SUBMISSIONS --out REPORT                 # every exercise, every learner
    distkit grade SUBMISSIONS --out REPORT --exercises 01,03 --jobs 2 --timeout 300
    distkit grade --gradescope-autograder autograder.zip --exercises 01,03

``SUBMISSIONS`` holds one folder (or .zip) per learner with any of the exercise files
under their usual names (``03_sharding.py``). ``REPORT`` gets ``grades.csv``, a folder per
learner (``results.json`` in Gradescope's format, ``report.html``) and ``summary.html`` /
``summary.csv``. Each file runs in a bubblewrap sandbox (``apt-get install bubblewrap``):
no network, no other learner's files, no reference solutions, limits on time, memory,
processes and output. docs/grading.md says why, and how to read the results.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import zipfile
from pathlib import Path

from distkit.errors import DistkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("submissions", nargs="?", default=None,
                   help="a folder (or zip) of one folder or .zip per learner")
    p.add_argument("--out", default=None, help="the report's folder (made if missing)")
    p.add_argument("--exercises", default=None, help="the exercises to grade, e.g. 01,03 (default: all)")
    p.add_argument("--jobs", type=int, default=None,
                   help="sandboxes side by side (default: one per 2 cores; a check runs up to 4 ranks)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per exercise file")
    p.add_argument("--memory-mb", type=int, default=4096,
                   help="address space allowed to each process of a submission, in MB")
    p.add_argument("--dir", default=None, help="the exercises folder (default: as distkit check)")
    p.add_argument("--gradescope-autograder", metavar="ZIP", default=None,
                   help="write the autograder zip Gradescope runs, and stop")
    p.add_argument("--autograder-root", metavar="ROOT", default=None,
                   help="grade ROOT/submission into ROOT/results/results.json (what the zip's "
                        "run_autograder calls; ROOT is /autograder on Gradescope)")


def main(args) -> int:
    from distkit.commands.check import find_exercises_dir
    from distkit.grade import runner

    kit = runner.Kit(find_exercises_dir(args.dir))
    numbers = chosen_exercises(args.exercises, kit.names())
    if args.gradescope_autograder:
        path = build_autograder(kit, numbers, Path(args.gradescope_autograder))
        print(f"wrote {path}: upload it as the assignment's autograder (docs/grading.md)")
        return 0
    if args.autograder_root:
        return autograder(kit, numbers, Path(args.autograder_root), args)
    if not args.submissions or not args.out:
        raise DistkitError("give the submissions and where to write the report: distkit grade "
                           "SUBMISSIONS --out REPORT (or --gradescope-autograder ZIP)")
    return grade(kit, numbers, Path(args.submissions), Path(args.out), args)


def chosen_exercises(text: str | None, known: dict) -> list:
    from distkit.commands.check import normalize

    if not text:
        return list(known)
    return sorted({normalize(part, known) for part in text.split(",") if part.strip()})


def _limits(args):
    from distkit.grade.sandbox import Limits

    if args.timeout <= 0 or args.memory_mb < 256:
        raise DistkitError("--timeout must be above 0 s and --memory-mb at least 256 (torch alone "
                           "maps about 1.5 GB: 4096 is the default)")
    return Limits(timeout_s=args.timeout, memory_mb=args.memory_mb)


def grade(kit, numbers, submissions: Path, out: Path, args) -> int:
    from distkit.grade import reports, runner, sandbox

    sandbox.require_bwrap()
    limits, work = _limits(args), runner.work_folder()
    try:
        learners = runner.find_learners(submissions.resolve(), work / "unpacked")
        if not learners:
            raise DistkitError(f"{submissions}: no learner's folder or .zip in it")
        jobs = args.jobs or runner.default_jobs()
        print(f"grading {len(learners)} learners x {len(numbers)} exercises, {jobs} at a time "
              f"(limits: {limits.timeout_s:.0f} s per file, {limits.memory_mb} MB per process)",
              file=sys.stderr)
        results = runner.grade_class(kit, learners, numbers, limits, jobs, work, progress=Progress())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    reports.write_all(results, numbers, out)
    passed = sum(r.passed for r in results)
    print(f"{passed} of {len(results)} passed; wrote {out / 'grades.csv'} and {out / 'summary.html'}")
    return 0


class Progress:
    """A bar over learners x exercises on a terminal; one line per file otherwise."""

    def __call__(self, done: int, total: int, result) -> None:
        width = 30
        filled = width * done // total
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {result.learner} "
                f"{result.exercise}: {result.status}")
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{line[:120]:<120}" + ("\n" if done == total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def autograder(kit, numbers, root: Path, args) -> int:
    """Gradescope's run: ROOT/submission is one learner; ROOT/results/results.json the verdict."""
    from distkit.grade import reports, runner, sandbox

    sandbox.require_bwrap()
    limits, work = _limits(args), runner.work_folder()
    try:
        learner = {"submission": (root / "submission").resolve()}
        results = runner.grade_class(kit, learner, numbers, limits, args.jobs or runner.default_jobs(),
                                     work, progress=Progress())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / "results" / "results.json").write_text(
        json.dumps(reports.gradescope(results), indent=1, ensure_ascii=False))
    return 0


SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the assignment's image.
set -euo pipefail
apt-get update -q
apt-get install -y -q bubblewrap python3 python3-venv python3-pip
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu torch
/autograder/venv/bin/pip install -q "/autograder/source/distkit[exercises]"
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it grades /autograder/submission into
# /autograder/results/results.json. AUTOGRADER_ROOT and AUTOGRADER_PYTHON point it elsewhere.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
exec "$PYTHON" -m distkit grade --autograder-root "$ROOT" --dir "$ROOT/source/distkit/exercises" \\
    --exercises {exercises} --timeout {timeout:.0f} --memory-mb {memory}
"""


def build_autograder(kit, numbers, path: Path) -> Path:
    """The zip: setup.sh, run_autograder, and the kit (sources, exercises, checks, solutions)."""
    repo = kit.folder.parent
    if not (repo / "pyproject.toml").exists() or not (repo / "src" / "distkit").is_dir():
        raise DistkitError(f"{repo} is not a clone of distkit (no pyproject.toml and src/distkit): "
                           "build the autograder from the cloned repository")
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        _add_script(z, "setup.sh", SETUP)
        _add_script(z, "run_autograder", RUN.format(exercises=",".join(numbers), timeout=300, memory=4096))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (repo / name).exists():
                z.write(repo / name, f"distkit/{name}")
        for folder in (repo / "src" / "distkit", kit.folder):
            for file in sorted(folder.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    z.write(file, f"distkit/{file.relative_to(repo)}")
    return path


def _add_script(z: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o100755 << 16
    z.writestr(info, text)
