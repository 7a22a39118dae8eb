"""The notebooks in the repository carry the outputs of a recorded run
(scripts/record_notebooks.py), so the course reads before anything is installed; these
quick tests keep those outputs and the sources in step: every code cell ran, the outputs
were produced from the code cells as they are now (a digest recorded at the run), the
page says where and when it ran, and the outputs are clean (no error, no progress-bar
frames, no stray warning). No kernel is started, except by the two tests of the recorder
itself (a two-cell notebook, a few seconds)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import build_notebooks  # noqa: E402
import record_notebooks  # noqa: E402
import record_notebooks  # noqa: E402
from record_notebooks import code_digest, is_recorded_cell  # noqa: E402

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def load(path):
    return json.loads(path.read_text())


def stale(nb: dict, name: str) -> list[str]:
    """What is wrong with ``nb``'s recorded outputs, each problem naming the notebook and the
    command that records it again; empty when the outputs are those of its code now."""
    again = f"re-record it: python scripts/record_notebooks.py {name[:2]}"
    recorded = nb["metadata"].get("distkit", {}).get("recorded")
    if not recorded:
        return [f"{name}: no recorded run (its outputs are missing); {again}"]
    problems = []
    if recorded["code_digest"] != code_digest(nb):
        problems.append(f"{name}: its code cells changed since its recorded run of {recorded['date']}; {again}")
    not_run = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c.get("execution_count") is None]
    if not_run:
        problems.append(f"{name}: cells {not_run} did not run in its recorded run; {again}")
    notes = [c for c in nb["cells"] if is_recorded_cell(c)]
    if len(notes) != 1 or "".join(notes[0]["source"]) != record_notebooks.recorded_cell_source(recorded):
        problems.append(f"{name}: the note of its recorded run does not match its metadata; {again}")
    return problems


# stderr lines a notebook shows knowingly, each with why; the test below fails once one is
# no longer shown, so that none outlives its reason.


def unclean(nb: dict, name: str = "") -> list[str]:
    """Outputs a reader should not see: an error, progress-bar frames (carriage returns),
    anything written to stderr (warnings, log lines shown in red)."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", ""))
            if out["output_type"] == "error":
                found.append(f"cell {i}: {out['ename']}: {out['evalue'][:100]}")
            elif out.get("name") == "stderr":
                if text.strip():
                    found.append(f"cell {i} stderr: {text.strip()[:160]!r}")
            elif "\r" in text:
                found.append(f"cell {i}: progress-bar frames (carriage returns) in its output")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_carries_the_outputs_of_its_code_as_it_is(path):
    problems = stale(load(path), path.name)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_recorded_outputs_are_clean(path):
    found = unclean(load(path), path.name)
    assert not found, f"{path.name} shows:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_recorded_run_is_said_on_the_page(path):
    nb = load(path)
    recorded = nb["metadata"]["distkit"]["recorded"]
    note = "".join(nb["cells"][1]["source"])  # right after the badge and title
    assert is_recorded_cell(nb["cells"][1]), f"{path.name}: the recorded-run note is not after the title"
    for fact in (recorded["date"], recorded["machine"], recorded["versions"]["torch"],
                 f"record_notebooks.py {path.name[:2]}"):
        assert fact in note, (path.name, fact)


def test_the_checks_catch_a_changed_cell_a_cell_not_run_and_noise():
    nb = load(NOTEBOOKS[0])
    assert not stale(nb, NOTEBOOKS[0].name)
    code = next(c for c in nb["cells"] if c["cell_type"] == "code" and c["outputs"])
    code["source"] = "".join(code["source"]) + "\nprint('one more line')"
    (problem,) = stale(nb, NOTEBOOKS[0].name)
    assert "code cells changed since its recorded run" in problem
    assert problem.endswith(f"python scripts/record_notebooks.py {NOTEBOOKS[0].name[:2]}")
    nb = load(NOTEBOOKS[0])
    code = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    code["execution_count"], code["outputs"] = None, []
    assert any("did not run" in p for p in stale(nb, NOTEBOOKS[0].name))
    code["outputs"] = [{"output_type": "stream", "name": "stderr", "text": "UserWarning: x"},
                       {"output_type": "stream", "name": "stdout", "text": " 10%|#\r 20%|##"}]
    assert len(unclean(nb)) == 2
    del nb["metadata"]["distkit"]
    assert "no recorded run" in stale(nb, NOTEBOOKS[0].name)[0]


def test_a_prose_edit_keeps_the_outputs_and_a_code_edit_drops_them():
    """scripts/build_notebooks.py, rebuilding a notebook from its source: outputs carried
    over when only markdown changed, dropped (to be recorded again) when code changed."""
    recorded = load(NOTEBOOKS[0])
    built = build_notebooks.normalized(recorded)
    assert built != recorded and json.loads(json.dumps(built)) == built
    prose = json.loads(json.dumps(built))
    title = prose["cells"][0]
    title["source"] = "".join(title["source"]) + "\nMore prose."
    kept = build_notebooks.with_outputs_of(prose, recorded)
    assert not stale(kept, NOTEBOOKS[0].name) and build_notebooks.normalized(kept) == prose
    # the generated install cell is not part of what was recorded (it does nothing where
    # distkit is installed): a new one, or a new address in it, keeps the outputs
    install = json.loads(json.dumps(built))
    cell = next(c for c in install["cells"] if record_notebooks.is_install_cell(c))
    cell["source"] = "".join(cell["source"]).replace("REPO_URL = None", 'REPO_URL = "https://github.com/a/b"')
    kept = build_notebooks.with_outputs_of(install, recorded)
    assert not stale(kept, NOTEBOOKS[0].name) and build_notebooks.normalized(kept) == install
    code = json.loads(json.dumps(built))
    cell = next(c for c in code["cells"] if c["cell_type"] == "code" and not record_notebooks.is_install_cell(c))
    cell["source"] = "".join(cell["source"]) + "\nx = 1"
    assert build_notebooks.with_outputs_of(code, recorded) == code  # no outputs: to be recorded


TINY = {"cells": [
    {"cell_type": "markdown", "id": "99-00", "metadata": {}, "source": "# 99 · tiny"},
    {"cell_type": "code", "id": "99-01", "metadata": {}, "execution_count": None, "outputs": [],
     "source": "import distkit\nprint(6 * 7)"},
    {"cell_type": "code", "id": "99-02", "metadata": {}, "execution_count": None, "outputs": [], "source": "x = 1"}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                 "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def test_record_executes_in_a_kernel_and_saves_outputs_note_and_digest(tmp_path):
    path = tmp_path / "99_tiny.ipynb"
    path.write_text(json.dumps(TINY))
    record_notebooks.record(path, log=lambda *a: None)
    nb = load(path)
    assert not stale(nb, path.name) and not unclean(nb)
    assert [c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"] == [1, 2]
    assert "".join(nb["cells"][2]["outputs"][0]["text"]) == "42\n" and nb["cells"][3]["outputs"] == []
    assert build_notebooks.normalized(nb) == TINY  # the built notebook, plus the run only
    record_notebooks.record(path, log=lambda *a: None)  # again: one note, not two
    assert sum(is_recorded_cell(c) for c in load(path)["cells"]) == 1


def test_record_of_a_failing_notebook_keeps_the_file_and_says_which(tmp_path):
    broken = json.loads(json.dumps(TINY))
    broken["cells"][2]["source"] = "raise ValueError('planted')"
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "record_notebooks.py").write_text((REPO_ROOT / "scripts" / "record_notebooks.py").read_text())
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "99_tiny.ipynb"
    path.write_text(json.dumps(broken))
    before = path.read_text()
    done = subprocess.run([sys.executable, str(scripts / "record_notebooks.py"), "99"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and path.read_text() == before
    assert "99_tiny.ipynb failed (ValueError: planted)" in done.stderr, done.stderr[-2000:]
    wrong = subprocess.run([sys.executable, str(scripts / "record_notebooks.py"), "98"], capture_output=True,
                           text=True, timeout=60)
    assert wrong.returncode == 2 and "no notebook numbered 98" in wrong.stderr
