"""``distkit grade`` on a class of learners (exercises 01, 03 and 06, the quickest checks):
full marks under a unicode name with spaces, untouched stubs, wrong answers (from
test_exercises' list, their messages checked), missing files, a zipped folder, and hostile
learners who try every escape — graded with the right totals, nothing written or reached
outside their sandbox, no process left behind. Plus the Gradescope autograder's
``run_autograder``, run against a stand-in /autograder tree."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import REPO_ROOT, plain_data, subprocess_env
from test_exercises import WRONG_ANSWERS, wrong_source

EXERCISES = REPO_ROOT / "exercises"
NUMBERS = ("01", "03", "06")
NAMES = {p.name[:2]: p.name for p in EXERCISES.glob("[0-9][0-9]_*.py")}
FULL = "Zoë Ångström 李 (full marks)"
MARKER = "distkit-grade-hostile-7f3a"


def ensure_bwrap() -> None:
    """Install Debian's bubblewrap when it is missing and this is root; skip otherwise."""
    if shutil.which("bwrap"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no bwrap here and not root to install it: sudo apt-get install bubblewrap")
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "bubblewrap"]):
        subprocess.run(command, capture_output=True, timeout=600)
    if not shutil.which("bwrap"):
        pytest.skip("apt-get did not install bubblewrap")


class Listener:
    """A TCP listener on the host's 127.0.0.1 that counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port, self.accepted, self.stop = self.sock.getsockname()[1], 0, False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


ESCAPES = '''
import os, socket, subprocess, sys, time
MARKER = {marker!r}
def _try(what, action):
    try:
        action()
        print(MARKER, "ESCAPED", what, flush=True)
    except Exception as error:
        print(MARKER, "contained", what, type(error).__name__, flush=True)
def _read(path):
    with open(path) as f:
        f.read()
_try("read solutions", lambda: _read({solution!r}))
_try("read solutions inside", lambda: _read("/grade/exercises/solutions/01_collectives.py"))
_try("read another learner", lambda: _read({other_file!r}))
_try("write outside", lambda: open({outside!r} + "/escaped.txt", "w").write("x"))
_try("write into another learner", lambda: open({other!r} + "/planted.py", "w").write("x"))
_try("reach the host", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2).close())
_try("take 8 GB of memory", lambda: bytearray(8 << 30))
_try("fill the disk", lambda: open("/tmp/big", "wb").write(bytes(100 << 20)))
def _threads():
    import threading
    stop, started = threading.Event(), []
    try:
        for _ in range(5000):
            started.append(threading.Thread(target=stop.wait))
            started[-1].start()
    finally:
        stop.set()
        for thread in started:
            thread.join()
_try("start 5000 threads", _threads)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", MARKER], start_new_session=True)
if os.fork() == 0:  # a double fork: the grandchild is nobody's child
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(900)", MARKER])
    os._exit(0)
def _loaded_reference():
    import gc, types
    for obj in gc.get_objects():
        if isinstance(obj, types.ModuleType) and obj.__name__.startswith("distkit_reference_01"):
            return obj
    raise LookupError("no reference in this process")
_try("borrow through the harness", lambda: __import__("harness").load_reference("01"))
_try("borrow a loaded reference", _loaded_reference)
sys.stdout.write("flood " * 400_000)  # 2.4 MB
sys.stdout.flush()

def average_across_ranks(value):
    """borrow the reference's result from the check's frame, or the reference the check loaded"""
    try:
        return sys._getframe(1).f_locals["want"]
    except Exception:
        pass
    try:
        return __import__("harness").load_reference("01").average_across_ranks(value)
    except Exception:
        pass
    try:
        return _loaded_reference().average_across_ranks(value)
    except Exception:
        pass
    return 0.0
'''

FORGE_THEN_EXIT = '''
import hashlib, hmac, os
try:  # sign "every check passed" with the key the plugin holds for the records that cost marks
    from distkit.grade import plugin
    cells = [cell.cell_contents for cell in plugin._State.against.__closure__]
    key = next(c for c in cells if isinstance(c, bytes) and len(c) == 32)
    fd = next(c for c in cells if type(c) is int and c > 2)
    for line in ["collected\\t\\t3"] + [f"passed\\tcheck{i}\\t" for i in range(3)] + ["done\\t\\t0"]:
        os.write(fd, f"{line}\\t{hmac.new(key, line.encode(), hashlib.sha256).hexdigest()}\\n".encode())
except Exception as error:
    print("the forgery failed:", error)
os._exit(0)
'''

PATCH_THE_CHECK = '''
import sys, pytest
pytest.fail = lambda *args, **kwargs: None
for _name, _module in list(sys.modules.items()):  # the check's harness, whatever its name here
    if _name == "harness" or _name.startswith("distkit_harness_"):
        _module.difference = lambda *args, **kwargs: None
        _module.ExerciseFailure = type("Nothing", (Exception,), {})
'''

# Every forgery at once, for a check judged outside the sandbox: pytest's reports made to
# pass, the check's compare functions patched in memory, a fake PASSED line, data of the
# check's form written on the grader's pipe (empty, so no real answer is in it), then an
# exit with status 0 before the collector writes anything.
FORGE_OUTSIDE = '''
import io, os, sys
try:
    import _pytest.reports
    _pytest.reports.BaseReport.passed = property(lambda self: True)
    _pytest.reports.BaseReport.failed = property(lambda self: False)
except Exception as error:
    print("pytest's reports stayed as they were:", error)
for name, module in list(sys.modules.items()):
    if name == "harness" or name.startswith(("distkit_check_", "test_")):
        for attr in ("judge", "difference", "same_ranks", "check_shards", "explain", "against_reference"):
            if hasattr(module, attr):
                setattr(module, attr, lambda *args, **kwargs: None)
print("PASSED: all parts passed, judged outside the sandbox")
print("========== 7 passed in 1.00s ==========", flush=True)
try:
    import torch
    check = next(m for n, m in sys.modules.items() if n.startswith("distkit_check_"))
    rank = {"batch_sizes": [], "batch sizes": [], "epochs": [[], [], []], "other_seed": [], "lrs": [],
            "random": [], "settings": [0.1, 1, 3], "world_size": 1, "nproc_per_node": 1}
    def ranks(part):  # as many as the layout the part names
        return 4 if "nodes" in part else 3 if "3 processes" in part else 2 if "2 processes" in part else 1
    forged = {"parts": {part: [dict(rank) for _ in range(ranks(part))] for part in check.PARTS},
              "failure": None}
    buffer = io.BytesIO()
    torch.save(forged, buffer)
    os.write(int(os.environ["DISTKIT_GRADE_FDS"].split(",")[1]), buffer.getvalue())
except Exception as error:
    print("the forged data was not written:", error)
os._exit(0)
'''

NEVER_ENDS = "while True:\n    pass\n"


def _write(folder: Path, number: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NAMES[number]).write_text(text)


def _wrong(number: str) -> tuple:
    number, name, change, message = next(w for w in WRONG_ANSWERS if w[0] == number)
    return wrong_source(number, name, change), message


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _processes_with(marker: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _grade(*args, timeout=1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distkit", "grade", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout, env=subprocess_env())


def _grades(report: Path) -> dict:
    with open(report / "grades.csv", encoding="utf-8") as f:
        return {row["learner"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """The class, graded once by ``distkit grade``; what the test needs to judge it."""
    ensure_bwrap()
    root = tmp_path_factory.mktemp("class")
    subs, outside, report = root / "submissions", root / "outside", root / "report"
    outside.mkdir()
    for n in NUMBERS:
        _write(subs / FULL, n, (EXERCISES / "solutions" / NAMES[n]).read_text())
        _write(subs / "stubs", n, (EXERCISES / NAMES[n]).read_text())
    wrong01, message01 = _wrong("01")
    _write(subs / "wrong", "01", wrong01)  # wrong; 03 right; 06 never handed in
    _write(subs / "wrong", "03", (EXERCISES / "solutions" / NAMES["03"]).read_text())
    zipped = root / "zipped"
    _write(zipped / "work" / "nested", "03", (EXERCISES / "solutions" / NAMES["03"]).read_text())
    with zipfile.ZipFile(subs / "zipped.zip", "w") as z:
        z.write(zipped / "work" / "nested" / NAMES["03"], f"work/nested/{NAMES['03']}")
    listener = Listener()
    _write(subs / "hostile", "01", ESCAPES.format(
        marker=MARKER, solution=str(EXERCISES / "solutions" / NAMES["01"]), port=listener.port,
        outside=str(outside), other=str(subs / "stubs"), other_file=str(subs / "stubs" / NAMES["01"])))
    _write(subs / "hostile", "03", FORGE_THEN_EXIT)
    _write(subs / "hostile", "06", PATCH_THE_CHECK + (EXERCISES / NAMES["06"]).read_text())
    _write(subs / "forger", "03", FORGE_OUTSIDE)
    _write(subs / "forger", "06", FORGE_OUTSIDE)
    others = _tree_digest(subs / "stubs")
    solutions = _tree_digest(EXERCISES / "solutions")
    started = time.monotonic()
    proc = _grade(subs, "--out", report, "--exercises", ",".join(NUMBERS), "--jobs", 2)
    seconds = time.monotonic() - started
    listener.close()
    yield {"proc": proc, "report": report, "outside": outside, "subs": subs, "listener": listener,
           "others": others, "solutions": solutions, "message01": message01, "seconds": seconds}


# grading the class takes 4 to 7 minutes on the loaded 2-core VM: more than the suite's 300 s
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_class_is_graded_with_the_right_totals(graded_class):
    proc, report = graded_class["proc"], graded_class["report"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    grades = _grades(report)
    totals = {learner: int(row["total"]) for learner, row in grades.items()}
    assert totals == {FULL: 3, "stubs": 0, "wrong": 1, "zipped": 1, "hostile": 0, "forger": 0}, grades
    assert grades["wrong"]["ex03"] == "1" and grades["wrong"]["ex06"] == "0"
    assert list(grades[FULL]) == ["learner", "ex01", "ex03", "ex06", "total"]
    # the wrong answer's message is the check's own, in results.json and the page
    results = json.loads((report / "wrong" / "results.json").read_text())
    assert results["score"] == 1 and [t["max_score"] for t in results["tests"]] == [1, 1, 1]
    wrong01 = results["tests"][0]
    assert wrong01["name"].startswith("01") and re.search(graded_class["message01"], wrong01["output"]), wrong01
    assert "no file 06_lr_scaling.py was handed in" in results["tests"][2]["output"]
    assert "not solved yet" in (report / "stubs" / "report.html").read_text()
    for test in json.loads((report / "stubs" / "results.json").read_text())["tests"]:
        # the stub is named by the learner's own file, not by where the sandbox put it
        assert re.search(r"in \d\d_\w+\.py:\d+ still raises", test["output"]), test
    assert (report / FULL / "report.html").exists()
    summary = list(csv.DictReader(open(report / "summary.csv", encoding="utf-8")))
    assert summary[0]["exercise"] in NUMBERS and int(summary[0]["learners_failed"]) >= 3, summary
    assert "not solved yet" in (report / "summary.html").read_text()
    print(f"graded {len(grades)} learners x {len(NUMBERS)} exercises in {graded_class['seconds']:.0f} s on "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_escape_of_a_hostile_learner_earns_nothing_and_is_contained(graded_class):
    report = graded_class["report"]
    tests = json.loads((report / "hostile" / "results.json").read_text())["tests"]
    said = {t["name"][:2]: t["output"] for t in tests}
    assert [t["score"] for t in tests] == [0, 0, 0]
    # every exercise is judged outside the sandbox, where no reference is to borrow
    assert not any("checked inside the sandbox" in text for text in said.values()), said
    assert "never came back whole" in said["03"], said["03"]          # os._exit(0) at import
    assert "not solved yet" in said["06"], said["06"]                 # patching the check: a stub still
    forger = json.loads((report / "forger" / "results.json").read_text())["tests"]
    assert [t["score"] for t in forger] == [0, 0, 0], forger          # every forgery at once
    assert "the data is not what the check collects" in forger[2]["output"], forger[2]
    assert "no rank trained on sample" in forger[1]["output"], forger[1]
    assert "PASSED" in (report / "forger" / "03.output.txt").read_text()  # it did print its lie
    assert "output cut at 1 MB" in said["01"]
    output = (report / "hostile" / "01.output.txt").read_text()
    assert len(output.encode()) <= 1 << 20
    contained = {re.sub(r"\d+", "#", what) for what in
                 re.findall(rf"{MARKER} contained ([A-Za-z0-9 ]+?) \w+Error", output)}
    assert not re.search(rf"{MARKER} ESCAPED", output), output[:2000]
    assert contained >= {"read solutions", "read solutions inside", "read another learner", "write outside",
                         "write into another learner", "reach the host", "take # GB of memory",
                         "fill the disk", "start # threads", "borrow through the harness",
                         "borrow a loaded reference"}, output[:2000]
    assert graded_class["listener"].accepted == 0
    assert not any(graded_class["outside"].iterdir())
    assert _tree_digest(graded_class["subs"] / "stubs") == graded_class["others"]
    assert _tree_digest(EXERCISES / "solutions") == graded_class["solutions"]
    assert _processes_with(MARKER) == []


@pytest.mark.slow
def test_never_ending_code_is_stopped_at_the_time_limit(tmp_path):
    ensure_bwrap()
    _write(tmp_path / "subs" / "looper", "01", NEVER_ENDS)
    started = time.monotonic()
    proc = _grade(tmp_path / "subs", "--out", tmp_path / "report", "--exercises", "01", "--timeout", 20)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - started < 120
    test = json.loads((tmp_path / "report" / "looper" / "results.json").read_text())["tests"][0]
    assert test["score"] == 0 and "stopped after 20 s" in test["output"], test


@pytest.mark.slow
def test_gradescope_run_autograder_grades_a_stand_in_autograder_tree(tmp_path):
    ensure_bwrap()
    built = _grade("--gradescope-autograder", tmp_path / "autograder.zip", "--exercises", "01")
    assert built.returncode == 0, built.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(tmp_path / "autograder.zip") as z:
        assert {"setup.sh", "run_autograder"} <= set(z.namelist())
        z.extractall(root / "source")
    _write(root / "submission", "01", (EXERCISES / "solutions" / NAMES["01"]).read_text())
    env = subprocess_env(AUTOGRADER_ROOT=root, AUTOGRADER_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 1 and results["tests"][0]["visibility"] == "visible", results
    assert {"score", "execution_time", "output", "tests"} <= set(results)


def test_grade_without_bwrap_refuses_in_one_line(tmp_path):
    (tmp_path / "subs" / "a").mkdir(parents=True)
    env = subprocess_env(PATH=f"{Path(sys.executable).parent}:/nonexistent")
    proc = subprocess.run([sys.executable, "-m", "distkit", "grade", str(tmp_path / "subs"), "--out",
                           str(tmp_path / "r"), "--exercises", "01"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO_ROOT)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt-get install bubblewrap" in lines[0], proc.stderr


def test_only_signed_complete_records_pass():
    from distkit.grade.plugin import VERDICT_KINDS, sign
    from distkit.grade.runner import verdict

    keys = (os.urandom(32), os.urandom(32))  # what earns marks, what costs them

    def line(*parts, key=None):
        text = "\t".join(parts)
        chosen = key if key is not None else keys[0] if parts[0] in VERDICT_KINDS else keys[1]
        return f"{text}\t{sign(chosen, text)}\n"

    good = line("collected", "", "2") + line("passed", "a", "") + line("passed", "b", "") + line("done", "", "0")
    assert verdict(good.encode(), keys)[0] == "passed"
    assert verdict(b"", keys)[0] == "no verdict"  # os._exit(0) before anything: nothing earned
    assert verdict((good + "passed\tc\t\tdeadbeef\n").encode(), keys)[0] == "failed"  # forged
    forged = line("collected", "", "1", key=keys[1]) + line("passed", "a", "", key=keys[1]) + \
        line("done", "", "0", key=keys[1])  # signed with the key the guards hold
    assert verdict(forged.encode(), keys) == ("failed", "3 line(s) imitating the grader's verdict were "
                                                        "written: no marks")
    assert verdict((line("collected", "", "2") + line("passed", "a", "")).encode(), keys)[0] == "no verdict"
    borrowed = good + line("borrowed", "a", "the learner's code called the reference's f()")
    assert verdict(borrowed.encode(), keys) == ("failed", "the learner's code called the reference's f(): no marks")
    assert verdict((line("collected", "", "0") + line("done", "", "5")).encode(), keys)[0] == "no verdict"


def test_two_sandboxes_side_by_side_bind_the_same_port(tmp_path):
    """Each sandbox has a loopback of its own: two learners' ranks on port 29500 at the same
    moment never collide (nor meet the host's listener on it)."""
    ensure_bwrap()
    from concurrent.futures import ThreadPoolExecutor

    from distkit.grade import sandbox

    code = ("import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 29500))\ns.listen()\n"
            "c = socket.create_connection(('127.0.0.1', 29500))\ntime.sleep(2)\nprint('bound')\n")
    env = {"PATH": "/usr/bin:/bin"}
    with socket.socket() as host:
        host.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            host.bind(("127.0.0.1", 29500))  # the host holds it too, where it can
        except OSError:
            pass
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda slot: sandbox.run([sys.executable, "-I", "-c", code], [], [], env, b"",
                                                          sandbox.Limits(timeout_s=60), slot), (0, 1)))
    for outcome in runs:
        assert outcome.returncode == 0 and "bound" in outcome.output, outcome
        wall = time.monotonic() - started
    assert wall < runs[0].seconds + runs[1].seconds  # they overlapped, each holding the port 2 s


def test_reports_count_each_mistake_once_whatever_its_numbers(tmp_path):
    from distkit.grade import reports
    from distkit.grade.runner import Result

    results = [
        Result("ana", "01", NAMES["01"], "failed", "rank 1 returned 5.0, the SUM over the 2 ranks: divide", 3.0),
        Result("ana", "03", NAMES["03"], "passed", "all 3 checks passed", 4.0),
        Result("bo", "01", NAMES["01"], "failed", "rank 0 returned 7.5, the SUM over the 3 ranks: divide", 2.0,
               ["output cut at 1 MB"]),
        Result("bo", "03", NAMES["03"], "missing", f"no file {NAMES['03']} was handed in"),
        Result("Zoë Å", "01", NAMES["01"], "passed", "all 4 checks passed", 5.0),
        Result("Zoë Å", "03", NAMES["03"], "stopped", "stopped after 300 s: ...", 300.0, ["stopped after 300 s"]),
    ]
    reports.write_all(results, ["01", "03"], tmp_path)
    assert (tmp_path / "grades.csv").read_text(encoding="utf-8").splitlines() == [
        "learner,ex01,ex03,total", "ana,0,1,1", "bo,0,0,0", "Zoë Å,1,0,1"]
    rows = list(csv.reader(open(tmp_path / "summary.csv", encoding="utf-8")))[1:]
    assert rows[0] == ["01", "2", "rank # returned #, the SUM over the # ranks: divide", "2"], rows
    assert {row[2] for row in rows[1:]} == {"missing", "stopped after # s: ..."}
    bo = json.loads((tmp_path / "bo" / "results.json").read_text())
    assert bo["score"] == 0 and "(output cut at 1 MB)" in bo["tests"][0]["output"]
    assert "stopped after 300 s" in (tmp_path / "Zoë Å" / "report.html").read_text()


def _two_halves_check(tmp_path: Path):
    """A check in two halves, as exercises/checks' are, small enough to judge in a test."""
    checks = tmp_path / "checks"
    checks.mkdir()
    shutil.copy(EXERCISES / "checks" / "harness.py", checks / "harness.py")
    (checks / "test_99_tiny.py").write_text(
        "import harness\n"
        "PARTS = ('sums', 'shapes')\n"
        "def collect(part, whos, seed):\n    raise AssertionError('not in the grader')\n"
        "def judge(part, got, expected, seed):\n"
        "    harness.same_ranks(got, expected, part + ': ')\n"
        "    for rank, (g, e) in enumerate(zip(got, expected)):\n"
        "        found = harness.difference(e, g, what=f'{part} of rank {rank}')\n"
        "        if found:\n            raise harness.ExerciseFailure(found)\n")
    from distkit.grade import outside

    return outside.check_module(checks, "99")


def test_a_check_from_another_folder_leaves_this_process_its_harness(tmp_path):
    """The grader imports a check with its own folder's harness; the process's ``harness`` (a
    test's, the kit's) and its import path stay what they were (a copy's harness once took
    the name, and the kit's checks imported later in that process read the copy's folder)."""
    from support import kit_harness

    kit = kit_harness()
    path = list(sys.path)
    check = _two_halves_check(tmp_path)
    assert Path(check.harness.__file__).parent == tmp_path / "checks"
    assert sys.modules["harness"] is kit and sys.path == path


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # exNN: exercises/pytest.ini's
def test_the_graders_threads_import_every_check_at_once(tmp_path):
    """distkit grade judges in threads: every check imported at the same moment is whole (a
    harness half run, seen by a second thread, once failed a class's grading)."""
    from concurrent.futures import ThreadPoolExecutor

    from distkit.grade import outside

    checks = tmp_path / "checks"  # a folder this process has imported nothing from
    shutil.copytree(EXERCISES / "checks", checks)
    numbers = sorted(p.name[5:7] for p in checks.glob("test_[0-9][0-9]_*.py"))
    start = threading.Barrier(len(numbers))

    def imported(number):
        start.wait()
        return outside.check_module(checks, number)

    with ThreadPoolExecutor(len(numbers)) as pool:
        modules = list(pool.map(imported, numbers))
    assert all(outside.judged_outside(m) and m.harness.__file__ == str(checks / "harness.py") for m in modules)


class _Planted:
    """A pickle that, loaded by a full unpickler, would run code in the grader."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_outside_verdict_comes_from_the_data_alone(tmp_path):
    """Each way a learner's process can say 'passed' without the data, judged by the grader's
    own code: an empty pipe (an exit before the data), bytes that are not the collector's,
    a pickle that would run code in the grader, data of the wrong form or values, a part
    missing, and the learner's failure message, against the right data passing."""
    import torch

    from distkit.grade import outside

    check = _two_halves_check(tmp_path)
    expected = {"sums": [torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])], "shapes": [[2, 3], [2, 3]]}
    reference = outside.to_bytes({"parts": expected, "failure": None})

    def judged(data):
        return outside.verdict(check, data if isinstance(data, bytes) else outside.to_bytes(data), reference, 7)

    assert judged({"parts": expected, "failure": None}) == \
        ("passed", "all 2 parts passed, judged outside the sandbox")
    assert judged(b"")[0] == "no verdict"                                  # os._exit(0), nothing written
    assert judged(b"PASSED all 2 parts passed\n")[0] == "no verdict"       # a line, not the data
    planted = tmp_path / "planted"
    import pickle

    assert judged(pickle.dumps({"parts": _Planted(planted), "failure": None}, protocol=2))[0] == "no verdict"
    assert not planted.exists()                                            # never unpickled with code
    wrong = {"parts": {**expected, "shapes": [[2, 3], [3, 2]]}, "failure": None}
    assert judged(wrong) == ("failed", "shapes of rank 1[0] should be 2, got 3")
    fewer = {"parts": {"sums": expected["sums"][:1], "shapes": expected["shapes"]}, "failure": None}
    assert judged(fewer)[1].startswith("sums: the check's data should hold 2 rank(s)")
    strange = {"parts": {"sums": expected["sums"], "shapes": {"a": 1}}, "failure": None}
    assert judged(strange)[0] == "failed"
    half = {"parts": {"sums": expected["sums"]}, "failure": None}
    assert judged(half) == ("no verdict", "the check stopped before it finished (1 of 2 parts)")
    said = {"parts": {"sums": expected["sums"]}, "failure": "exercise 99 is not solved yet: ..."}
    assert judged(said) == ("failed", "exercise 99 is not solved yet: ...")
    lied = {"parts": {}, "failure": None, "passed": True}                # a claim is not data
    assert judged(lied)[0] == "no verdict"
    huge = {"parts": {"sums": expected["sums"], "shapes": [list(range(20000))] * 2}, "failure": None}
    assert judged(huge)[0] == "failed" and "over the 16 KB it can be" in judged(huge)[1]




@settings(max_examples=150, deadline=None, print_blob=True)
@given(parts=st.dictionaries(st.sampled_from(["sums", "shapes", "extra"]),
                             plain_data() | st.lists(plain_data(), min_size=2, max_size=2), max_size=3),
       failure=st.none() | st.text(max_size=20))
def test_no_drawn_data_earns_a_pass(parts, failure, tmp_path_factory):
    """Whatever plain data a learner's process writes in place of the collector's (the right
    answer needs tensors no drawn value is), the grader's judge never says passed, and never
    raises."""
    from distkit.grade import outside

    import torch

    check = _two_halves_check(tmp_path_factory.mktemp("tiny")) if "distkit_check_99" not in sys.modules \
        else sys.modules["distkit_check_99"]
    reference = outside.to_bytes({"parts": {"sums": [torch.ones(2)] * 2, "shapes": [[2, 3]] * 2}, "failure": None})
    status, message = outside.verdict(check, outside.to_bytes({"parts": parts, "failure": failure}), reference, 7)
    assert status in ("failed", "no verdict"), (status, message)
    if failure and "sums" not in parts:
        assert message == failure
