"""What `pip install distkit` brings, and the metadata a package index shows.

How "a fresh venv from ``pip install -e .`` has no jupyter" is shown: pip itself resolves
the install as if into an empty environment (``--dry-run --ignore-installed --report``),
with the real index, and the test reads the list of distributions pip would install. This
is the same resolution a fresh venv gets, without downloading 5 GB of torch wheels; the
report also carries distkit's own built metadata (Requires-Dist, license, URLs)."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO_ROOT, subprocess_env

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
NOTEBOOK_STACK = {"jupyter", "notebook", "jupyterlab", "jupyter-server", "ipykernel", "ipython",
                  "nbclient", "nbconvert", "ipywidgets"}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def install_report(tmp_path_factory):
    report = tmp_path_factory.mktemp("pip") / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-e", str(REPO_ROOT)],
        capture_output=True, text=True, timeout=240, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_plain_install_resolves_no_jupyter_and_keeps_the_runtime(install_report):
    names = {_norm(i["metadata"]["name"]) for i in install_report["install"]}
    assert {"distkit", "torch", "torchvision", "pytorch-ignite", "matplotlib", "scikit-learn", "tqdm"} <= names
    assert not names & NOTEBOOK_STACK, f"pip install -e . would install {sorted(names & NOTEBOOK_STACK)}"
    assert not {n for n in names if n.startswith("jupyter")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_built_metadata_names_license_urls_and_extras(install_report):
    (meta,) = [i["metadata"] for i in install_report["install"] if i["metadata"]["name"] == "distkit"]
    assert meta["license_expression"] == "BSD-3-Clause"
    assert any(u.startswith("Repository, https://github.com/") for u in meta["project_url"])
    requires = meta["requires_dist"]
    assert 'jupyter>=1.0; extra == "notebooks"' in requires
    assert any(r.startswith("tensorboard") and 'extra == "tensorboard"' in r for r in requires)
    assert any(r.startswith("mlflow") and 'extra == "mlflow"' in r for r in requires)
    # the SPDX string replaces "License ::" classifiers (setuptools refuses both)
    assert meta["classifier"] and not [c for c in meta["classifier"] if c.startswith("License ::")]


def test_license_file_is_bsd3_and_declared_as_a_string():
    text = (REPO_ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "distkit contributors" in text
    project = PYPROJECT["project"]
    assert project["license"] == "BSD-3-Clause"  # a string: the table form is deprecated
    assert project["license-files"] == ["LICENSE"]
    assert project["authors"] and project["classifiers"]


def test_build_backend_is_bounded_to_versions_that_read_spdx_strings():
    (req,) = PYPROJECT["build-system"]["requires"]
    assert req.startswith("setuptools>=77") and "<" in req  # 77: first to accept license = "..."


def test_test_extra_has_what_the_suite_imports():
    test = {_norm(r.split(">")[0].split("=")[0].split("<")[0]) for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
    # nbclient + ipykernel execute the notebooks; tensorboard reads the event files back
    assert {"pytest", "pytest-timeout", "nbclient", "ipykernel", "tensorboard"} <= test
    runtime = (REPO_ROOT / "requirements.txt").read_text()
    assert "jupyter" not in [ln.split(">")[0].strip() for ln in runtime.splitlines()]
