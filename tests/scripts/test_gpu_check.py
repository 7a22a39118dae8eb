"""scripts/gpu_check.sh: what can be proved on a CPU machine, and the GPU run itself.

On this CPU machine: the one-line refusal without a GPU; the dry run's plan, whose every
``distkit`` command must parse with the real CLI (so a renamed flag breaks this test, not
the day a GPU turns up); and the wheel-folder install, in a fresh venv whose preinstalled
torch (2.13.0+cpu, older than the main venv's) must come out untouched. What this does
NOT prove: that nccl, AMP, the GPU notebooks or the GPU benchmark work; only
``pytest -m gpu`` (or the script) on a machine with an NVIDIA GPU does.
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import REPO_ROOT, subprocess_env

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"


def gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


def run_script(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**{"PYTHON": sys.executable, **(env or {})}))


@pytest.mark.timeout(30)
@pytest.mark.skipif(gpu_present(), reason="this machine has a GPU: the refusal cannot be seen here")
def test_without_a_gpu_it_says_so_in_one_line_fast(tmp_path):
    start = time.monotonic()
    done = run_script("--wheels", tmp_path / "wheels", "--output", tmp_path / "out", "--work", tmp_path / "work")
    took = time.monotonic() - start
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: error: no NVIDIA GPU visible here"), lines
    assert took < 10, took                       # decided before importing torch
    assert not any(tmp_path.iterdir())           # nothing installed, nothing written


EXPECTED_STEPS = ["environment", "train nccl, 1 GPU", "train nccl, every GPU (2)",
                  "train nccl --amp (bf16), every GPU (2)", "notebook 02 (GPU cells)",
                  "notebook 07 (GPU cell)", "copy bandwidth, pinned vs pageable",
                  "distkit bench --only gpu", "more processes than GPUs: one line from distkit train",
                  "more processes than GPUs: the failing rank, without the check",
                  "trace: the GPT (gpt2-small), bf16, every GPU (2)", "hang doctor: a rank's record on nccl"]


@pytest.mark.timeout(60)
def test_dry_run_lists_every_step_with_commands_the_cli_accepts(tmp_path):
    from distkit.bench import MEASUREMENTS
    from distkit.commands import build_parser

    done = run_script("--wheels", tmp_path / "w", "--output", tmp_path / "out", "--work", tmp_path / "work",
                      env={"DRY_RUN": "1", "DRY_RUN_GPUS": "2"})
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert [line[3:] for line in out if line.startswith("== ")] == EXPECTED_STEPS
    assert "dry run: 12 steps listed, nothing run" in out[-1]
    assert not any(tmp_path.iterdir())           # a dry run writes nothing

    install = next(line for line in out if "pip install" in line)
    assert "--no-index" in install and "--find-links" in install and "-c <torch/torchvision pins>" in install

    commands = [shlex.split(line[2:]) for line in out if line.startswith("+ ") and " -m distkit " in line]
    assert len(commands) == 6                    # train x3, bench, the refused train, the trace
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv[3:])      # drop "python -m distkit"; exits 2 on a bad flag
        if args.command == "train":
            assert args.backend == "nccl"
        else:
            assert args.only == "gpu" and "gpu" in MEASUREMENTS
    traced = [a for a in (parser.parse_args(c[3:]) for c in commands) if a.command == "train" and a.trace]
    assert [(a.model, a.task_settings, a.amp, a.nproc_per_node) for a in traced] == [
        ("gpt", ["size=gpt2-small"], True, 2)]
    trains = sorted((a.nproc_per_node, a.amp) for a in (parser.parse_args(c[3:]) for c in commands)
                    if a.command == "train" and "too-many" not in a.output_dir and not a.trace)
    assert trains == [(1, False), (2, False), (2, True)]
    refused = [parser.parse_args(c[3:]) for c in commands if "too-many" in " ".join(c)]
    assert [(a.nproc_per_node, a.batch_size % a.nproc_per_node) for a in refused] == [(3, 0)]  # GPUs + 1

    for stem in ("02_gpus_with_nccl", "07_timing_with_timer"):
        assert (REPO_ROOT / "notebooks" / f"{stem}.ipynb").is_file()
    import inspect

    from distkit.lessons.collectives import copy_bandwidth
    assert "pin_memory" in inspect.signature(copy_bandwidth).parameters


@pytest.mark.timeout(60)
def test_with_one_gpu_the_every_gpu_run_is_not_repeated(tmp_path):
    done = run_script("--output", tmp_path / "out", env={"DRY_RUN": "1", "DRY_RUN_GPUS": "1"})
    assert done.returncode == 0, done.stderr
    steps = [line[3:] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert "train nccl, 1 GPU" in steps and not any(s.startswith("train nccl, every GPU") for s in steps)
    assert "--nproc-per-node 2 --batch-size 32 --output-dir" in done.stdout   # GPUs + 1, a batch that divides


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_rehearsal_runs_the_steps_and_writes_the_report(tmp_path):
    """gloo for nccl, 2 epochs: the commands, results.json parsing and the JSON/text report
    work end to end; the steps that need a GPU are recorded as skipped, never as passed."""
    out = tmp_path / "out"
    refused = run_script(env={"GPU_CHECK_REHEARSAL": "1"})
    assert refused.returncode == 1 and "a rehearsal needs --output DIR" in refused.stderr

    done = run_script("--output", out, "--work", tmp_path / "work", env={"GPU_CHECK_REHEARSAL": "1"},
                      timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    record = json.loads((out / "gpu-check-cpu-rehearsal.json").read_text())
    assert record["rehearsal"] is True and record["passed"] is True
    steps = record["steps"]
    assert [name for name, r in steps.items() if r["passed"] is None] == [
        "notebook 02 (GPU cells)", "notebook 07 (GPU cell)", "copy bandwidth, pinned vs pageable",
        "distkit bench --only gpu", "more processes than GPUs: the failing rank, without the check"]
    trains = {name: r for name, r in steps.items() if name.startswith("train gloo")}
    assert sorted((r["world_size"], bool(r["amp"])) for r in trains.values()) == [(1, False), (2, False), (2, True)]
    assert all(r["val_accuracy"] >= 0.5 and r["epochs"] == 2 for r in trains.values())
    message = steps["more processes than GPUs: one line from distkit train"]["message"]
    assert message.startswith("distkit: error: --backend nccl needs CUDA GPUs")
    text = (out / "gpu-check-cpu-rehearsal.txt").read_text()
    traced = steps["trace: the GPT (default), bf16, every GPU (2)"]
    assert traced["world_size"] == 2 and 0 < traced["mfu"] < 1 and traced["tokens_per_second"] > 0
    assert traced["hta"] == {"skipped": "a CPU trace has no GPU kernels, which HTA measures"}
    assert len(traced["trace"]["per_rank"]) == 2 and Path(traced["trace"]["png"]).exists()
    doctor = steps["hang doctor: a rank's record on gloo"]["collectives"]
    assert [(c["seq"], c["op"], c["done"]) for c in doctor] == [
        (1, "all_reduce", True), (2, "broadcast", True), (3, "all_gather", True)]
    assert "PASSED: 7 of 7 steps (5 skipped)" in text and text.count("\nskip ") == 5


@pytest.mark.timeout(60)
def test_steps_names_the_steps_a_rerun_runs(tmp_path):
    done = run_script("--steps", "trace,doctor", "--output", tmp_path / "out",
                      env={"DRY_RUN": "1", "DRY_RUN_GPUS": "2"})
    assert done.returncode == 0, done.stderr
    assert [line[3:] for line in done.stdout.splitlines() if line.startswith("== ")] == [
        "environment", "trace: the GPT (gpt2-small), bf16, every GPU (2)",
        "hang doctor: a rank's record on nccl"]


def test_make_wheels_fills_the_folder_the_issue_describes(tmp_path):
    done = run_script("--make-wheels", tmp_path / "wheels", env={"DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    assert commands[0].endswith(f"-m pip download pytorch-ignite --no-deps -d {tmp_path / 'wheels'}")
    assert commands[1].endswith(f"-m pip wheel --no-deps {REPO_ROOT} -w {tmp_path / 'wheels'}")
    assert "torch" not in commands[2].replace("pytorch", "")   # never a torch wheel
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- the wheel-folder install

BASE_VENV = Path.home() / ".cache" / "distkit" / "gpu-check-venv"
PREINSTALLED_TORCH = "2.13.0+cpu"   # older than the main venv's: a replacement would show


def venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def pip(venv, *args, timeout=900):
    done = subprocess.run([venv_python(venv), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def base_venv() -> Path:
    """A venv standing for the GPU machine: torch and torchvision preinstalled, plus the
    kit's other runtime needs, but no pytorch-ignite and no distkit. Built once (about 2
    minutes: the CPU torch wheel is local) and kept under ~/.cache/distkit/."""
    marker = BASE_VENV / "ready"
    if marker.exists():
        return BASE_VENV
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(BASE_VENV)], check=True, timeout=300)
    local = glob.glob(f"/opt/wheels/torch-{PREINSTALLED_TORCH}-*.whl")
    pip(BASE_VENV, "install", "-q", *(local or [f"torch=={PREINSTALLED_TORCH.split('+')[0]}"]))
    # torchvision 0.28.0 pairs with torch 2.13.0 by its metadata; it is a CUDA build, so it
    # stands for the preinstalled one without being imported (neither install nor the
    # import check imports it)
    pip(BASE_VENV, "install", "-q", "--no-deps", "torchvision==0.28.0")
    pip(BASE_VENV, "install", "-q", "matplotlib>=3.7", "scikit-learn>=1.2", "tqdm>=4.60")
    marker.write_text("torch, torchvision, matplotlib, scikit-learn, tqdm\n")
    return BASE_VENV


def make_wheels(folder: Path) -> None:
    """The folder the issue describes: ignite's wheel (pip download --no-deps) and the
    kit's own (pip wheel --no-deps .). This machine has the network; the GPU one has not."""
    folder.mkdir()
    pip(Path(sys.prefix), "download", "-q", "pytorch-ignite==0.5.5", "--no-deps", "-d", str(folder))
    pip(Path(sys.prefix), "wheel", "-q", "--no-deps", str(REPO_ROOT), "-w", str(folder))


@pytest.mark.slow
@pytest.mark.side_env(f"the GPU-machine stand-in {BASE_VENV} (torch 2.13.0+cpu: about 1.3 GB, "
                      "2 min the first time)")
@pytest.mark.timeout(1500)
def test_wheel_folder_install_keeps_the_preinstalled_torch(tmp_path):
    venv = base_venv()
    subprocess.run([venv_python(venv), "-m", "pip", "uninstall", "-y", "-q", "distkit", "pytorch-ignite"],
                   capture_output=True, timeout=300)  # back to the base state
    wheels = tmp_path / "wheels"
    make_wheels(wheels)
    # no pip configuration: only the folder, as on a machine without the network
    env = {"PYTHON": venv_python(venv), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}

    missing = tmp_path / "only-ignite"
    missing.mkdir()
    for whl in wheels.glob("pytorch_ignite-*.whl"):
        (missing / whl.name).symlink_to(whl)
    refused = run_script("--install-only", "--wheels", missing, env=env)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"gpu_check: error: no distkit-*.whl in {missing}: pip wheel --no-deps . -w {missing} (in this repository)"]

    done = run_script("--install-only", "--wheels", wheels, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"torch {PREINSTALLED_TORCH} untouched" in done.stdout
    assert "installed: distkit " in done.stdout and "ignite 0.5.5" in done.stdout

    # checked again from outside the script: versions, where distkit came from, the CLI
    probe = subprocess.run(
        [venv_python(venv), "-c", "import json, torch, ignite, distkit; print(json.dumps("
         "[torch.__version__, ignite.__version__, distkit.__file__]))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    torch_version, ignite_version, distkit_file = json.loads(probe.stdout)
    assert torch_version == PREINSTALLED_TORCH and ignite_version == "0.5.5"
    assert distkit_file.startswith(str(venv)), distkit_file    # the wheel, not this checkout
    cli = subprocess.run([str(venv / "bin" / "distkit"), "shard-check", "--dataset-size", "10",
                          "--nproc-per-node", "2", "--batch-size", "4"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert cli.returncode == 0 and "verdict: OK" in cli.stdout, cli.stderr[-2000:]


# ---------------------------------------------------------------- on a GPU machine

@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_gpu_check_passes_on_this_gpu_machine(tmp_path):
    """The whole script: every step must pass, and its JSON must hold the figures."""
    done = run_script("--output", tmp_path / "out", "--work", tmp_path / "work", timeout=3500)
    (json_path,) = (tmp_path / "out").glob("gpu-check-*.json")
    record = json.loads(json_path.read_text())
    failed = {k: v.get("error") for k, v in record["steps"].items() if not v["passed"]}
    assert done.returncode == 0 and record["passed"], failed
    assert record["gpu"] and record["driver"] and record["torch"]
    steps = record["steps"]
    assert steps["train nccl, 1 GPU"]["val_accuracy"] >= 0.95
    assert steps["distkit bench --only gpu"]["ratio"] >= 0.95
    assert (tmp_path / "out" / json_path.name.replace(".json", ".txt")).is_file()


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_nccl_one_process_per_gpu():
    """A fast one to run first: the kit's runner, nccl, process k on GPU k."""
    import torch

    from distkit.lessons.collectives import process_info
    from distkit.launch.runner import run_per_rank

    n = torch.cuda.device_count()
    seen = run_per_rank(process_info, n, "nccl")
    assert [(i["rank"], i["backend"], i["device"]) for i in seen] == \
        [(r, "nccl", f"cuda:{r}") for r in range(n)]
