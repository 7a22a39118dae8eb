"""A checkpoint proves its contents before it is loaded (issue 31): bytes flipped anywhere
(inside a weight, in the pickle, in the zip directory), a truncated or empty file, a
missing checksum: never loaded, refused in one line naming the file; ``latest`` passes
over a damaged newest checkpoint and the resumed run ends bit-identical to an
uninterrupted one; "newest" is the iteration recorded, not a file time."""
from __future__ import annotations

import os
import random
import shutil
import zipfile

import pytest
import torch

from distkit.checkpoint.saver import (checksum_path, find_checkpoints, latest_checkpoint, load_checkpoint,
                                load_verified, write_checksum)
from distkit.errors import DistkitError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One real distkit checkpoint (a short 1-process run) and its sidecar."""
    from distkit.config import Config
    from distkit.launch.entry import run

    out = tmp_path_factory.mktemp("integrity")
    results = run(Config(backend="none", model="mlp", epochs=2, max_iters=30, progress_bar=False,
                         output_dir=str(out / "runs"), threads_per_process=1))
    return results


def regions(path) -> dict:
    """Byte ranges of a torch zip checkpoint: a weight tensor's data, the pickle, the
    central directory (read with zipfile; the layout is torch's)."""
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        directory = z.start_dir
    def data_range(info):
        with open(path, "rb") as f:
            f.seek(info.header_offset + 26)
            name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        start = info.header_offset + 30 + name_len + extra_len
        return start, start + info.compress_size

    pickle = next(i for i in infos if i.filename.endswith("data.pkl"))
    weight = max((i for i in infos if "/data/" in i.filename), key=lambda i: i.file_size)
    return {"weights": data_range(weight), "pickle": data_range(pickle),
            "zip directory": (directory, os.path.getsize(path))}


def flipped(src, dst, offsets):
    data = bytearray(open(src, "rb").read())
    for offset in offsets:
        data[offset] ^= 0xFF
    open(dst, "wb").write(bytes(data))
    shutil.copy(checksum_path(src), checksum_path(dst))  # the sidecar written with the original
    return dst


@pytest.fixture
def never_unpickled(monkeypatch):
    """torch.load must not run on a file that failed its checksum."""
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


@pytest.mark.parametrize("where", ["weights", "pickle", "zip directory"])
def test_bytes_flipped_anywhere_are_refused_naming_the_file(saved, tmp_path, where, never_unpickled):
    good = saved["last_checkpoint"]
    assert load_checkpoint(good)  # the original loads
    never_unpickled.clear()
    start, end = regions(good)[where]
    rng = random.Random(where)
    for n in range(25):  # 25 random places in the region, 1 to 4 bytes each
        bad = flipped(good, tmp_path / f"training_checkpoint_{n}.pt",
                      rng.sample(range(start, end), rng.randint(1, min(4, end - start))))
        with pytest.raises(DistkitError) as info:
            load_checkpoint(str(bad))
        message = str(info.value)
        assert "\n" not in message and str(bad) in message and "damaged" in message, message
        with pytest.raises(DistkitError, match="damaged"):
            load_verified(str(bad))
    assert never_unpickled == [], "torch.load ran on a damaged file"


def test_a_flipped_weight_loads_silently_without_the_checksum(saved, tmp_path):
    """Why the checksum: torch.load itself verifies nothing (the check above can fail)."""
    good = saved["last_checkpoint"]
    start, end = regions(good)["weights"]
    bad = flipped(good, tmp_path / "flipped.pt", [start + (end - start) // 2])
    a = torch.load(good, weights_only=True)["model"]
    b = torch.load(bad, weights_only=True)["model"]  # no error ...
    assert any(not torch.equal(a[k], b[k]) for k in a)  # ... and other weights


@pytest.mark.parametrize("cut", ["truncated", "zero length", "no checksum", "garbage checksum"])
def test_truncated_empty_or_unproven_files_are_refused(saved, tmp_path, cut, never_unpickled):
    good = saved["last_checkpoint"]
    bad = tmp_path / "training_checkpoint_9.pt"
    data = open(good, "rb").read()
    bad.write_bytes({"truncated": data[: len(data) // 2], "zero length": b""}.get(cut, data))
    if cut in ("truncated", "zero length"):
        shutil.copy(checksum_path(good), checksum_path(bad))
    elif cut == "garbage checksum":
        open(checksum_path(bad), "w").write("{not json")
    with pytest.raises(DistkitError) as info:
        load_checkpoint(str(bad))
    message = str(info.value)
    assert "\n" not in message and str(bad) in message, message
    assert ("bytes where" in message) if cut in ("truncated", "zero length") else \
        ("no checksum beside it" in message), message
    assert never_unpickled == []


def test_the_best_model_carries_a_checksum_too(saved):
    best = saved["best_model"]
    assert os.path.exists(checksum_path(best))
    state = load_verified(best)  # one object saved: ignite stores the model's state dict itself
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())


def test_newest_is_the_highest_iteration_recorded_not_the_file_time(tmp_path):
    folder = tmp_path / "runs" / "a" / "checkpoints"
    folder.mkdir(parents=True)
    for it in (23, 30):
        torch.save({"it": it}, folder / f"training_checkpoint_{it}.pt")
        write_checksum(folder / f"training_checkpoint_{it}.pt", it)
    # a `cp -r` restore copies in any order and renews the times: 23 now looks newer
    os.utime(folder / "training_checkpoint_30.pt", ns=(10**9, 10**9))
    assert latest_checkpoint(tmp_path / "runs").endswith("_30.pt")
    assert [p.name for p in find_checkpoints(tmp_path / "runs")] == [
        "training_checkpoint_23.pt", "training_checkpoint_30.pt"]


def test_a_removed_checkpoint_takes_its_checksum_with_it(saved):
    """ignite keeps the 2 newest checkpoints: the saver removes a sidecar with its file."""
    folder = os.path.dirname(saved["last_checkpoint"])
    names = sorted(os.listdir(folder))
    pts = [n for n in names if n.endswith(".pt")]
    assert len(pts) == 2, names
    assert sorted(n for n in names if not n.endswith(".pt")) == sorted(p + ".sha256" for p in pts)


@pytest.mark.timeout(300)
def test_latest_passes_over_a_damaged_newest_and_ends_bit_identical(tmp_path, capfd):
    from distkit.config import Config
    from distkit.launch.entry import run

    def config(out, **changes):
        return Config(backend="none", model="mlp", epochs=2, progress_bar=False,
                      output_dir=str(tmp_path / out), threads_per_process=1, **changes)

    whole = run(config("whole"))
    first = run(config("cut", max_iters=30, checkpoint_every=10))  # keeps iterations 23 and 30
    newest = first["last_checkpoint"]
    assert newest.endswith("_30.pt")
    start, end = regions(newest)["weights"]
    data = bytearray(open(newest, "rb").read())
    for offset in range(start + 7, start + 11):  # four bytes inside a weight tensor
        data[offset] ^= 0xFF
    open(newest, "wb").write(bytes(data))  # its sidecar stays as it was written
    capfd.readouterr()
    resumed = run(config("cut", resume_from="latest"))
    err = capfd.readouterr().err
    warnings = [ln for ln in err.splitlines() if "newer checkpoint(s) do not load" in ln]
    assert len(warnings) == 1 and newest in warnings[0] and "damaged" in warnings[0], err
    assert "_23.pt" in warnings[0]  # what it fell back to
    a = torch.load(whole["last_checkpoint"], weights_only=True)["model"]
    b = torch.load(resumed["last_checkpoint"], weights_only=True)["model"]
    assert resumed["iterations"] == whole["iterations"]
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resuming past a damaged file"


def _remove_on_rank_1_only(local_rank, folder):
    import ignite.distributed as idist

    from distkit.checkpoint.saver import checkpoint_saver

    saver = checkpoint_saver(folder)
    if idist.get_rank() == 0:
        saver({"w": torch.ones(3)}, "x.pt")
    idist.barrier()
    if idist.get_rank() == 1:
        saver.remove("x.pt")  # ignite calls remove on every rank; only the saving rank acts
    idist.barrier()
    return sorted(os.listdir(folder))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_only_the_saving_rank_removes_a_checksum(tmp_path):
    """Every rank runs ignite's Checkpoint, which calls the saver's remove on every rank:
    another rank removing the sidecar raced the saving rank (FileNotFoundError seen in a
    2-process run) and could take the sidecar of a file just saved under the same name."""
    from distkit.launch.entry import launch_function

    left = launch_function(_remove_on_rank_1_only, str(tmp_path), backend="gloo",
                           nproc_per_node=2, threads_per_process=1)
    assert left == ["x.pt", "x.pt.sha256"], left
