"""``distkit shard-check`` end to end, in a real subprocess spawning real gloo processes,
against an independent count of what each rank must see."""
from __future__ import annotations

import json

import pytest


def independent_count(n, world, global_batch, drop_last):
    """Per-rank samples, padding duplicates and samples left out, from DistributedSampler's
    rule (pad to a multiple of the world size) and DataLoader's (drop_last drops each rank's
    incomplete last batch), written without distkit."""
    per_rank = -(-n // world)
    b = global_batch // world
    seen = per_rank - per_rank % b if drop_last else per_rank
    return {"per_rank": seen, "padding": per_rank * world - n}


def check_against_independent_count(out, n, world, batch, drop_last):
    expected = independent_count(n, world, batch or 8 * world, drop_last)
    report = out["report"]
    for epoch, ep in zip(out["seen"], report["epochs"]):
        assert [len(r) for r in epoch] == [expected["per_rank"]] * world
        seen = [i for r in epoch for i in r]
        assert set(seen) <= set(range(n))
        if not drop_last:
            assert set(seen) == set(range(n))                       # full coverage
            assert len(seen) - len(set(seen)) == expected["padding"]  # only the padding repeats
        assert ep["ok"]
    assert report["expected"]["padding"] == expected["padding"]
    assert out["seen"][0] != out["seen"][1]                          # reshuffled (set_epoch)
    assert out["settings"]["sampler"] == "DistributedSampler"


def cli_args(n, world, batch, drop_last, *extra):
    args = ["shard-check", "--dataset-size", str(n), "--nproc-per-node", str(world), "--epochs", "2", *extra]
    if batch is not None:
        args += ["--batch-size", str(batch)]
    if drop_last:
        args.append("--drop-last")
    return args


def in_process(argv, capsys):
    """``distkit.commands.main(argv)`` in this process (its rank processes are still real,
    forked); returns (exit code, stdout, stderr)."""
    from distkit.commands import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_shard_check_command_line(run_cli):
    """The real console entry point, in a subprocess: 101 samples (does not divide by 2),
    drop_last."""
    done = run_cli(*cli_args(101, 2, 20, True, "--json"), timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    check_against_independent_count(json.loads(done.stdout.strip().splitlines()[-1]), 101, 2, 20, True)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, world, batch, drop_last", [
    (90, 3, None, False),   # divides, default batch (8 per process)
    (101, 2, 20, False),    # does not divide: one padding duplicate
    (100, 4, 40, True),     # divides, drop_last drops 5 per rank
    (7, 3, 3, False),       # fewer samples than a global batch: two padding duplicates
])
def test_shard_check_matches_an_independent_count(capsys, n, world, batch, drop_last):
    code, out, err = in_process(cli_args(n, world, batch, drop_last, "--json"), capsys)
    assert code == 0, err[-2000:]
    check_against_independent_count(json.loads(out.strip().splitlines()[-1]), n, world, batch, drop_last)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_planted_overlap_exits_nonzero(capsys):
    code, out, err = in_process(cli_args(101, 2, None, False, "--plant-overlap"), capsys)
    assert code == 1, out + err[-2000:]
    assert "shards overlap by 50 beyond the padding" in out
    assert "verdict: FAIL" in out


@pytest.mark.parametrize("args, message", [
    (["--dataset-size", "10", "--nproc-per-node", "0"], "--nproc-per-node must be >= 1"),
    (["--dataset-size", "0", "--nproc-per-node", "2"], "--dataset-size must be >= 1"),
    (["--dataset-size", "10", "--nproc-per-node", "4", "--batch-size", "3"], "smaller than --nproc-per-node 4"),
])
def test_bad_input_is_one_line(capsys, args, message):
    code, out, err = in_process(["shard-check", *args], capsys)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("distkit: error:")


def test_independent_count_itself():
    # the helper above, on cases worked out by hand
    assert independent_count(101, 2, 20, True) == {"per_rank": 50, "padding": 1}
    assert independent_count(90, 3, 24, False) == {"per_rank": 30, "padding": 0}
    assert independent_count(7, 3, 3, False) == {"per_rank": 3, "padding": 2}
    assert independent_count(100, 4, 40, True) == {"per_rank": 20, "padding": 0}
