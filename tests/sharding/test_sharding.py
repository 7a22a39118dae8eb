"""distkit.sharding: the report against an independent model of DistributedSampler, and
the real gather in real gloo processes (shuffle off: exact indices; shuffle on: counts)."""
from __future__ import annotations

import math

import pytest
import torch

from distkit.sharding import expected_counts, format_report, shard_report


def reference_shards(n, world, per_rank_batch, drop_last, offset=0):
    """What each rank must see, written from DistributedSampler's documented rule and
    independent of distkit: pad the index list by repeating it from the start until it
    divides by the world size, deal it out round-robin, then (drop_last) cut each rank's
    incomplete last batch."""
    indices = list(range(n))
    total = math.ceil(n / world) * world
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    shards = [indices[r:total:world] for r in range(world)]
    if drop_last:
        shards = [s[: len(s) // per_rank_batch * per_rank_batch] for s in shards]
    return shards


def record(seen, n, world, per_rank_batch, drop_last=False, set_epoch=True):
    return {"dataset_size": n, "world_size": world, "batch_size": per_rank_batch * world,
            "per_rank_batch_size": per_rank_batch, "drop_last": drop_last, "sampler": "test",
            "shuffle": False, "set_epoch": set_epoch, "seen": seen}


@pytest.mark.parametrize("n, world, b, drop_last, per_rank, padding, seen_per_rank", [
    (100, 4, 5, False, 25, 0, 25),     # divides
    (101, 2, 10, False, 51, 1, 51),    # does not divide: one padding duplicate
    (101, 2, 10, True, 51, 1, 50),     # ... and drop_last cuts the 51st
    (7, 3, 2, False, 3, 2, 3),
    (1, 4, 1, False, 1, 3, 1),         # fewer samples than ranks: index 0 four times
    (1000, 8, 16, True, 125, 0, 112),
])
def test_expected_counts(n, world, b, drop_last, per_rank, padding, seen_per_rank):
    exp = expected_counts(n, world, b, drop_last)
    assert (exp["samples_per_rank"], exp["padding"], exp["seen_per_rank"]) == (per_rank, padding, seen_per_rank)
    assert len(reference_shards(n, world, b, drop_last)[0]) == seen_per_rank


@pytest.mark.parametrize("n, world, b, drop_last", [
    (100, 4, 5, False), (101, 2, 10, False), (101, 2, 10, True), (7, 3, 2, False),
    (50, 3, 4, True), (50, 3, 16, True), (1000, 8, 16, True)])
def test_expected_duplicates_and_unseen_match_the_reference(n, world, b, drop_last):
    # Under the loader's drop_last the padding duplicate may be what is dropped (101 on 2
    # ranks, batches of 10: rank 1's 51st sample is the repeat): the report must not
    # expect a duplicate then, and must count exactly the samples nobody sees.
    shards = reference_shards(n, world, b, drop_last)
    seen = [i for s in shards for i in s]
    exp = expected_counts(n, world, b, drop_last)
    assert exp["padding_seen"] == len(seen) - len(set(seen))
    assert exp["unseen"] == n - len(set(seen))


def test_report_under_drop_last_expects_no_duplicate():
    shards = reference_shards(101, 2, 10, True)
    text = format_report(shard_report(record([shards], 101, 2, 10, drop_last=True)))
    assert "1 padding duplicate(s) of which the loader's drop_last drops 1 (0 seen), 1 sample(s) unseen" \
        in text, text
    text = format_report(shard_report(record([reference_shards(101, 2, 10, False)], 101, 2, 10)))
    assert "expected: 51 samples per rank, 1 padding duplicate(s), 0 sample(s) unseen" in text, text


@pytest.mark.parametrize("n, world, b, drop_last", [
    (100, 4, 5, False), (101, 2, 10, False), (101, 2, 10, True), (7, 3, 2, False),
    (1, 4, 1, False), (50, 3, 4, True)])
def test_correct_shards_pass(n, world, b, drop_last):
    shards = reference_shards(n, world, b, drop_last)
    report = shard_report(record([shards, shards], n, world, b, drop_last))
    assert report["ok"], report
    ep = report["epochs"][0]
    assert ep["per_rank"] == [len(s) for s in shards]
    assert ep["duplicates"] == sum(map(len, shards)) - len({i for s in shards for i in s})
    assert ep["overlap_beyond_padding"] == 0
    assert report["order_changes_between_epochs"] == [False]  # same order twice


def test_overlap_beyond_padding_fails():
    shards = reference_shards(101, 2, 10, False)
    planted = [shards[0], list(shards[0])]          # rank 1 reads rank 0's shard
    report = shard_report(record([planted], 101, 2, 10))
    assert not report["ok"] and not report["disjoint"]
    assert report["epochs"][0]["overlap_beyond_padding"] == 50   # 51 repeats, 1 allowed
    # a single duplicate beyond the padding is enough: rank 1 reads rank 0's index 2
    # instead of its own 99
    one_more = [shards[0], shards[1][:-2] + [2, shards[1][-1]]]
    assert shard_report(record([one_more], 101, 2, 10))["epochs"][0]["overlap_beyond_padding"] == 1
    assert not shard_report(record([one_more], 101, 2, 10))["ok"]


def test_missing_and_out_of_range_samples_fail():
    shards = reference_shards(100, 2, 10, False)
    missing = [shards[0][:-1], shards[1]]
    assert not shard_report(record([missing], 100, 2, 10))["ok"]
    # ... unless drop_last explains it: 50 per rank in batches of 20 drops 10 per rank
    cut = reference_shards(100, 2, 20, True)
    assert shard_report(record([cut], 100, 2, 20, drop_last=True))["ok"]
    outside = [shards[0][:-1] + [100], shards[1]]
    report = shard_report(record([outside], 100, 2, 10))
    assert not report["ok"] and report["epochs"][0]["out_of_range"] == [100]


def test_order_change_is_reported_per_epoch():
    a = reference_shards(20, 2, 5, False)
    b = [list(reversed(s)) for s in a]
    report = shard_report(record([a, b, b], 20, 2, 5))
    assert report["order_changes_between_epochs"] == [True, False] and report["ok"]


# ---------------------------------------------------------------- real processes

class Squares(torch.utils.data.Dataset):
    """A map-style dataset the kit knows nothing about."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i * i


CASES = [(100, 10, False), (101, 10, False), (101, 20, True), (23, 6, False)]


def _worker(local_rank):
    import ignite.distributed as idist

    from distkit.sharding import (collect_indices, describe_loader, gather_variable,
                                  rank_zero_sampler)

    out = {"exact": {}, "shuffled": {}}
    for n, batch, drop_last in CASES:
        dataset = Squares() if n == 23 else torch.utils.data.TensorDataset(torch.arange(n), torch.zeros(n))
        out["exact"][(n, batch, drop_last)] = collect_indices(
            dataset, batch_size=batch, epochs=1, drop_last=drop_last, shuffle=False)
        out["shuffled"][(n, batch, drop_last)] = collect_indices(
            dataset, batch_size=batch, epochs=2, drop_last=drop_last)
    out["frozen"] = collect_indices(Squares(), batch_size=6, epochs=2, set_epoch=False)
    out["planted"] = collect_indices(Squares(), batch_size=6, epochs=1, sampler=rank_zero_sampler(Squares()))
    out["gather"] = [t.tolist() for t in gather_variable(torch.arange(idist.get_rank() + 1))]
    loader = idist.auto_dataloader(Squares(), batch_size=7, num_workers=3, shuffle=True)
    out["settings"] = describe_loader(loader, 7, 3)
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gathered_indices_in_real_processes(world):
    import warnings

    from distkit.sharding import run_on_ranks

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ignite warns about the planted sampler's rank
        out = run_on_ranks(_worker, world, start_method="fork")

    for (n, batch, drop_last), rec in out["exact"].items():
        b = batch // world
        assert rec["seen"][0] == reference_shards(n, world, b, drop_last), (n, batch, drop_last)
        assert shard_report(rec)["ok"]
    for (n, batch, drop_last), rec in out["shuffled"].items():
        b = batch // world
        expected = reference_shards(n, world, b, drop_last)
        report = shard_report(rec)
        assert report["ok"], report
        for ep in report["epochs"]:
            assert ep["per_rank"] == [len(s) for s in expected]
            if not drop_last:  # every sample, plus exactly the padding
                assert ep["missing"] == 0
                assert ep["duplicates"] == math.ceil(n / world) * world - n
        assert report["order_changes_between_epochs"] == [True]   # set_epoch was called

    assert shard_report(out["frozen"])["order_changes_between_epochs"] == [False]
    planted = shard_report(out["planted"])
    assert not planted["ok"] and planted["epochs"][0]["overlap_beyond_padding"] > 0
    assert out["gather"] == [list(range(r + 1)) for r in range(world)]

    s = out["settings"]
    assert s["per_rank_batch_size"] == 7 // world and s["effective_global_batch_size"] == 7 // world * world
    assert s["per_process_num_workers"] == math.ceil(3 / world)
    assert s["sampler"] == "DistributedSampler" and s["sampler_num_replicas"] == world
    assert s["pin_memory"] is False
    assert any("does not divide" in note for note in s["notes"])


# ---------------------------------------------------------------- a loader as it is

class Iterable(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def _loader_worker(local_rank):
    import ignite.distributed as idist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from distkit.errors import DistkitError
    from distkit.sharding import collect_loader_indices

    data = TensorDataset(torch.arange(101.0), torch.zeros(101))
    auto = idist.auto_dataloader(data, batch_size=20, shuffle=True, drop_last=True)
    out = {
        # the loop forgets set_epoch: nothing in the check calls it for the loop
        "forgot": collect_loader_indices(auto, epochs=3),
        # the loop calls it, as distkit.train.training does on every EPOCH_STARTED
        "calls": collect_loader_indices(auto, epochs=3, on_epoch=auto.sampler.set_epoch),
        # a plain DataLoader: no DistributedSampler, every rank reads everything
        "unsharded": collect_loader_indices(DataLoader(data, batch_size=10, shuffle=True), epochs=2),
        # automatic batching off: the sampler yields single indices
        "unbatched": collect_loader_indices(DataLoader(data, batch_size=None, sampler=DistributedSampler(
            data, idist.get_world_size(), idist.get_rank(), shuffle=False)), epochs=1),
    }
    try:
        collect_loader_indices(DataLoader(Iterable(), batch_size=2))
    except DistkitError as e:
        out["iterable"] = str(e)
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_loader_is_checked_as_it_is():
    from distkit.sharding import run_on_ranks

    out = run_on_ranks(_loader_worker, 2, start_method="fork")

    forgot = shard_report(out["forgot"])
    # its own drop_last: 51 samples per rank in batches of 10 -> 50 seen
    assert forgot["drop_last"] and all(ep["per_rank"] == [50, 50] for ep in forgot["epochs"])
    assert forgot["ok"] and forgot["frozen_order"]
    assert forgot["order_changes_between_epochs"] == [False, False]
    assert "set_epoch=NOT called" in format_report(forgot)
    assert "WARNING: the sampler shuffles but every epoch replays the same order" in format_report(forgot)

    calls = shard_report(out["calls"])
    assert calls["ok"] and not calls["frozen_order"]
    assert calls["order_changes_between_epochs"] == [True, True]
    assert "verdict: OK" in format_report(calls) and "WARNING" not in format_report(calls)

    unsharded = shard_report(out["unsharded"])
    assert not unsharded["ok"] and unsharded["sampler"] == "RandomSampler"
    # both ranks read all 101: 101 repeats, 0 padding allowed (101 per rank expected 51)
    assert unsharded["epochs"][0]["per_rank"] == [101, 101]
    assert unsharded["epochs"][0]["overlap_beyond_padding"] == 101 - unsharded["expected"]["padding"]

    unbatched = shard_report(out["unbatched"])
    assert unbatched["ok"] and unbatched["epochs"][0]["per_rank"] == [51, 51]
    assert unbatched["epochs"][0]["duplicates"] == 1          # the padding
    assert out["unbatched"]["seen"][0] == reference_shards(101, 2, 1, False)

    assert "IterableDataset" in out["iterable"]


def test_frozen_order_needs_a_shuffling_sampler_and_enough_samples():
    a = reference_shards(20, 2, 5, False)
    shuffled = dict(record([a, a], 20, 2, 5), shuffle=True)
    assert shard_report(shuffled)["frozen_order"]
    assert not shard_report(record([a, a], 20, 2, 5))["frozen_order"]        # shuffle=False
    assert not shard_report(dict(shuffled, seen=[a]))["frozen_order"]          # one epoch
    tiny = reference_shards(2, 2, 1, False)                                    # 2 orders only
    assert not shard_report(dict(record([tiny, tiny], 2, 2, 1), shuffle=True))["frozen_order"]


# ---------------------------------------------------------------- docstrings run

def docstring_example(doc: str) -> str:
    """The indented block after the first line ending in '::'."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip() + "\n"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("module", ["distkit.sharding", "distkit.launch.runner"])
def test_docstring_example_runs_as_a_script_under_spawn(tmp_path, module):
    import importlib
    import subprocess
    import sys

    from support import subprocess_env

    script = tmp_path / "example.py"
    script.write_text(docstring_example(importlib.import_module(module).__doc__))
    assert 'if __name__ == "__main__":' in script.read_text()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    if module == "distkit.sharding":
        assert done.stdout.count("verdict: OK") == 2 and done.stdout.count("WARNING: the sampler") == 1
        assert "ignite.distributed" not in done.stderr   # ignite's INFO lines stay quiet
    else:
        assert "[(0, 2), (1, 2)]" in done.stdout


def test_quiet_ignite_logs_restores_levels():
    import logging

    from distkit.host.facts import IGNITE_LOGGERS, quiet_ignite_logs

    before = {n: logging.getLogger(n).level for n in IGNITE_LOGGERS}
    with quiet_ignite_logs():
        assert all(logging.getLogger(n).getEffectiveLevel() == logging.WARNING for n in IGNITE_LOGGERS)
    assert {n: logging.getLogger(n).level for n in IGNITE_LOGGERS} == before


QUIET_THEN_LOUD = """
import torch, ignite.distributed as idist
from distkit.host.facts import quiet_ignite_logs
data = torch.utils.data.TensorDataset(torch.arange(8.0))
with quiet_ignite_logs():
    idist.auto_dataloader(data, batch_size=4)   # hidden
print("RESTORED", flush=True)
idist.auto_dataloader(data, batch_size=4)       # ignite's INFO line again, as without distkit
"""


@pytest.mark.timeout(120)
def test_ignite_logs_again_after_the_block():
    import subprocess
    import sys

    from support import subprocess_env

    done = subprocess.run([sys.executable, "-c", QUIET_THEN_LOUD], env=subprocess_env(),
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("auto_dataloader INFO: Use data loader kwargs") == 1, done.stderr


def test_machine_doctests_pass():
    import doctest

    import distkit.host.facts

    result = doctest.testmod(distkit.host.facts)
    assert result.attempted >= 4 and result.failed == 0
