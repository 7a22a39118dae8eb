"""Shared fixtures (run the real CLI in a subprocess, small fast configs) and the suite's
hooks; what tests share besides fixtures is in tests/support.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support import subprocess_env

# A run started as a shell's background job (`pytest &`, a CI script's `cmd &`) has SIGINT
# ignored, and every process a test starts would inherit that: Python keeps an ignored
# SIGINT ignored, so a test's Ctrl-C would reach nothing. The tests mean a terminal's
# Ctrl-C; a handler here (reset to the default in each child at exec) gives them that.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
