"""The shell: distkit --version, bare distkit, torchrun-style aliases, help text, and a
--help that does not import torch."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from support import subprocess_env, within_seconds
from distkit import __version__
from distkit.commands import COMMANDS, build_parser
from distkit.commands.train import config_from_args


def distkit(*args, timeout=None):
    return subprocess.run([sys.executable, "-m", "distkit", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=timeout or within_seconds(60))


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
    assert not re.search(r"default: (True|False|None)\b|\(default: \)", text), text
    assert not re.search(r"\(default: [^)]*\)[^-]*\(default:", text), "a default shown twice"


def test_train_help_shows_every_default_value():
    text = " ".join(distkit("train", "--help").stdout.split())
    for flag, default in [("--epochs", "10"), ("--batch-size", "64"), ("--nnodes", "1"), ("--lr", "0.05"),
                          ("--backend", "auto"), ("--output-dir", "runs"), ("--timeout", "120.0")]:
        # from the flag to its default without crossing the next option
        assert re.search(rf"{flag} \S+ (?:(?! --).)*?default: {re.escape(default)}(\)| |$)", text), (flag, text)


def test_docs_cli_lists_every_sub_command_and_its_page_exists():
    """docs/cli.md's table of sub-commands is made from nothing: each command the parser
    has is a row (a command added later fails here until it is written down), and each
    page a row links to is there."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "cli.md").read_text()
    rows = dict(re.findall(r"^\| `distkit ([\w-]+)` \| .*?\| (.*) \|$", text, re.M))
    assert set(rows) == set(COMMANDS), sorted(set(COMMANDS) ^ set(rows))
    for command, where in rows.items():
        for page in re.findall(r"\]\(([\w-]+\.md)", where):
            assert (docs / page).is_file(), f"{command}: {page}"


def test_help_imports_no_torch():
    """Building the whole parser (every sub-command's options) stays light: torch, ignite,
    numpy are imported by a command's main, when it runs."""
    code = ("import sys; from distkit.commands import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'ignite', 'numpy', 'matplotlib', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         timeout=within_seconds(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------
# Logs: a progress bar only where someone watches; ignite's INFO lines with --verbose
# Experiment tracking: --logger tensorboard / mlflow through ignite's own loggers
# --------------------------------------------------------------------------------------

TINY = ["--epochs", "2", "--dataset", "synthetic", "--dataset-size", "256", "--output-dir", "runs"]
BAR = re.compile(r"\d+%\|")  # tqdm's "25%|██▌"


def the_run(tmp_path):
    (run,) = (tmp_path / "runs").iterdir()
    return run, json.loads((run / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_piped_run_logs_lines_not_a_bar_and_tensorboard_gets_every_metric(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = subprocess.run([sys.executable, "-m", "distkit", "train", "--nproc-per-node", "2", *TINY,
                          "--logger", "tensorboard", "--profile"], cwd=tmp_path, capture_output=True,
                         text=True, env=subprocess_env(), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not BAR.search(out.stdout + out.stderr) and "\r" not in out.stdout + out.stderr
    assert " INFO: " not in out.stderr, out.stderr  # ignite's launcher / auto_* lines: --verbose only
    assert [ln.split()[:2] for ln in out.stdout.splitlines() if ln.startswith("epoch ")] == \
        [["epoch", "1"], ["epoch", "2"]]

    run, res = the_run(tmp_path)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    for key, tag in [("train_loss", "training/loss"), ("lr", "training/lr/group_0"),
                     ("val_loss", "validation/loss"), ("val_accuracy", "validation/accuracy")]:
        assert [s.step for s in scalars[tag]] == [h["epoch"] for h in res["history"]], tag
        assert [s.value for s in scalars[tag]] == pytest.approx([h[key] for h in res["history"]], rel=1e-6), tag
    compute = next(r for r in res["profile"]["rows"]
                   if r["source"] == "HandlersTimeProfiler" and r["name"] == "compute (training step)")
    (logged,) = scalars["profile/compute/compute_training_step"]
    assert (logged.step, logged.value) == (2, pytest.approx(compute["mean_s"], rel=1e-6))


def run_in_a_terminal(args, cwd, timeout):
    """Run with stdout and stderr on a pseudo-terminal, as in an interactive shell."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    master, follower = pty.openpty()
    # a real terminal has a size; tqdm draws a bar as wide as the terminal (0 columns: nothing)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env=subprocess_env())
    os.close(follower)
    chunks = []
    try:
        while select.select([master], [], [], timeout)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_in_a_terminal_the_bar_shows_and_verbose_lets_ignite_info_through(tmp_path):
    code, text = run_in_a_terminal([sys.executable, "-m", "distkit", "train", "--backend", "none", *TINY,
                                    "--verbose"], tmp_path, timeout=150)
    assert code == 0, text[-3000:]
    assert BAR.search(text), text[-3000:]
    assert "ignite.distributed.auto.auto_dataloader INFO" in text
    assert not re.search(r"^epoch +1 ", text, re.M)  # the bar replaces the per-epoch lines


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_mlflow_logger_records_the_epochs(tmp_path):
    from mlflow.tracking import MlflowClient

    out = subprocess.run([sys.executable, "-m", "distkit", "train", "--backend", "none", *TINY,
                          "--logger", "mlflow"], cwd=tmp_path, capture_output=True, text=True,
                         env=subprocess_env(), timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    run, res = the_run(tmp_path)
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    (mlrun,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    # ignite's MLflowLogger joins tag and name with a space (TensorBoard: a slash)
    for key, name in [("train_loss", "training loss"), ("lr", "training lr group_0"),
                      ("val_accuracy", "validation accuracy")]:
        history = sorted(client.get_metric_history(mlrun.info.run_id, name), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == \
            [(h["epoch"], pytest.approx(h[key], rel=1e-9)) for h in res["history"]], name
    assert mlrun.data.params["epochs"] == "2"


# --------------------------------------------------------------------------------------
# distkit doctor
# --------------------------------------------------------------------------------------

def doctor_json(**env):
    base = {k: v for k, v in subprocess_env().items()  # this test process's own launch, if any
            if k != "PYTORCH_NVML_BASED_CUDA_CHECK" and not k.startswith("SLURM_")
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-m", "distkit", "doctor", "--json"], capture_output=True,
                         text=True, timeout=90, env={**base, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_doctor_reports_versions_hardware_launcher_variables_and_repairs():
    import platform

    import torch

    launch = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3",
              "SLURM_NTASKS": "4", "SLURM_JOB_ID": "991", "OMP_NUM_THREADS": "2"}
    info = doctor_json(**launch)
    assert info["distkit"] == __version__
    assert info["os"] == platform.platform()
    assert 0 < info["ram_gib"]["available"] <= info["ram_gib"]["total"]
    assert info["torch_build"]["cuda"] == torch.version.cuda
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() or torch.version.cuda else None
    assert info["torch_build"]["nccl"] == (".".join(map(str, nccl)) if nccl else None)
    # every launcher variable set, and nothing else from the environment
    assert {k: v for k, v in info["environment"].items() if k in launch} == launch
    assert set(info["environment"]) - set(launch) <= {"CUDA_VISIBLE_DEVICES", "PJRT_DEVICE", "MASTER_PORT",
                                                      "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                                                      "TORCHELASTIC_RUN_ID"} | {
        k for k in info["environment"] if k.startswith("SLURM_")}
    # import distkit sets PYTORCH_NVML_BASED_CUDA_CHECK when the user has not (compat.py)
    assert "fork_safe_cuda_check" in info["compat_applied"]
    assert "fork_safe_cuda_check" not in doctor_json(PYTORCH_NVML_BASED_CUDA_CHECK="0")["compat_applied"]
    if torch.cuda.is_available():
        assert [g["name"] for g in info["gpus"]] == [torch.cuda.get_device_name(i)
                                                      for i in range(torch.cuda.device_count())]
        assert all(g["memory_gib"] > 0 for g in info["gpus"])
    else:  # nccl may be built into torch, but without a GPU it is not usable
        assert info["gpus"] == [] and "nccl" not in info["backends"] and "gloo" in info["backends"]


def test_a_logger_whose_package_is_missing_stops_before_any_process(monkeypatch, run_cli):
    from distkit import config as config_module
    from distkit.config import Config
    from distkit.errors import DistkitError

    monkeypatch.setitem(config_module.LOGGER_PACKAGES, "tensorboard", "distkit_no_such_package")
    with pytest.raises(DistkitError, match=r"--logger tensorboard needs the distkit_no_such_package package.*pip install"):
        Config(logger="tensorboard").validate()
    out = run_cli("train", "--logger", "wandb")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "invalid choice: 'wandb'" in out.stderr
