"""Shared fixtures: run the real CLI in a subprocess, and small fast configs."""
from __future__ import annotations

import functools
import os
import shutil
import time
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


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


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core, at most 4. Many tests start
    2-4 processes of their own; more workers than that would only oversubscribe."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


def pytest_addoption(parser):
    parser.addoption(
        "--no-side-envs", action="store_true",
        help="skip the tests that build (or reuse) a Python environment beside this one: the "
             "torch-xla one, the Colab-like one, the GPU-machine stand-in and the fresh venv of the "
             "README's commands (each skip names the environment and its cost; -rs prints them)")


def pytest_collection_modifyitems(config, items):
    """``side_env`` tests are skipped under ``--no-side-envs``, each saying what it would
    build; tests marked ``gpu`` need an NVIDIA GPU: without one they are skipped, and say why."""
    if config.getoption("--no-side-envs"):
        for item in items:
            marker = item.get_closest_marker("side_env")
            if marker:
                item.add_marker(pytest.mark.skip(reason=f"--no-side-envs: builds {marker.args[0]}"))
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here (torch.cuda.is_available() is False): "
                                   "run pytest -m gpu or scripts/gpu_check.sh on a machine with one")
    for item in gpu_tests:
        item.add_marker(skip)


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


@pytest.fixture
def run_cli(tmp_path):
    """Run ``python -m distkit ARGS`` in tmp_path; returns the CompletedProcess."""

    def _run(*args, timeout=120, env=None, cwd=None):
        return subprocess.run(
            [sys.executable, "-m", "distkit", *map(str, args)], cwd=cwd or tmp_path,
            env=subprocess_env(**(env or {})), capture_output=True, text=True, timeout=timeout)

    return _run


@pytest.fixture
def fast_config(tmp_path):
    """A Config that trains for seconds, writing under tmp_path."""
    from distkit.config import Config

    def _make(**changes):
        base = dict(epochs=2, progress_bar=False, output_dir=str(tmp_path / "runs"),
                    threads_per_process=1)
        base.update(changes)
        return Config(**base)

    return _make
