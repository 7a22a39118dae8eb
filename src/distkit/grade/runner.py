"""Learners x exercises, each graded in a sandbox of its own, side by side, never from the
sandbox's exit status:

- a check made of two halves (:mod:`distkit.grade.outside`) collects the learner's data in
  the sandbox, with no reference there; the grader judges it against the reference's data
  (collected once per class, on a seed drawn for the class) in its own process;
- any other check runs as ``distkit check``'s pytest in the sandbox, and its verdict is read
  from the plugin's signed records (:mod:`distkit.grade.plugin`): decided inside the
  learner's process, which the report says beside it.

Each (learner, exercise) gets a copy of that one file (a symlink or a file over 1 MB is
refused, so nothing outside the submission is ever shown to the sandbox) and the checks
read-only; for pytest's checks, a fresh key and the reference of that exercise only through
the plugin's pipe.
"""
from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from distkit.errors import DistkitError
from distkit.grade import outside, sandbox
from distkit.grade.plugin import VERDICT_KINDS, sign

MAX_FILE_BYTES = 1 << 20
INSIDE_NOTE = "checked inside the sandbox: a forged pass is possible"
MAX_ZIP_BYTES = 50 << 20
INSIDE = "/grade"


@dataclass
class Kit:
    """Where the checks are: ``exercises/`` (stubs, ``checks/``, ``solutions/``, pytest.ini)."""
    folder: Path

    def names(self) -> dict:
        """``{"03": "03_sharding.py", ...}`` from the stubs."""
        return {p.name[:2]: p.name for p in sorted(self.folder.glob("[0-9][0-9]_*.py"))}


@dataclass
class Result:
    learner: str
    exercise: str
    name: str                 # the file's usual name, 03_sharding.py
    status: str               # passed, failed, missing, stopped, no verdict
    message: str = ""
    seconds: float = 0.0
    notes: list = field(default_factory=list)   # each containment, in the learner's words
    output: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def find_learners(submissions: Path, unpack_to: Path) -> dict:
    """``{learner: folder}``: each folder of ``submissions`` (or of the zip it is), and each
    ``NAME.zip`` in it unpacked as learner NAME."""
    if submissions.is_file() and zipfile.is_zipfile(submissions):
        submissions = _unzip(submissions, unpack_to / "_class")
    if not submissions.is_dir():
        raise DistkitError(f"{submissions}: no such folder (or zip) of submissions: give a folder "
                           "holding one folder (or .zip) per learner")
    learners = {}
    for entry in sorted(submissions.iterdir()):
        if entry.name.startswith((".", "__MACOSX")) or entry.is_symlink():
            continue
        if entry.is_dir():
            learners[entry.name] = entry
        elif entry.suffix.lower() == ".zip" and zipfile.is_zipfile(entry):
            learners[entry.stem] = _unzip(entry, unpack_to / entry.stem)
    return learners


def _unzip(path: Path, target: Path) -> Path:
    """Unpack ``path`` into ``target`` (no member outside it, no links, 50 MB at most); a
    zip holding one folder gives that folder."""
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path) as z:
        members = [m for m in z.infolist() if not m.is_dir()]
        if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
            raise DistkitError(f"{path}: unpacks to more than {MAX_ZIP_BYTES >> 20} MB: remove what is "
                               "not an exercise file")
        for member in members:
            out = (target / member.filename).resolve()
            if target.resolve() not in out.parents or (member.external_attr >> 28) == 0o12:
                continue  # outside the folder, or a symbolic link: never unpacked
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(member))
    inside = [p for p in target.iterdir() if not p.name.startswith(("__MACOSX", "."))]
    return inside[0] if len(inside) == 1 and inside[0].is_dir() else target


def learner_file(folder: Path, name: str) -> Path | None:
    """The learner's ``name`` (e.g. 03_sharding.py), anywhere in their folder; links skipped."""
    for path in sorted(folder.rglob(name), key=lambda p: len(p.parts)):
        if path.is_file() and not path.is_symlink():
            return path
    return None


def grade_class(kit: Kit, learners: dict, numbers: list, limits: sandbox.Limits, jobs: int,
                work: Path, progress=lambda done, total, result: None) -> list:
    """Every learner's every exercise in ``numbers``; ``jobs`` sandboxes at a time."""
    names = kit.names()
    tasks = [(learner, number) for learner in learners for number in numbers]
    slots = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    hidden = [kit.folder / "solutions", work, *{f.parent.resolve() for f in learners.values()}]
    references = References(kit, limits, work / "references")

    def one(task):
        learner, number = task
        slot = slots.get()
        try:
            return grade_one(kit, learner, number, learner_file(learners[learner], names[number]),
                             limits, work / f"slot{slot}", slot, hidden, references)
        finally:
            slots.put(slot)

    results = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(one, tasks):
            results.append(result)
            progress(len(results), len(tasks), result)
    return results


class References:
    """The reference's data of each exercise judged outside, collected the first time a
    learner's file of it is graded, on a seed drawn for this class."""

    def __init__(self, kit: Kit, limits: sandbox.Limits, folder: Path):
        self.kit, self.limits, self.folder = kit, limits, folder
        self.found, self.lock, self.locks = {}, threading.Lock(), {}

    def of(self, number: str):
        """``(check, seed, reference data)``, or None when the check is pytest's only."""
        with self.lock:
            lock = self.locks.setdefault(number, threading.Lock())
        with lock:
            if number not in self.found:
                check = outside.check_module(self.kit.folder / "checks", number)
                found = None
                if outside.judged_outside(check):
                    seed = secrets.randbelow(10**6) + 1
                    self.folder.mkdir(parents=True, exist_ok=True)
                    data = outside.reference_data(self.kit.folder / "checks", number, seed,
                                                  self.limits.timeout_s, self.folder / f"{number}.pt")
                    found = (check, seed, data)
                self.found[number] = found
            return self.found[number]


def grade_one(kit: Kit, learner: str, number: str, path: Path | None, limits: sandbox.Limits,
              scratch: Path, slot: int = 0, hidden=(), references: References | None = None) -> Result:
    name = kit.names()[number]
    if path is None:
        return Result(learner, number, name, "missing", f"no file {name} was handed in")
    if path.stat().st_size > MAX_FILE_BYTES:
        return Result(learner, number, name, "failed", f"{name} is over 1 MB: not graded")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "submission").mkdir(parents=True)
    shutil.copyfile(path, scratch / "submission" / name)
    judged = (references or References(kit, limits, scratch / "references")).of(number)
    if judged is not None:
        return _grade_outside(learner, number, name, judged, limits, kit, scratch, slot, hidden)
    keys = (secrets.token_bytes(32), secrets.token_bytes(32))
    solution = {number: (kit.folder / "solutions" / name).read_text()}
    payload = json.dumps({"keys": [k.hex() for k in keys], "references": solution}).encode()
    outcome = sandbox.run(_pytest_command(number), _binds(kit, scratch / "submission"),
                          list(hidden), _environment(), payload, limits, slot)
    status, message = verdict(outcome.records, keys)
    notes = containments(outcome, limits)
    if outcome.timed_out:
        status, message = "stopped", f"stopped after {limits.timeout_s:.0f} s: {message}"
    elif status == "passed" and outcome.returncode != 0:
        status, message = "no verdict", f"every check passed, but pytest ended with code {outcome.returncode}"
    elif status == "no verdict":
        message = f"{message}\n{_tail(outcome.output)}"
    shutil.rmtree(scratch, ignore_errors=True)
    return Result(learner, number, name, status, message, outcome.seconds, [*notes, INSIDE_NOTE],
                  outcome.output)


def _grade_outside(learner, number, name, judged, limits, kit, scratch, slot, hidden) -> Result:
    """The learner's data collected in the sandbox, judged here against the reference's."""
    check, seed, reference = judged
    command = [sys.executable, "-m", "distkit.grade.outside", f"{INSIDE}/exercises/checks", number, str(seed)]
    outcome = sandbox.run(command, _binds(kit, scratch / "submission"), list(hidden), _environment(),
                          b"", limits, slot)
    status, message = outside.verdict(check, outcome.records, reference, seed)
    if outcome.timed_out:
        status, message = "stopped", f"stopped after {limits.timeout_s:.0f} s: {message}"
    elif status == "no verdict":
        message = f"{message}\n{_tail(outcome.output)}"
    shutil.rmtree(scratch, ignore_errors=True)
    return Result(learner, number, name, status, message, outcome.seconds, containments(outcome, limits),
                  outcome.output)


def _pytest_command(number: str) -> list:
    return [sys.executable, "-m", "pytest", f"{INSIDE}/exercises", "-q", "-p", "no:cacheprovider",
            "-p", "distkit.grade.plugin", "-m", f"ex{number}", "--color=no"]


def _binds(kit: Kit, submission: Path) -> list:
    return [(kit.folder / "checks", f"{INSIDE}/exercises/checks"),
            (kit.folder / "pytest.ini", f"{INSIDE}/exercises/pytest.ini"),
            (submission, f"{INSIDE}/submission")]


def _environment() -> dict:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
           "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "GLOO_SOCKET_IFNAME": "lo",  # its own loopback
           "DISTKIT_EXERCISES": f"{INSIDE}/submission"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def verdict(records: bytes, keys: tuple) -> tuple:
    """``(status, message)`` from the plugin's records: passed only when every collected
    check has a genuine ``passed`` line, nothing genuine says otherwise, and none is forged.
    ``keys``: the key of what earns marks, then the key of what costs them."""
    collected, passed, against, forged, done = None, set(), [], 0, False
    for raw in records.decode("utf-8", "replace").splitlines():
        line, _, mac = raw.rpartition("\t")
        key = keys[0] if line.split("\t")[0] in VERDICT_KINDS else keys[1]
        if not hmac.compare_digest(sign(key, line), mac) or line.count("\t") != 2:
            forged += 1
            continue
        kind, nodeid, detail = line.split("\t")
        detail = detail.replace("\\n", "\n").replace("\\\\", "\\")
        if kind == "collected":
            collected = int(detail)
        elif kind == "passed":
            passed.add(nodeid)
        elif kind in ("failed", "tampered", "borrowed"):
            against.append((kind, detail))
        elif kind == "done":
            done = True
    if forged:
        return "failed", f"{forged} line(s) imitating the grader's verdict were written: no marks"
    for kind in ("borrowed", "tampered"):
        said = list(dict.fromkeys(detail for found, detail in against if found == kind))
        if said:
            return "failed", "; ".join(said) + ": no marks"
    for found, detail in against:
        if found == "failed":
            return "failed", detail
    if collected is None:
        return "no verdict", "the check never started: the file ended the process or broke pytest"
    if collected and len(passed) == collected and done:
        return "passed", f"all {collected} checks passed"
    return "no verdict", f"the check stopped before it finished ({len(passed)} of {collected} checks passed)"


def containments(outcome: sandbox.Outcome, limits: sandbox.Limits) -> list:
    """What the sandbox had to stop, in the words a report shows."""
    notes = []
    if outcome.timed_out:
        notes.append(f"stopped after {limits.timeout_s:.0f} s")
    if outcome.output_cut:
        notes.append(f"output cut at {_size(limits.output_bytes)}")
    if outcome.left_behind:
        notes.append(f"{outcome.left_behind} process(es) still running at the end were stopped")
    if outcome.returncode is not None and outcome.returncode < 0 and not outcome.timed_out:
        notes.append(f"ended by signal {-outcome.returncode} (a limit: {limits.memory_mb} MB of memory, "
                     f"{limits.processes} processes, {limits.file_mb} MB per file)")
    return notes


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def _tail(output: str, lines: int = 15) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def default_jobs() -> int:
    """Sandboxes side by side: a check runs up to 4 ranks and pytest, so one per 2 cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


def work_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="distkit-grade-"))
