"""What tests share besides fixtures: where the repository is, the environment of the
processes a test starts, and bounds that stretch on a loaded machine. Tests import it
(``from support import REPO_ROOT``); tests/conftest.py holds the fixtures and hooks."""
from __future__ import annotations

import functools
import os
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
