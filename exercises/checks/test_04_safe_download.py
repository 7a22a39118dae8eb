"""Checks for exercise 04: every process of a run calls ``get_dataset`` at the same moment,
twice, in every layout: 1 process (no process group), 2 and 3 processes on one node, and
2 nodes x 2 processes where EACH NODE HAS ITS OWN FOLDER (its own disk), as on a cluster
without a shared file system. So "once per node" and "once in the whole run" differ: on
2 x 2, one download for the whole run leaves the second node without its dataset."""
import os
import time

import pytest

import harness

pytestmark = pytest.mark.ex04


def node_root(base, node):
    return os.path.join(base, f"node{node}", "data")


def on_rank(base):
    import ignite.distributed as idist

    ex = harness.load("04")
    root = node_root(base, idist.get_node_rank())  # this node's own disk
    # Note when each download starts and ends (the given download still runs), to tell
    # downloads at the same time from downloads one after the other.
    real_download = ex.download

    def timed_download(where):
        start = time.time()
        try:
            real_download(where)
        finally:
            with open(times_file(root), "a") as f:
                f.write(f"{idist.get_rank()} {start} {time.time()} {os.path.abspath(where)}\n")

    ex.download = timed_download
    outcome = []
    for attempt in range(2):  # a second run finds the dataset already there
        idist.barrier()  # start together, as the processes of a real run do
        try:
            data = ex.get_dataset(root)
            try:  # whatever the answer returned
                complete = bytes(data.tolist()) == ex.PAYLOAD
            except Exception:
                complete = False
            outcome.append({"error": None, "complete": complete, "type": type(data).__name__})
        except ex.IncompleteDataset as error:
            outcome.append({"error": str(error)})
        # Every rank takes part in these collectives, whatever happened to it.
        if idist.all_reduce(float(outcome[-1]["error"] is not None)) > 0:
            break
        idist.barrier()
        outcome[-1]["downloads_so_far"] = downloads(root)
    return {"outcome": outcome, "node": idist.get_node_rank()}


def times_file(root):
    return root.rstrip("/") + "-download-times.txt"  # beside root: the learner's code owns root


def downloads(root):
    """``[(rank, start, end)]`` of every download into this node's folder so far."""
    if not os.path.exists(times_file(root)):
        return []
    with open(times_file(root)) as f:
        rows = [line.split() for line in f if line.strip()]
    return [(int(r[0]), float(r[1]), float(r[2])) for r in rows]


def judge(layout, ranks, base):
    nodes = sorted({r["node"] for r in ranks})
    on = f"on {layout}"
    for node in nodes:
        members = [rank for rank, r in enumerate(ranks) if r["node"] == node]
        where = f"{on}, node {node} (ranks {members[0]}..{members[-1]}, its own folder)" if len(nodes) > 1 else on
        root = node_root(base, node)
        first = ranks[members[0]]["outcome"][0].get("downloads_so_far") or downloads(root)
        if len(first) > 1:
            first = sorted(first, key=lambda d: d[1])
            overlap = any(later[1] < earlier[2] for earlier, later in zip(first, first[1:]))
            if overlap:
                who = " and ".join(f"rank {r}" for r, _, _ in sorted(first))
                raise harness.ExerciseFailure(
                    f"{where}: {len(first)} processes downloaded the dataset at the same time ({who}), into "
                    f"the same file: let one process per node download first, inside "
                    f"idist.one_rank_first(local=True), so the others then find it there"
                    + (" (idist.one_rank_first() without local=True lets rank 0 of the whole run go first, "
                       "then every other rank at once: on the other nodes' own disks nothing is there yet)"
                       if len(nodes) > 1 and node > 0 else ""))
            who = " and then ".join(f"rank {r}" for r, _, _ in first)
            raise harness.ExerciseFailure(
                f"{where}: {who} downloaded the dataset, one after the other: when the others enter the "
                f"block the file is already there, so download only when is_downloaded(root) is False")
        for rank in members:
            outcome = ranks[rank]["outcome"]
            if outcome[0]["error"]:
                if not first:
                    raise harness.ExerciseFailure(
                        f"{where}: nobody downloaded the dataset into this node's folder, and rank {rank} found "
                        f"none ({outcome[0]['error']}). Each node has its own disk here: the download must "
                        f"happen once PER NODE (local rank 0, idist.one_rank_first(local=True)), not once in the "
                        f"whole run (rank 0)")
                raise harness.ExerciseFailure(
                    f"{where}: rank {rank} read the dataset before the download had finished "
                    f"({outcome[0]['error']}): the other processes must wait until it is "
                    f"complete; idist.one_rank_first(local=True) makes them wait")
        if not first:
            raise harness.ExerciseFailure(
                f"{where}: nobody called download(root): download when is_downloaded(root) is False")
        for rank in members:
            for o in ranks[rank]["outcome"]:
                if o["error"]:
                    raise harness.ExerciseFailure(f"{where}: rank {rank}, second call: {o['error']}")
                if not o["complete"]:
                    raise harness.ExerciseFailure(
                        f"{where}: rank {rank} returned a {o['type']} that is not the dataset: return load(root)")
        again = downloads(root)[len(first):]
        if again:
            raise harness.ExerciseFailure(
                f"{where}: the second call downloaded the dataset again (rank {again[0][0]}) although it was "
                f"already there: download only when is_downloaded(root) is False")


def test_one_download_per_node_and_nobody_reads_too_early(tmp_path):
    for index, layout in enumerate(harness.MULTI_FIRST):
        base = str(tmp_path / f"run{index}")  # every layout its own fresh disks
        for name, ranks in harness.each_layout(on_rank, base, layouts=[layout]):
            judge(name, ranks, base)
