"""Every bad input of DESIGN.md's list, through the real command line: one line on stderr
naming the problem and the fix, a non-zero exit, within seconds, nothing written."""
from __future__ import annotations

import socket

import pytest
import torch

from distkit.config import Config
from distkit.errors import DistkitError
from distkit.launch.checks import preflight

from support import assert_one_line_error, within_seconds

# "within seconds": 30 s on a quiet machine, scaled by how long starting torch takes now
# (conftest.within_seconds), so a loaded 2-core machine does not fail a correct error path





@pytest.mark.parametrize("args, words", [
    (["--backend", "mpi"], ["--backend", "invalid choice", "gloo"]),
    (["--backend", "nccl"], ["nccl needs CUDA", "--backend gloo"]),
    (["--backend", "xla-tpu"], ["torch_xla", "requirements-xla.txt"]),
    (["--nproc-per-node", "4", "--batch-size", "3"], ["--batch-size 3", "world size 4"]),
    (["--nnodes", "2", "--node-rank", "0"], ["--master-addr"]),
    (["--nnodes", "2", "--master-addr", "127.0.0.1"], ["--node-rank"]),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"], ["out of range", "0 to 1"]),
    (["--resume-from", "nowhere.pt"], ["no such file", "checkpoints"]),
    (["--epochs", "0"], ["--epochs"]),
    # NaN and infinity: `nan <= 0` is False, so they used to pass (exit 0, garbage model)
    (["--lr", "nan"], ["--lr must be a finite number > 0", "got nan"]),
    (["--timeout", "inf"], ["--timeout must be a finite number", "the default 120"]),
    (["--timeout", "0"], ["--timeout must be", "got 0.0"]),
    (["--warmup-epochs", "nan"], ["--warmup-epochs must be a finite number"]),
    (["--persistent-workers"], ["--persistent-workers", "--num-workers 0", "--num-workers 2"]),
    (["--seed", "-1"], ["--seed must be a whole number from 0 to 4294967295", "got -1"]),
    (["--nproc-per-node", "2", "--batch-size", "3"], ["--batch-size 3", "world size 2", "2 or 4"]),
    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "no-such-host.invalid"],
     ["--master-addr 'no-such-host.invalid' does not resolve", "--node-rank 0"]),
    (["--dataset", "synthetic", "--dataset-size", "1000000000"],
     ["--dataset-size 1000000000 needs about", "GiB", "use --dataset-size"]),
])
def test_bad_input_is_one_line(run_cli, tmp_path, args, words):
    result = run_cli("train", "--output-dir", tmp_path / "runs", *args, timeout=within_seconds())
    assert_one_line_error(result, *words, tmp_path=tmp_path)


def test_output_dir_that_is_a_file(run_cli, tmp_path):
    (tmp_path / "runs").write_text("a file, not a folder")
    result = run_cli("train", "--output-dir", tmp_path / "runs" / "sub", timeout=within_seconds())
    assert_one_line_error(result, "--output-dir", "is a file, not a folder")
    assert (tmp_path / "runs").read_text() == "a file, not a folder"


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this user cannot write: chmod for a normal user; root ignores modes, so
    there a read-only tmpfs is mounted (skipped where mounting is not allowed)."""
    import os
    import subprocess

    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o500)
        yield path
        path.chmod(0o700)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("root without permission to mount a read-only tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_output_dir_not_writable(run_cli, tmp_path, read_only_dir):
    result = run_cli("train", "--output-dir", read_only_dir / "runs", timeout=within_seconds())
    assert_one_line_error(result, "--output-dir", "is not writable", "a folder you can write to")
    assert list(read_only_dir.iterdir()) == []


def test_port_in_use(run_cli, tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("train", "--output-dir", tmp_path / "runs", "--master-port", port,
                         "--nproc-per-node", "2", timeout=within_seconds())
    assert_one_line_error(result, f"--master-port {port}", "in use", tmp_path=tmp_path)


def test_garbage_checkpoint(run_cli, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--resume-from", bad, timeout=within_seconds())
    assert_one_line_error(result, str(bad), "no checksum beside it", tmp_path=tmp_path)
    from distkit.checkpoint.saver import write_checksum

    write_checksum(bad)  # it proves its bytes, and they are still not a checkpoint
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--resume-from", bad, timeout=within_seconds())
    assert_one_line_error(result, "not a loadable checkpoint", tmp_path=tmp_path)


def write_checkpoint(path, model_name, iteration, epoch_length=23, max_epochs=2, **entries):
    """A file shaped like distkit's checkpoints, for a model of the given name, recording
    the settings of a default 2-process run; ``entries`` replace whole entries."""
    from distkit.checkpoint.saver import resume_settings, write_checksum
    from distkit.builtin.models import get_model

    model = get_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = {"trainer": {"iteration": iteration, "epoch_length": epoch_length,
                        "max_epochs": max_epochs},
            "model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": {},
            "settings": resume_settings(Config(epochs=max_epochs), f"digits/{model_name}", 2)}
    ckpt.update(entries)
    torch.save(ckpt, path)
    write_checksum(path, iteration)  # as distkit's saver does: the file proves its contents
    return path


def test_checkpoint_of_another_model(run_cli, tmp_path):
    other = write_checkpoint(tmp_path / "mlp.pt", "mlp", iteration=5)
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--model", "cnn",
                     "--resume-from", other, timeout=within_seconds())
    assert_one_line_error(result, "another model", "--model cnn", tmp_path=tmp_path)


def test_checkpoint_of_a_finished_run(run_cli, tmp_path):
    done = write_checkpoint(tmp_path / "done.pt", "cnn", iteration=46)  # 2 x 23: all done
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--resume-from", done, timeout=within_seconds())
    assert_one_line_error(result, "finished run", "all 2 epochs", tmp_path=tmp_path)


# --- resuming: a changed flag is refused, naming it; crafted files are one line --------

@pytest.mark.parametrize("args, words", [
    # the lr schedule comes back from the checkpoint: 5 epochs would train 3-5 at lr 0
    (["--epochs", "5"], ["--epochs = 2", "has 5", "resume with --epochs 2"]),
    # the epoch length comes back too: each "epoch" would see half the data
    (["--batch-size", "32"], ["--batch-size = 64", "has 32", "resume with --batch-size 64"]),
    # another world size is resharded (tests/checkpoint/test_resume_layout.py), but the global
    # batch stays the checkpoint's, so the new world size must divide it
    (["--nproc-per-node", "3"], ["--batch-size 64", "world size 3", "resume on 2 or 4 processes"]),
])
def test_resume_with_a_changed_setting_is_refused_naming_the_flag(run_cli, tmp_path, args, words):
    ckpt = write_checkpoint(tmp_path / "mid.pt", "cnn", iteration=30)
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--epochs", 2,
                     "--resume-from", ckpt, *args, timeout=within_seconds())
    assert_one_line_error(result, "--resume-from", *words, tmp_path=tmp_path)


@pytest.mark.parametrize("changes, words", [
    ({"dataset": "synthetic"}, ["'digits/cnn'", "'synthetic/cnn'", "the task 'digits/cnn'"]),
    ({"lr": 0.1}, ["--lr = 0.05", "has 0.1"]),
    ({"seed": 3}, ["--seed = 0", "has 3"]),
    ({"scale_lr": True}, ["--scale-lr = False", "resume with no --scale-lr"]),
    ({"warmup_epochs": 1.0}, ["--warmup-epochs"]),
    ({"momentum": 0.5}, ["Config.momentum"]),
])
def test_every_setting_the_checkpoint_restores_must_match(tmp_path, changes, words):
    from distkit.checkpoint.saver import check_checkpoint_fits

    ckpt = write_checkpoint(tmp_path / "mid.pt", "cnn", iteration=30)
    check_checkpoint_fits(str(ckpt), Config(epochs=2), world_size=2)  # the same: accepted
    with pytest.raises(DistkitError) as info:
        check_checkpoint_fits(str(ckpt), Config(epochs=2, **changes), world_size=2)
    for word in words:
        assert word in str(info.value), str(info.value)


CRAFTED = [
    ({"trainer": {}}, ["'trainer' state lacks iteration, epoch_length, max_epochs"]),
    ({"model": torch.zeros(3)}, ["'model' entry is a Tensor, not a state dict"]),
    ({"model": {"conv1.weight": "text"}}, ["holds weights for another model"]),
    ({"optimizer": {"state": {}}}, ["'optimizer' state lacks param_groups"]),
    ({"trainer": {"iteration": -1, "epoch_length": 23, "max_epochs": 2}}, ["trainer state is not"]),
    ({"settings": None}, ["does not record the settings"]),
]


@pytest.mark.parametrize("entries, words", CRAFTED[:2])  # the two, through the CLI
def test_crafted_checkpoint_is_one_line(run_cli, tmp_path, entries, words):
    ckpt = write_checkpoint(tmp_path / "crafted.pt", "cnn", iteration=30, **entries)
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--epochs", 2,
                     "--resume-from", ckpt, timeout=within_seconds())
    assert_one_line_error(result, f"--resume-from {str(ckpt)!r}", *words, tmp_path=tmp_path)


@pytest.mark.parametrize("entries, words", CRAFTED)
def test_crafted_checkpoint_is_refused_before_any_process_starts(tmp_path, entries, words):
    from distkit.checkpoint.saver import check_checkpoint_fits

    ckpt = write_checkpoint(tmp_path / "crafted.pt", "cnn", iteration=30, **entries)
    with pytest.raises(DistkitError) as info:
        check_checkpoint_fits(str(ckpt), Config(epochs=2), world_size=2)
    assert "\n" not in str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_resume_from_latest_falls_back_past_a_corrupt_newest_checkpoint(run_cli, tmp_path):
    """The newest file is garbage (a disk error, a copy cut short): the previous one is
    used, and the run says so. That one ends a finished run here, so the run stops in
    preflight, in seconds, after saying which file it fell back to."""
    import os

    runs = tmp_path / "runs"
    (runs / "a" / "checkpoints").mkdir(parents=True)
    good = write_checkpoint(runs / "a" / "checkpoints" / "training_checkpoint_46.pt", "cnn", 46)
    (runs / "b" / "checkpoints").mkdir(parents=True)
    bad = runs / "b" / "checkpoints" / "training_checkpoint_50.pt"
    bad.write_bytes(good.read_bytes()[:5000])  # truncated
    bad.with_name(bad.name + ".sha256").write_bytes(
        good.with_name(good.name + ".sha256").read_bytes().replace(b": 46}", b": 50}"))
    os.utime(good, ns=(1_000_000_000, 1_000_000_000))  # older
    result = run_cli("train", "--output-dir", runs, "--resume-from", "latest", timeout=within_seconds())
    assert_one_line_error(result, "--resume-from latest", "finished run", str(good))
    assert f"1 newer checkpoint(s) do not load (newest: {bad}: damaged: 5000 bytes where" \
        in result.stderr
    assert f"falling back to {good}" in result.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["a", "b"]  # nothing new written


def test_resume_from_latest_resolves_to_the_newest_loadable(tmp_path, capsys):
    import os

    from distkit.checkpoint.saver import resolve_resume_from, write_checksum

    runs = tmp_path / "runs"
    (runs / "a" / "checkpoints").mkdir(parents=True)
    good = write_checkpoint(runs / "a" / "checkpoints" / "training_checkpoint_30.pt", "cnn", 30)
    os.utime(good, ns=(1_000_000_000, 1_000_000_000))
    (runs / "a" / "checkpoints" / "training_checkpoint_40.pt").write_bytes(b"garbage")
    write_checksum(runs / "a" / "checkpoints" / "training_checkpoint_40.pt")
    config = Config(output_dir=str(runs), resume_from="latest")
    assert resolve_resume_from(config).resume_from == str(good)
    assert "falling back to" in capsys.readouterr().err
    good.write_bytes(b"garbage too")
    write_checksum(good)
    with pytest.raises(DistkitError, match="none of the 2 checkpoint"):
        resolve_resume_from(config)


def test_dataset_that_needs_a_download_while_offline(run_cli, tmp_path):
    # This machine (and CI) cannot reach the dataset mirrors: the run must say so, and
    # point to the offline default, instead of hanging or printing a traceback.
    result = run_cli("train", "--output-dir", tmp_path / "runs", "--dataset", "mnist",
                     "--data-dir", tmp_path / "data", timeout=60)
    assert_one_line_error(result, "'mnist'", "--dataset digits", tmp_path=tmp_path)


def test_more_processes_than_gpus_for_nccl(monkeypatch):
    # No GPU here, so the real check cannot run: pretend torch sees 1 GPU, ask for 2.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DistkitError, match=r"--nproc-per-node 2 with nccl needs 2 GPUs .* has 1"):
        preflight(Config(backend="nccl", nproc_per_node=2), spawning=True)
