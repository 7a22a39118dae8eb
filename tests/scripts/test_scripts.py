"""The launch templates in scripts/: each header states the exact command the script
runs (checked against what it prints), and each runs as far as this machine allows:
torchrun on two "nodes" on 127.0.0.1 and the Colab launcher; slurm.sbatch runs on a real
one-node SLURM cluster in tests/launch/test_slurm.py.
torchrun_1node.sh itself is run, with a crash and a restart, in test_failure.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import checkout_copy, COLAB_PREINSTALLED, REPO_ROOT, subprocess_env
from distkit.host.facts import free_port, threads_per_process
from distkit.lessons.multinode import slurm_env

SCRIPTS = REPO_ROOT / "scripts"
TINY = ["--epochs", "1", "--no-progress", "--dataset", "synthetic", "--dataset-size", "256"]


def header_command(path):
    """The line after 'Exact command' in a script's header comment."""
    lines = path.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if "Exact command" in ln)
    return lines[i + 1].lstrip("#").strip()


def dry_run(script, args, **env):
    out = subprocess.run(["bash", str(SCRIPTS / script), *args], capture_output=True, text=True,
                         env=subprocess_env(DRY_RUN=1, **env), timeout=30)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("+ ")]
    return line[2:]


@pytest.mark.parametrize("script, env", [
    ("torchrun_1node.sh", {"NPROC": 3, "MAX_RESTARTS": 2, "OUTPUT_DIR": "runs/x", "CHECKPOINT_EVERY": 7}),
    ("torchrun_nnodes.sh", {"NNODES": 2, "NPROC": 4, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": 29501,
                            "JOB_ID": "j9", "MAX_RESTARTS": 1, "OUTPUT_DIR": "/shared/runs/j9",
                            "CHECKPOINT_EVERY": 20}),
    ("slurm.sbatch", {"SLURM_JOB_ID": 123, "OUTPUT_DIR": "runs/slurm-123", "CHECKPOINT_EVERY": 100}),
])
def test_header_states_the_exact_command_the_script_runs(script, env):
    args = ["--epochs", "3"]
    expected = header_command(SCRIPTS / script)
    for name, value in env.items():
        expected = expected.replace(f"${name}", str(value))
    expected = expected.replace('"$@"', " ".join(args))
    assert "$" not in expected, f"{script}: header uses a variable the test does not set: {expected}"
    assert dry_run(script, args, **env) == expected
    assert f"scripts/{script}" in (SCRIPTS / script).read_text().split("Exact command")[0], \
        "the header shows how to invoke the script"


def test_slurm_script_directives_come_before_any_command():
    lines = (SCRIPTS / "slurm.sbatch").read_text().splitlines()
    first_command = next(i for i, ln in enumerate(lines[1:], 1) if ln.strip() and not ln.startswith("#"))
    directives = [i for i, ln in enumerate(lines) if ln.startswith("#SBATCH")]
    assert directives and max(directives) < first_command  # sbatch ignores later ones
    text = "\n".join(lines)
    assert "--kill-on-bad-exit=1" in text and "#SBATCH --requeue" in text


SLURM_TASK = dict(procid=3, ntasks=4, localid=1, nnodes=2, nodeid=1, job_id="5551234", nodelist="gpu[07-08]")
IGNITE_READS = {"RANK": 3, "LOCAL_RANK": 1, "WORLD_SIZE": 4, "MASTER_ADDR": "gpu07", "MASTER_PORT": 15000 + 1234}


def fake_scontrol(bindir: Path, hostnames: list[str]) -> Path:
    """A stand-in ``scontrol`` whose ``show hostnames`` prints ``hostnames``, as a
    configured cluster's does (a real one installed without a slurm.conf fails instead)."""
    bindir.mkdir(exist_ok=True)
    script = bindir / "scontrol"
    script.write_text(f"#!/bin/sh\n[ \"$1 $2\" = \"show hostnames\" ] || exit 2\nprintf '%s\\n' {' '.join(hostnames)}\n")
    script.chmod(0o755)
    return script


def test_what_ignite_reads_from_slurm(tmp_path, monkeypatch):
    """ignite's own translation of srun's variables (no process started). ignite asks
    ``scontrol show hostnames`` to expand the node list when ``scontrol`` is on the PATH
    and expands it itself otherwise; which one this machine has (none, a configured
    cluster's, or one installed without a cluster config, which fails) must not decide
    the test: both routes are taken here, on a PATH this test sets."""
    from ignite.distributed.comp_models.native import _setup_ddp_vars_from_slurm_env

    env = slurm_env(**SLURM_TASK)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol: ignite's own expansion
    assert _setup_ddp_vars_from_slurm_env(env) == IGNITE_READS
    # with scontrol: ignite takes the first host it prints (a different one, to tell)
    fake_scontrol(tmp_path / "bin", ["gpu99", "gpu08"])
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert _setup_ddp_vars_from_slurm_env(env) == {**IGNITE_READS, "MASTER_ADDR": "gpu99"}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_nnodes_script_on_two_loopback_nodes(tmp_path):
    """Two "nodes" on this machine: besides training in sync, the two launches (one
    process each, so torchrun sets no OMP_NUM_THREADS) share the cores between them."""
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), JOB_ID="loopback",
                         OUTPUT_DIR=tmp_path / "runs", PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    env.pop("OMP_NUM_THREADS")  # as in a learner's shell: the thread count is distkit's doing
    nodes = [subprocess.Popen(["bash", str(SCRIPTS / "torchrun_nnodes.sh"), *TINY], cwd=tmp_path, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    for p, out in zip(nodes, outs):
        assert p.returncode == 0, out[-3000:]
    (results,) = (tmp_path / "runs").glob("*/results.json")
    res = json.loads(results.read_text())
    assert (res["world_size"], res["nnodes"]) == (2, 2)
    assert res["replicas_identical"]
    # 2 ranks on this host: cores / 2 each (1 on the 2-core CI machine), not cores / 1 per
    # launch, which gave 2 processes x all the cores (issue 13: 16x slower per epoch)
    assert res["threads_per_process"] == threads_per_process(2)
    assert threads_per_process(2) < threads_per_process(1) or threads_per_process(1) == 1


# slurm.sbatch in a real SLURM job (sbatch, srun, requeue, scancel): tests/launch/test_slurm.py.


def test_colab_launcher_chooses_the_runtime_command():
    out = subprocess.run([sys.executable, str(SCRIPTS / "colab_launch.py"), "--dry-run", "--epochs", "3"],
                         capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    command = out.stdout.splitlines()[-1]
    import torch

    expected = "--backend nccl" if torch.cuda.is_available() else "--backend gloo --nproc-per-node 2"
    assert command == f"+ distkit train {expected}" + (
        f" --nproc-per-node {torch.cuda.device_count()}" if torch.cuda.is_available() else "") + " --epochs 3"
    assert re.search(r"python \S*scripts/colab_launch\.py", (SCRIPTS / "colab_launch.py").read_text())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_colab_launcher_runs_distkit_train(tmp_path):
    # the user's flags win over the chosen ones; one plain process keeps this test short
    out = subprocess.run([sys.executable, str(SCRIPTS / "colab_launch.py"), "--backend", "none",
                          "--nproc-per-node", "1", *TINY, "--output-dir", "runs"],
                         cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "+ distkit train --backend none --nproc-per-node 1 --epochs 1" in out.stdout
    assert "final validation accuracy" in out.stdout
    assert list((tmp_path / "runs").glob("*/results.json"))


# --------------------------------------------------------------------------------------
# Colab: the notebooks' real install cell, in an environment set up as Colab's is
# --------------------------------------------------------------------------------------

# What a Colab runtime has before the install cell runs (issue 13: torch 2.9 and
# torchvision 0.24; matplotlib, scikit-learn, tqdm; a Jupyter kernel), and not
# pytorch-ignite or distkit. Built once, then reused (about 5.5 GB: torch's CUDA build).
COLAB_VENV = Path(os.environ.get("DISTKIT_COLAB_VENV", Path.home() / ".cache" / "distkit" / "colab-venv"))
KEPT = ("torch", "torchvision", "ipykernel", "jupyter_client", "nbclient", "matplotlib", "numpy")


def colab_like_python() -> Path:
    python, marker = COLAB_VENV / "bin" / "python", COLAB_VENV / "colab-preinstalled.txt"
    if python.exists() and marker.exists() and marker.read_text().split() == COLAB_PREINSTALLED:
        return python
    shutil.rmtree(COLAB_VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(COLAB_VENV)], check=True, timeout=120)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *COLAB_PREINSTALLED], check=True, timeout=1200)
    marker.write_text("\n".join(COLAB_PREINSTALLED))
    return python


# Run in the Colab-like environment: the notebooks' install cell (every notebook's second
# cell is this text: test_notebooks checks they are in sync), in a real kernel, then a
# tiny training in the same kernel (idist.Parallel forks there).
DRIVER = textwrap.dedent('''\
    import json, sys, nbformat
    from nbclient import NotebookClient
    install_cell, out = open(sys.argv[1]).read(), sys.argv[2]
    versions = "import importlib.metadata as md, json; print('VERSIONS', json.dumps({{p: md.version(p) for p in {kept!r}}}))"
    train = """
    from distkit.config import Config
    from distkit.launch.entry import run
    res = run(Config(nproc_per_node=2, epochs=1, dataset="synthetic", dataset_size=256, output_dir="runs"))
    print("TRAINED", res["world_size"], res["final"]["val_accuracy"], res["versions"]["torch"])
    """
    cells = [nbformat.v4.new_code_cell(versions), nbformat.v4.new_code_cell(install_cell),
             nbformat.v4.new_code_cell(versions), nbformat.v4.new_code_cell(train)]
    run_nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(run_nb, timeout=600, kernel_name="python3", resources={{"metadata": {{"path": out}}}}).execute()
    print("".join(o.get("text", "") for c in run_nb.cells for o in c.get("outputs", [])))
''')


# The install cell alone in a kernel of the Colab-like environment, in a folder with no
# wheel: with no published repository, the cell's output is its one-line error.
UNPUBLISHED_DRIVER = textwrap.dedent('''\
    import sys, nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(open(sys.argv[1]).read())])
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
    except CellExecutionError:
        pass
    for o in nb.cells[0].outputs:
        print("OUTPUT", o.output_type, *o.get("traceback", []), sep="\\n")
''')


@pytest.mark.slow
@pytest.mark.side_env(f"the Colab-like environment {COLAB_VENV} (torch 2.9.0: about 7 GB, 10 min "
                      "the first time, then about 70 s a run)")
@pytest.mark.timeout(1800)
def test_install_cell_in_a_colab_like_environment_keeps_torch_and_trains(tmp_path):
    python = colab_like_python()
    env = {k: v for k, v in subprocess_env().items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "DISTKIT_INSTALL_SPEC"))}
    env["PATH"] = f"{python.parent}:{env['PATH']}"
    # distkit and ignite from an earlier run out, so the cell installs them again
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "distkit", "pytorch-ignite"],
                   capture_output=True, timeout=120, env=env)
    gone = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('distkit'))"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert gone.stdout.strip() == "None", gone.stdout + gone.stderr
    sys.path.insert(0, str(SCRIPTS))
    import build_notebooks

    (tmp_path / "drive.py").write_text(DRIVER.format(kept=KEPT))
    # with the placeholder's cell and nothing uploaded: the cell's whole output is one
    # line saying to set the address
    (tmp_path / "empty").mkdir()
    (tmp_path / "unpublished.py").write_text(UNPUBLISHED_DRIVER)
    (tmp_path / "placeholder_cell.py").write_text(build_notebooks.install_cell(
        f"https://github.com/{build_notebooks.PLACEHOLDER_OWNER}/distkit"))
    out = subprocess.run([str(python), str(tmp_path / "unpublished.py"), str(tmp_path / "placeholder_cell.py"),
                          str(tmp_path / "empty")], capture_output=True, text=True, env=env, timeout=600)
    shown = out.stdout.split("OUTPUT", 1)[-1].strip().splitlines()
    assert shown[0] == "error" and len(shown) == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert shown[1].startswith("InstallError: distkit is not installed and this copy names no repository"), shown
    # from the repository's address: a local bare repository stands in for the public
    # one (its main at this checkout's commit); the cell installs git+file://...@main
    bare = tmp_path / "public" / "distkit.git"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--bare", str(REPO_ROOT), str(bare)], check=True, timeout=300)
    subprocess.run(["git", "-C", str(bare), "update-ref", "refs/heads/main", head], check=True, timeout=60)
    (tmp_path / "install_cell.py").write_text(build_notebooks.install_cell(f"file://{bare}"))
    (tmp_path / "work").mkdir()
    out = subprocess.run([str(python), str(tmp_path / "drive.py"), str(tmp_path / "install_cell.py"),
                          str(tmp_path / "work")],
                         capture_output=True, text=True, env=env, timeout=1500)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    before, after = [json.loads(ln.split(" ", 1)[1])
                     for ln in out.stdout.splitlines() if ln.startswith("VERSIONS ")]
    assert before == after, "the install cell changed a package the runtime had"
    assert before["torch"].startswith("2.9.0") and before["torchvision"].startswith("0.24.0")
    (trained,) = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("TRAINED ")]
    # trained on 2 processes, with the runtime's torch (torch.__version__ adds "+cu128")
    assert trained[1] == "2" and 0.0 <= float(trained[2]) <= 1.0 and trained[3].startswith(before["torch"])
    installed = subprocess.run([str(python), "-m", "pip", "show", "distkit", "pytorch-ignite"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "Name: distkit" in installed and "Name: pytorch-ignite" in installed
    assert "Editable project location" not in installed  # a real install, from the repository
    said = [ln for ln in out.stdout.splitlines() if re.match(r"\[\d/3\]", ln)]
    assert [ln[:5] for ln in said] == ["[1/3]", "[2/3]", "[3/3]"] and said[0].endswith(": kept"), said


def test_the_repository_is_named_in_pyproject_only(tmp_path):
    """Badges and install cells come from [project.urls] Repository: no other tracked file
    (generated notebooks aside) spells it, and another value there changes what is built."""
    sys.path.insert(0, str(SCRIPTS))
    import build_notebooks

    url = build_notebooks.REPO_URL
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=30).stdout.split()
    spelled = [f for f in tracked if not f.endswith(".ipynb") and (REPO_ROOT / f).is_file()
               and url.removeprefix("https://") in (REPO_ROOT / f).read_text(errors="ignore")]
    assert spelled == ["pyproject.toml"], spelled
    fork = tmp_path / "pyproject.toml"
    fork.write_text((REPO_ROOT / "pyproject.toml").read_text().replace(url, "https://github.com/someone/fork"))
    assert build_notebooks.repository_url(fork) == "https://github.com/someone/fork"
    (source,) = sorted((REPO_ROOT / "notebooks" / "src").glob("02_*.py"))
    (notebook,) = [build_notebooks.normalized(json.loads(p.read_text()))  # less its recorded outputs
                   for p in sorted((REPO_ROOT / "notebooks").glob("02_*.ipynb"))]
    assert json.loads(build_notebooks.build(source)) == notebook
    # with the real repository (here a fork), the badge and the install cell name it
    published = json.loads(build_notebooks.build(source, "https://github.com/someone/fork"))
    assert ("colab.research.google.com/github/someone/fork/blob/main/notebooks/02_"
            in "".join(published["cells"][0]["source"]))
    assert 'REPO_URL = "https://github.com/someone/fork"' in "".join(published["cells"][1]["source"])
    if not build_notebooks.is_published(url):  # the placeholder: no badge, no URL to clone
        assert "colab-badge" not in "".join(notebook["cells"][0]["source"])
        assert "REPO_URL = None" in "".join(notebook["cells"][1]["source"])
