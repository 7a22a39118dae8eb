"""Checks for exercise 04: 2 processes call ``get_dataset`` at the same moment, twice."""
import os

import pytest

import harness

pytestmark = pytest.mark.ex04


def on_rank(root):
    import ignite.distributed as idist

    ex = harness.load("04")
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
        outcome[-1]["downloads_so_far"] = downloads(os.path.join(root, "downloads.log"))
    return outcome


def downloads(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f if line.strip()]


def test_one_download_and_nobody_reads_too_early(tmp_path):
    root = str(tmp_path / "data")
    ranks = harness.run_ranks(on_rank, root)
    first = ranks[0][0].get("downloads_so_far") or downloads(os.path.join(root, "downloads.log"))
    if len(first) > 1:
        who = " and ".join(f"rank {r}" for r in sorted(first))
        raise harness.ExerciseFailure(
            f"{len(first)} processes downloaded the dataset ({who}), at the same time and into "
            f"the same file: let one process per node download first, inside "
            f"idist.one_rank_first(local=True), so the others then find it there")
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
    again = downloads(os.path.join(root, "downloads.log"))[len(first):]
    if again:
        raise harness.ExerciseFailure(
            f"the second call downloaded the dataset again (rank {again[0]}) although it was "
            f"already there: download only when is_downloaded(root) is False")
