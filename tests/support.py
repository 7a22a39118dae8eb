"""What tests share besides fixtures: where the repository is, the environment of the
processes a test starts, and bounds that stretch on a loaded machine. Tests import it
(``from support import REPO_ROOT``); tests/conftest.py holds the fixtures and hooks."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS = REPO_ROOT / "tests"


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


@functools.cache
def startup_seconds() -> float:
    """Wall seconds a fresh ``python -c "import torch, ignite.distributed, distkit.train.training"``
    takes on this machine now (measured once per test process): what every CLI call pays
    before its first line of work. It is about 5 s on the quiet 2-core VM and several times
    that when other jobs share the cores, so bounds on "within seconds" scale with it."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, ignite.distributed, distkit.train.training"],
                   env=subprocess_env(), capture_output=True, timeout=600)
    return time.monotonic() - start


def within_seconds(quiet_s: float = 30) -> float:
    """A bound for "fails within seconds": ``quiet_s`` on a quiet machine, stretched on a
    loaded one, by whichever says more: the load average now over the cores (a 2-core
    machine at load 10 runs each process at about a fifth of its speed), or 6 times what
    starting Python with torch took here (measured once). A hang still fails it; a loaded
    machine no longer does."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = max(1.0, os.getloadavg()[0] / cores)
    return max(quiet_s * busy, 6 * startup_seconds())


def checkout_copy(dest: Path, tree: bool = False) -> Path:
    """What pip needs to build distkit from this working tree, copied to ``dest`` (a build
    in the checkout itself would leave build/ behind in it); ``tree=True``: the whole
    working tree (tests, notebooks, exercises ...), less what git ignores."""
    dest.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".git", ".venv", "venv", "build", "dist",
                                  "runs", ".pytest_cache", ".ipynb_checkpoints")
    if tree:
        shutil.copytree(REPO_ROOT, dest, ignore=skip, dirs_exist_ok=True, symlinks=True)
        return dest
    for name in ("pyproject.toml", "README.md", "LICENSE", "requirements.txt"):
        shutil.copy(REPO_ROOT / name, dest / name)
    shutil.copytree(REPO_ROOT / "src", dest / "src", ignore=skip)
    return dest


# --- two "nodes" of distkit train on this machine -------------------------------------

def two_nodes(tmp_path, node0_args, node1_args, timeout=150, env=None):
    """``distkit train`` as node 0 and node 1 of 2 on 127.0.0.1: each node's (exit code,
    stdout, stderr). The arguments given win over the defaults here (a later flag wins, so
    ``--nproc-per-node 2`` or another ``--output-dir`` may be given); ``env``: the launchers'
    environment (default ``subprocess_env()``)."""
    from distkit.host.facts import free_port

    port = free_port()
    procs = []
    for node, args in ((0, node0_args), (1, node1_args)):
        cmd = [sys.executable, "-m", "distkit", "train", "--nnodes", "2", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1",
               "--no-progress", "--epochs", "1", "--output-dir", str(tmp_path / "runs"),
               "--timeout", "60", *map(str, args)]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env or subprocess_env(), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True))  # a node's signals stay on it
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


# --- what a command's refusal looks like ----------------------------------------------

def assert_one_line_error(result, *words, tmp_path=None):
    assert result.returncode != 0, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("distkit: error:")]
    assert len(errors) == 1, result.stderr
    assert lines[-1] == errors[0], f"the error must be the last thing printed:\n{result.stderr}"
    for word in words:
        assert word in errors[0], errors[0]
    assert "Traceback" not in result.stderr
    assert "--timeout-s" not in result.stderr  # the field is timeout_s; the flag is --timeout
    if tmp_path is not None:
        assert not (tmp_path / "runs").exists(), "a failed start must not leave a run folder"


# --- the documented examples: ```python blocks, each named ``# file: NAME.py`` ---------

FILE = re.compile(r"^# file: (\w+\.py)")


def python_blocks(text: str) -> list:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def script_files(doc: Path) -> dict:
    files = {}
    for block in python_blocks(doc.read_text()):
        m = FILE.match(block)
        assert m, f"{doc.name}: a python block without '# file: NAME.py' would go untested:\n{block[:200]}"
        files[m.group(1)] = block
    return files


# --- what Colab has before a notebook's first cell ------------------------------------

COLAB_PREINSTALLED = ["torch==2.9.0", "torchvision==0.24.0", "matplotlib", "scikit-learn", "tqdm",
                      "ipykernel", "nbclient", "nbformat"]


# --- an exercise's check module, imported into a test's own process ------------------------

def kit_harness():
    """``exercises/checks/harness.py``, imported as ``harness``: the name the checks import it
    by, so the ``harness.ExerciseFailure`` a test catches is the one its checks raise."""
    checks = str(REPO_ROOT / "exercises" / "checks")
    sys.path.insert(0, checks)
    try:
        import harness

        return harness
    finally:
        sys.path.remove(checks)


def kit_check(number: str):
    """Exercise ``number``'s check (``exercises/checks/test_NN_*.py``) as a module of this
    process, imported as the grader imports it (its tests then grade answers in milliseconds
    instead of a pytest subprocess each)."""
    import warnings

    import pytest

    from distkit.grade.outside import check_module

    kit_harness()
    with warnings.catch_warnings():  # its exNN mark is registered in exercises/pytest.ini only
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        return check_module(REPO_ROOT / "exercises" / "checks", number)


# --- a check in two halves: data the grader's judge must never accept ----------------------

def judged_outside(check, part: str, got, expected, seed: int) -> str:
    """``"passed"`` or ``"failed"``: the grader's verdict on one part of a check in two halves,
    the learner's data ``got`` read back as the grader reads it (:func:`distkit.grade.outside.verdict`
    judges the parts in order; this judges one, in a fraction of the time)."""
    from distkit.grade import outside

    got = outside.from_bytes(outside.to_bytes({"parts": {part: got}}))["parts"][part]
    try:
        check.judge(part, got, expected, seed)
    except Exception:  # noqa: BLE001 - the verdict's "failed", whatever the judge raised
        return "failed"
    return "passed"


def plain_data():
    """Hypothesis: any plain data a learner's process could write in place of an answer's."""
    from hypothesis import strategies as st

    leaf = st.none() | st.booleans() | st.integers(-3, 60) | st.floats() | st.text(max_size=6)
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)


def outcomes():
    """Hypothesis: what ``harness.outcome`` gives, with drawn contents (or anything else)."""
    from hypothesis import strategies as st

    raised = st.fixed_dictionaries({"raised": st.text(max_size=12), "text": st.text(max_size=8),
                                    "classes": st.lists(st.sampled_from(["ValueError", "Exception", "x"]), max_size=3),
                                    "message": st.text(max_size=20)})
    return st.fixed_dictionaries({"returned": plain_data()}) | raised | plain_data()


def as_lists(value):
    """``value`` with its tuples as lists: two data that differ only there may be judged alike."""
    if isinstance(value, (list, tuple)):
        return [as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: as_lists(v) for k, v in value.items()}
    return value


def solutions_data(number: str, seed: int) -> tuple:
    """``(check, {part: the solution's data}, {part: the reference's data})`` for exercise
    ``number``, each part collected as ``distkit check`` collects it (both answers in the
    same real processes), on the checks' seed ``seed``."""
    import pytest

    check = kit_check(number)
    harness = check.harness
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("DISTKIT_EXERCISES", "solutions")
        data = {part: check.collect(part, (harness.LEARNER, harness.REFERENCE), seed) for part in check.PARTS}
    return (check, {p: d[harness.LEARNER] for p, d in data.items()},
            {p: d[harness.REFERENCE] for p, d in data.items()})
