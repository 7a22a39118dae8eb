"""The shell: distkit --version, bare distkit, torchrun-style aliases, help text, and a
--help that does not import torch."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import subprocess_env
from distkit import __version__
from distkit.commands import COMMANDS, build_parser
from distkit.commands.train import config_from_args


def distkit(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "distkit", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=timeout)


def test_version_prints_the_package_version():
    out = distkit("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"distkit {__version__}"
    from importlib.metadata import version

    assert version("distkit") == __version__  # pyproject reads it from distkit.__version__


def test_bare_distkit_prints_help_and_exits_0():
    out = distkit()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: distkit")
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", out.stdout, re.M), f"{name} missing from:\n{out.stdout}"
    assert out.stdout == distkit("--help").stdout


def test_torchrun_spellings_are_aliases():
    torchrun = ["--nproc_per_node", "3", "--nnodes", "2", "--node_rank", "1",
                "--master_addr", "10.0.0.1", "--master_port", "29501"]
    ours = [a.replace("_", "-") if a.startswith("--") else a for a in torchrun]
    configs = [config_from_args(build_parser().parse_args(["train", *argv])) for argv in (torchrun, ours)]
    assert configs[0] == configs[1]
    assert (configs[0].nproc_per_node, configs[0].node_rank, configs[0].master_addr,
            configs[0].master_port) == (3, 1, "10.0.0.1", 29501)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_is_plain_text_and_shows_defaults_once(command):
    out = distkit(command, "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines anywhere
    assert "``" not in text and ":class:" not in text and ":func:" not in text
    # an on/off flag never shows "default: True/False" (--no-progress (default: True) misled)
    assert not re.search(r"default: (True|False|None)\b", text), text
    assert not re.search(r"\(default: [^)]*\)[^-]*\(default:", text), "a default shown twice"


def test_train_help_shows_every_default_value():
    text = " ".join(distkit("train", "--help").stdout.split())
    for flag, default in [("--epochs", "10"), ("--batch-size", "64"), ("--nnodes", "1"), ("--lr", "0.05"),
                          ("--backend", "auto"), ("--output-dir", "runs"), ("--timeout", "120.0")]:
        # from the flag to its default without crossing the next option
        assert re.search(rf"{flag} \S+ (?:(?! --).)*?default: {re.escape(default)}(\)| |$)", text), (flag, text)


def test_help_imports_no_torch():
    """Building the whole parser (every sub-command's options) stays light: torch, ignite,
    numpy are imported by a command's main, when it runs."""
    code = ("import sys; from distkit.commands import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'ignite', 'numpy', 'matplotlib', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
