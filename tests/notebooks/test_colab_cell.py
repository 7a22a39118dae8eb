"""The notebooks' install cell (scripts/build_notebooks.py), run as written, in IPython, in
a Python that cannot see distkit (as a fresh Colab runtime): from the repository's address
(a local bare git repository standing in for the public one, ``git+file://...@main``) it
installs the kit, saying each step before it takes it and keeping the runtime's torch; a
torch older than the kit's floor is one line that says how to let pip replace it, and
with that switch on the cell goes ahead; with no repository named and nothing uploaded it
stops in one line saying to set the address; with a wheel built by one command and put in
its folder (Colab: uploaded to the session) it installs it; a wheel pip cannot install is
one line too. The whole route in the Colab-like environment, with torch 2.9 and a
training run: tests/scripts/test_scripts.py.

How distkit is hidden: this venv's site-packages is given on PYTHONPATH to ``python -S``,
which does not process .pth files, so the venv's editable distkit is not importable while
IPython and pip are. pip installs into a folder of the test (PIP_TARGET, listed first on
PYTHONPATH), without dependencies or the network (PIP_NO_DEPS, PIP_NO_INDEX): this venv
is never changed."""
from __future__ import annotations

import re
import site
import subprocess
import sys

import pytest

from support import REPO_ROOT, checkout_copy, subprocess_env

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import build_notebooks  # noqa: E402

PLACEHOLDER = f"https://github.com/{build_notebooks.PLACEHOLDER_OWNER}/distkit"


def run_cell(cell: str, folder, then: str = ""):
    """``cell`` (and ``then``) in IPython, in ``folder``, where distkit is not installed."""
    target = folder / "target"
    target.mkdir(exist_ok=True)
    env = {k: v for k, v in subprocess_env().items()
           if not k.startswith(("PYTHONPATH", "DISTKIT_INSTALL_SPEC", "PIP_", "VIRTUAL_ENV"))}
    # no build isolation: pip builds a git checkout with this Python's setuptools, not one
    # it would fetch from the index
    env.update(PYTHONPATH=f"{target}:{':'.join(site.getsitepackages())}", PIP_TARGET=str(target),
               PIP_NO_DEPS="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_BUILD_ISOLATION="0")  # sic: pip reads this variable inverted ("0": no isolation)
    return subprocess.run([sys.executable, "-S", "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor",
                           "-c", cell + "\n" + then], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


def test_distkit_is_hidden_from_the_cell(tmp_path):
    out = run_cell("import importlib.util; print('FOUND', importlib.util.find_spec('distkit'))", tmp_path)
    assert "FOUND None" in out.stdout, out.stdout + out.stderr


def shown_lines(out) -> list[str]:
    return [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]


def test_unpublished_and_nothing_uploaded_is_one_line_saying_to_set_the_address(tmp_path):
    cell = build_notebooks.install_cell(PLACEHOLDER)
    assert "REPO_URL = None" in cell and "git+" not in cell.split("REPO_URL = None")[1].split("\n")[0]
    lines = shown_lines(run_cell(cell, tmp_path))
    assert len(lines) == 1, lines
    assert lines[0].startswith("InstallError: distkit is not installed and this copy names no repository to install "
                               "it from: set REPO_URL above to the course's repository, or upload a wheel"), lines
    assert "docs/colab.md" in lines[0]


def test_a_published_repository_is_what_the_cell_installs_from():
    cell = build_notebooks.install_cell("https://github.com/someone/fork")
    assert 'REPO_URL = "https://github.com/someone/fork"' in cell
    assert cell.count("\n") == build_notebooks.install_cell(PLACEHOLDER).count("\n")  # same cell, one line differs


@pytest.fixture(scope="module")
def bare_repository(tmp_path_factory):
    """A bare git repository standing in for the public one: ``git clone --bare`` of this
    checkout, its ``main`` set to this checkout's commit (what the cell installs is the
    code under test). Its address: file:///.../distkit.git."""
    bare = tmp_path_factory.mktemp("public") / "distkit.git"
    for command in (["git", "clone", "-q", "--bare", str(REPO_ROOT), str(bare)],
                    ["git", "-C", str(bare), "update-ref", "refs/heads/main",
                     subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()]):
        subprocess.run(command, check=True, capture_output=True, timeout=300)
    return f"file://{bare}"


@pytest.mark.slow
def test_the_cell_installs_from_the_repository_address_saying_each_step(tmp_path, bare_repository):
    from importlib.metadata import version

    cell = build_notebooks.install_cell(bare_repository)
    out = run_cell(cell, tmp_path, then="import distkit; print('INSTALLED', distkit.__file__)")
    lines = shown_lines(out)
    assert out.returncode == 0, lines[-20:]
    steps = [i for i, ln in enumerate(lines) if re.match(r"\[\d/3\]", ln)]
    assert [lines[i][:5] for i in steps] == ["[1/3]", "[2/3]", "[3/3]"], lines
    assert lines[steps[0]] == f"[1/3] torch {version('torch')}: kept", lines  # the runtime's torch stays
    assert lines[steps[1]].startswith(f"[2/3] pip install git+{bare_repository}@main"), lines
    # while pip works, its own steps are shown, between the two lines that frame them
    between = lines[steps[1] + 1:steps[2]]
    assert any(ln.strip().startswith("Successfully installed distkit") for ln in between), between
    assert re.match(r"\[3/3\] distkit \S+ installed", lines[steps[2]]), lines
    (installed,) = [ln for ln in lines if ln.startswith("INSTALLED")]
    assert installed.split()[1].startswith(str(tmp_path / "target" / "distkit")), installed


def fake_old_torch(folder, version="2.5.1"):
    """A torch older than the kit's floor, as the cell sees it: a package and its
    metadata first on the path."""
    target = folder / "target"
    (target / "torch").mkdir(parents=True)
    (target / "torch" / "__init__.py").write_text("")
    meta = target / f"torch-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")


def test_an_old_torch_is_one_line_saying_how_to_let_pip_replace_it(tmp_path, bare_repository):
    fake_old_torch(tmp_path)
    lines = shown_lines(run_cell(build_notebooks.install_cell(bare_repository), tmp_path))
    floor = build_notebooks.torch_floor()
    assert lines == [f"InstallError: this runtime's torch 2.5.1 is older than {floor}, which distkit needs: set "
                     "UPGRADE_TORCH = True at the top of this cell and run it again (pip installs a newer torch, "
                     "about 2 GB), or pick a newer runtime"], lines


@pytest.mark.slow
def test_with_upgrade_torch_the_cell_unpins_torch_and_says_to_restart(tmp_path, bare_repository):
    """The way round an old torch: the cell no longer pins it (pip may replace it; here
    pip installs no dependencies, so the old one stays) and ends saying to restart."""
    fake_old_torch(tmp_path)
    cell = build_notebooks.install_cell(bare_repository).replace("UPGRADE_TORCH = False", "UPGRADE_TORCH = True", 1)
    out = run_cell(cell, tmp_path)
    lines = shown_lines(out)
    assert out.returncode == 0, lines[-20:]
    floor = build_notebooks.torch_floor()
    assert f"[1/3] torch 2.5.1: pip installs torch >= {floor}" in lines, lines
    assert lines[-1].startswith("[3/3] distkit ") and lines[-1].endswith(
        "restart the runtime (Runtime > Restart session), then run the notebook"), lines


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
    lines = shown_lines(run_cell(build_notebooks.install_cell(PLACEHOLDER), tmp_path))
    # the steps it took, then one line for what failed
    assert lines[-1].startswith("InstallError: pip could not install distkit-9.9.9-py3-none-any.whl: "), lines
    assert sum(ln.startswith("InstallError") for ln in lines) == 1 and lines[0].startswith("[1/3]"), lines
