"""Checks for exercise 04: 2 processes call ``get_dataset`` at the same moment, twice."""
import os
import time

import pytest

import harness

pytestmark = pytest.mark.ex04


def on_rank(root):
    import ignite.distributed as idist

    ex = harness.load("04")
    # Note when each download starts and ends (the given download still runs), to tell
    # downloads at the same time from downloads one after the other.
    real_download = ex.download

    def timed_download(where):
        start = time.time()
        try:
            real_download(where)
        finally:
            with open(times_file(root), "a") as f:
                f.write(f"{idist.get_rank()} {start} {time.time()}\n")

    ex.download = timed_download
    outcome = []
    for attempt in range(2):  # a second run finds the dataset already there
        idist.barrier()  # start together, as the processes of a real run do
        try:
            data = ex.get_dataset(root)
            complete = data is not None and bytes(data.tolist()) == ex.PAYLOAD
            outcome.append({"error": None, "complete": complete, "type": type(data).__name__})
        except ex.IncompleteDataset as error:
            outcome.append({"error": str(error)})
        # Every rank takes part in these collectives, whatever happened to it.
        if idist.all_reduce(float(outcome[-1]["error"] is not None)) > 0:
            break
        outcome[-1]["downloads_so_far"] = downloads(root)
    return outcome


def times_file(root):
    return root.rstrip("/") + "-download-times.txt"  # beside root: the learner's code owns root


def downloads(root):
    """``[(rank, start, end)]`` of every download so far."""
    if not os.path.exists(times_file(root)):
        return []
    with open(times_file(root)) as f:
        rows = [line.split() for line in f if line.strip()]
    return [(int(r), float(a), float(b)) for r, a, b in rows]


def test_one_download_and_nobody_reads_too_early(tmp_path):
    root = str(tmp_path / "data")
    ranks = harness.run_ranks(on_rank, root)
    first = ranks[0][0].get("downloads_so_far") or downloads(root)
    if len(first) > 1:
        first = sorted(first, key=lambda d: d[1])
        overlap = any(later[1] < earlier[2] for earlier, later in zip(first, first[1:]))
        if overlap:
            who = " and ".join(f"rank {r}" for r, _, _ in sorted(first))
            raise harness.ExerciseFailure(
                f"{len(first)} processes downloaded the dataset at the same time ({who}), into "
                f"the same file: let one process per node download first, inside "
                f"idist.one_rank_first(local=True), so the others then find it there")
        who = " and then ".join(f"rank {r}" for r, _, _ in first)
        raise harness.ExerciseFailure(
            f"{who} downloaded the dataset, one after the other: when the others enter the "
            f"block the file is already there, so download only when is_downloaded(root) is "
            f"False")
    for rank, outcome in enumerate(ranks):
        if outcome[0]["error"]:
            raise harness.ExerciseFailure(
                f"rank {rank} read the dataset before the download had finished "
                f"({outcome[0]['error']}): the other processes must wait until it is "
                f"complete; idist.one_rank_first(local=True) makes them wait")
    if not first:
        raise harness.ExerciseFailure(
            "nobody called download(root): download when is_downloaded(root) is False")
    for rank, outcome in enumerate(ranks):
        for attempt, o in enumerate(outcome):
            if o["error"]:
                raise harness.ExerciseFailure(f"rank {rank}, second call: {o['error']}")
            if not o["complete"]:
                raise harness.ExerciseFailure(
                    f"rank {rank} returned a {o['type']} that is not the dataset: "
                    f"return load(root)")
    again = downloads(root)[len(first):]
    if again:
        raise harness.ExerciseFailure(
            f"the second call downloaded the dataset again (rank {again[0][0]}) although it was "
            f"already there: download only when is_downloaded(root) is False")
