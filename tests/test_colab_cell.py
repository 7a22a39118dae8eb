"""The notebooks' install cell (scripts/build_notebooks.py), run as written, in IPython, in
a Python that cannot see distkit (as a fresh Colab runtime): with no published repository
and nothing uploaded it stops in one line that says how to install; with a wheel built by
one command and put in its folder (Colab: uploaded to the session) it installs it; a wheel
pip cannot install is one line too. The whole route in the Colab-like environment, with
torch 2.9 and a training run: tests/test_scripts.py.

How distkit is hidden: this venv's site-packages is given on PYTHONPATH to ``python -S``,
which does not process .pth files, so the venv's editable distkit is not importable while
IPython and pip are. pip installs into a folder of the test (PIP_TARGET, listed first on
PYTHONPATH), without dependencies or the network (PIP_NO_DEPS, PIP_NO_INDEX): this venv
is never changed."""
from __future__ import annotations

import site
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, checkout_copy, subprocess_env

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import build_notebooks  # noqa: E402

PLACEHOLDER = f"https://github.com/{build_notebooks.PLACEHOLDER_OWNER}/distkit"


def run_cell(cell: str, folder, then: str = ""):
    """``cell`` (and ``then``) in IPython, in ``folder``, where distkit is not installed."""
    target = folder / "target"
    target.mkdir(exist_ok=True)
    env = {k: v for k, v in subprocess_env().items()
           if not k.startswith(("PYTHONPATH", "DISTKIT_INSTALL_SPEC", "PIP_", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=f"{target}:{':'.join(site.getsitepackages())}", PIP_TARGET=str(target),
               PIP_NO_DEPS="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-S", "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor",
                           "-c", cell + "\n" + then], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


def test_distkit_is_hidden_from_the_cell(tmp_path):
    out = run_cell("import importlib.util; print('FOUND', importlib.util.find_spec('distkit'))", tmp_path)
    assert "FOUND None" in out.stdout, out.stdout + out.stderr


def test_unpublished_and_nothing_uploaded_is_one_line_saying_how_to_install(tmp_path):
    cell = build_notebooks.install_cell(PLACEHOLDER)
    assert "REPO_URL = None" in cell and "git+" not in cell.split("REPO_URL = None")[1].split("\n")[0]
    out = run_cell(cell, tmp_path)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("InstallError: distkit is not installed and this copy names no published "
                               "repository: in a clone, run `pip wheel --no-deps -w dist .`, upload"), lines
    assert "docs/colab.md" in lines[0]


def test_a_published_repository_is_what_the_cell_installs_from():
    cell = build_notebooks.install_cell("https://github.com/someone/fork")
    assert 'REPO_URL = "https://github.com/someone/fork"' in cell
    assert cell.count("\n") == build_notebooks.install_cell(PLACEHOLDER).count("\n")  # same cell, one line differs


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """``pip wheel --no-deps -w dist .`` in a copy of this tree: docs/colab.md's one command."""
    tmp = tmp_path_factory.mktemp("colab-wheel")
    copy = checkout_copy(tmp / "clone")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", "."], cwd=copy,
                         capture_output=True, text=True, timeout=800, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    (built,) = (copy / "dist").glob("distkit-*.whl")
    return built


@pytest.mark.slow
def test_an_uploaded_wheel_is_installed_by_the_unchanged_cell(tmp_path, wheel):
    (tmp_path / wheel.name).write_bytes(wheel.read_bytes())  # "uploaded" to the session's folder
    out = run_cell(build_notebooks.install_cell(PLACEHOLDER), tmp_path,
                   then="import distkit; print('INSTALLED', distkit.__version__, distkit.__file__)")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("INSTALLED")]
    assert line.split()[2].startswith(str(tmp_path / "target" / "distkit")), line  # from the wheel, this session


@pytest.mark.slow
def test_a_wheel_pip_cannot_install_is_one_line(tmp_path):
    (tmp_path / "distkit-9.9.9-py3-none-any.whl").write_bytes(b"not a zip archive")
    out = run_cell(build_notebooks.install_cell(PLACEHOLDER), tmp_path)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("InstallError: pip could not install distkit-9.9.9-py3-none-any.whl: "), lines
