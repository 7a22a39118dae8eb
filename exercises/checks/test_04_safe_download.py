"""Checks for exercise 04: every process of a run calls ``get_dataset`` at the same moment,
twice, in every layout: 1 process (no process group), 2 and 3 processes on one node, and
2 nodes x 2 processes where EACH NODE HAS ITS OWN FOLDER (its own disk), as on a cluster
without a shared file system. So "once per node" and "once in the whole run" differ: on
2 x 2, one download for the whole run leaves the second node without its dataset. On
2 x 2 two more calls follow, each after one node's disk lost the dataset (node 1's, then
node 0's) while the other's still holds it: the nodes disagree about what is on disk, and
only a node that looks at its own disk downloads where (and only where) it must.

A download starts, and later holds its half-written file, only once every other process of
the node waits in a collective (a barrier), downloads too, or has given up (at most
``HOLD_S`` each time): so a process that may download but did not yet look always races
the first, and one that waits a time of its own (a sleep, or polling ``is_downloaded()``,
True as soon as the file exists) always reads the file too early, however fast the
download would have been. What each process returns is compared with the reference's
``load``."""
import os
import shutil
import sys
import tempfile
import time

import pytest

import harness

pytestmark = pytest.mark.ex04


def node_root(base, node):
    return os.path.join(base, f"node{node}", "data")


DATA_FILE = "numbers.bin"  # the given code's file (the stub's and the reference's)


HOLD_S = 3.0  # the longest a download waits for the node's other processes, before and half-way
COLLECTIVES = ("barrier", "all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter",
               "monitored_barrier", "all_gather_object", "broadcast_object_list")


class HeldTime:
    """The exercise's ``time`` module, except that the given download's sleep (while its
    file is half written) first holds (:func:`hold`)."""

    def __init__(self, real, state):
        self._real, self._state = real, state

    def __getattr__(self, name):
        return getattr(self._real, name)

    def sleep(self, seconds):
        if self._state.get("downloading"):
            hold(self._state)
        self._real.sleep(seconds)


def hold(state):
    """Wait until every other process of the node is in a collective, downloading, or out
    of get_dataset; at most HOLD_S."""
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline and not all(
            any(os.path.exists(os.path.join(state["marks"], f"{kind}{rank}"))
                for kind in ("wait", "download", "left"))
            for rank in state["others"]):
        time.sleep(0.01)


def mark(state, kind):
    """Note, for the node's other processes, that this one is in a collective ("wait"),
    downloading ("download") or out of get_dataset ("left")."""
    if state.get("marks"):
        open(os.path.join(state["marks"], f"{kind}{state['rank']}"), "w").close()


def on_rank(base):
    """What the learner's ``get_dataset`` did on this rank, call after call: whether it
    waited in a collective, what it returned or raised, and the downloads into this node's
    folder (paths relative to ``base``), as plain data."""
    import ignite.distributed as idist

    ex = harness.load("04")
    root = node_root(base, idist.get_node_rank())  # this node's own disk
    node, per_node, rank = idist.get_node_rank(), idist.get_nproc_per_node(), idist.get_rank()
    state = {"rank": rank, "others": [r for r in range(node * per_node, (node + 1) * per_node) if r != rank]}
    # Note when each download starts and ends (the given download still runs), to tell
    # downloads at the same time from downloads one after the other.
    real_download = ex.download

    def timed_download(where):
        mark(state, "download")
        hold(state)  # before the file exists: whoever may download decides now
        start = time.time()
        state["downloading"] = True
        try:
            real_download(where)
        finally:
            state["downloading"] = False
            with open(times_file(root), "a") as f:
                f.write(f"{idist.get_rank()} {start} {time.time()} {os.path.relpath(where, base)}\n")

    ex.download = timed_download
    real_time = ex.time
    ex.time = HeldTime(real_time, state)
    outcome = []
    # a first run finds no dataset, a second finds it; with several nodes, two more find it
    # on one node only (the other's disk was wiped): the nodes disagree about what is there
    lacking = [None, None] + ([1, 0] if idist.get_nnodes() > 1 else [])
    for attempt, wiped in enumerate(lacking):
        idist.barrier()  # start together, as the processes of a real run do
        dataset = os.path.join(root, DATA_FILE)
        if wiped is not None and node == wiped and idist.get_local_rank() == 0 and os.path.exists(dataset):
            os.remove(dataset)
        state["marks"] = f"{root.rstrip('/')}-marks{attempt}"  # beside root: the learner owns root
        os.makedirs(state["marks"], exist_ok=True)
        before = len(downloads(root))
        idist.barrier()
        outcome.append(one_call(ex, root, state))
        # Every rank takes part in these collectives, whatever happened to it.
        failed = idist.all_reduce(float(outcome[-1]["error"] is not None)) > 0
        outcome[-1]["downloads_now"] = downloads(root)[before:]  # this call's, into this node's folder
        if failed:
            break
        idist.barrier()
        outcome[-1]["downloads_so_far"] = downloads(root)
    return {"outcome": outcome, "downloads_at_end": downloads(root)}


def one_call(ex, root, state):
    """Call the answer's get_dataset once, noting whether it waited in a collective."""
    import torch.distributed as dist

    waited = []
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def noting(name, original):
        def call(*args, **kwargs):  # a collective: this process waits for the others here
            waited.append(name)
            mark(state, "wait")
            return original(*args, **kwargs)
        return call

    for name, original in saved.items():
        setattr(dist, name, noting(name, original))
    try:
        data = ex.get_dataset(root)
        return {"error": None, "returned": returned(data), "waited": bool(waited)}
    except ex.IncompleteDataset as error:
        return {"error": str(error), "waited": bool(waited)}
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
        mark(state, "left")


def returned(data):
    """What ``get_dataset`` returned, for the judge: a tensor as it is, anything else in words."""
    import torch

    if isinstance(data, torch.Tensor):
        return data.detach().cpu().as_subclass(torch.Tensor)
    shown = harness.describe(data)
    if data is not None and not isinstance(data, (list, tuple)):
        shown = f"{shown} ({type(data).__name__})"
    return shown


def returned_problem(data, payload):
    """None when ``data`` (what :func:`returned` made of what a call returned) is the
    dataset as the reference's load() returns it (``payload``, a uint8 tensor of its
    bytes), else what it is."""
    import torch

    if not isinstance(data, torch.Tensor):
        return f"{data}, not the dataset ({harness.describe(payload)})"
    return harness.difference(payload, data, what="the dataset")


def times_file(root):
    return root.rstrip("/") + "-download-times.txt"  # beside root: the learner's code owns root


def downloads(root):
    """``[(rank, start, end)]`` of every download into this node's folder so far."""
    if not os.path.exists(times_file(root)):
        return []
    with open(times_file(root)) as f:
        rows = [line.split() for line in f if line.strip()]
    return [(int(r[0]), float(r[1]), float(r[2]), " ".join(r[3:])) for r in rows]


def judge_layout(layout, ranks):
    """The learner's message for the first thing wrong in one layout (``ranks``: what
    :func:`merged` gives for each rank)."""
    nodes = sorted({r["node"] for r in ranks})
    on = f"on {layout}"
    for node in nodes:
        members = [rank for rank, r in enumerate(ranks) if r["node"] == node]
        where = f"{on}, node {node} (ranks {members[0]}..{members[-1]}, its own folder)" if len(nodes) > 1 else on
        root = node_root("", node)  # where its downloads go, relative to the run's folder
        first = ranks[members[0]]["outcome"][0].get("downloads_so_far") or ranks[members[0]]["downloads_at_end"]
        elsewhere = [d for d in first if d[3] != root]
        if elsewhere:
            raise harness.ExerciseFailure(
                f"{where}: {_downloaded_into(first)}, not into root ({root}): "
                + (f"{len(first)} downloads on one node where one is enough. " if len(first) > 1 else "the "
                   "node's other processes look for the dataset in root. ") +
                f"Download into root itself, once per node (local rank 0, inside "
                f"idist.one_rank_first(local=True)); the node's other processes then find it there")
        if len(first) > 1:
            first = sorted(first, key=lambda d: d[1])
            overlap = any(later[1] < earlier[2] for earlier, later in zip(first, first[1:]))
            if overlap:
                who = " and ".join(f"rank {d[0]}" for d in sorted(first))
                raise harness.ExerciseFailure(
                    f"{where}: {len(first)} processes downloaded the dataset at the same time ({who}), into "
                    f"the same file: let one process per node download first, inside "
                    f"idist.one_rank_first(local=True), so the others then find it there"
                    + (" (idist.one_rank_first() without local=True lets rank 0 of the whole run go first, "
                       "then every other rank at once: on the other nodes' own disks nothing is there yet)"
                       if len(nodes) > 1 and node > 0 else ""))
            who = " and then ".join(f"rank {d[0]}" for d in first)
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
                how = ("" if outcome[0]["waited"] else
                       " (it waited in no collective: a sleep, or polling is_downloaded(), which is True as "
                       "soon as the file EXISTS, while it is still being written, waits a time of its own, "
                       "never until the download is complete)")
                raise harness.ExerciseFailure(
                    f"{where}: rank {rank} read the dataset before the download had finished "
                    f"({outcome[0]['error']}){how}: the other processes must wait until it is "
                    f"complete; idist.one_rank_first(local=True) makes them wait at a barrier")
        if not first:
            raise harness.ExerciseFailure(
                f"{where}: nobody called download(root): download when is_downloaded(root) is False")
        if any(len(ranks[rank]["outcome"]) < 2 for rank in members):
            continue  # a process of another node failed the first call: its message comes
        for rank in members:
            for o in ranks[rank]["outcome"][:2]:
                if o["error"]:
                    raise harness.ExerciseFailure(f"{where}: rank {rank}, second call: {o['error']}")
                if o["problem"]:
                    raise harness.ExerciseFailure(
                        f"{where}: rank {rank} returned {o['problem']}: return load(root)")
        again = ranks[members[0]]["outcome"][1]["downloads_now"]
        if again:
            raise harness.ExerciseFailure(
                f"{where}: the second call downloaded the dataset again (rank {again[0][0]}) although it was "
                f"already there: download only when is_downloaded(root) is False")
    for attempt in range(2, len(ranks[0]["outcome"])):
        disagreeing(on, ranks, attempt)


def disagreeing(on, ranks, attempt):
    """The calls where one node's disk lacks the dataset and the others' hold it: the node
    that lacks it downloads once, the others not at all, every process loads it."""
    lacking = ranks[0]["outcome"][attempt]["lacking"]
    holding = sorted({r["node"] for r in ranks} - {lacking})
    scene = (f"{on}, call {attempt + 1}: node {lacking}'s disk had lost the dataset while node"
             f"{'s' if len(holding) > 1 else ''} {', '.join(map(str, holding))} still held it")
    advice = ("the nodes disagree about what is on disk, so each node decides from its OWN disk: "
              "is_downloaded(root) looked at on that node (by its local rank 0, inside "
              "idist.one_rank_first(local=True)), not an answer from rank 0 or combined over the nodes")
    for node in sorted({r["node"] for r in ranks}):
        members = [rank for rank, r in enumerate(ranks) if r["node"] == node]
        outcomes = [ranks[rank]["outcome"] for rank in members]
        if any(len(o) <= attempt for o in outcomes):
            continue  # an earlier call of this node failed: another rank's message comes
        now = next((o[attempt].get("downloads_now") for o in outcomes if "downloads_now" in o[attempt]), [])
        if node != lacking and now:
            raise harness.ExerciseFailure(
                f"{scene}: rank {now[0][0]} downloaded it again on node {node}, where it was there: {advice}")
        for rank, o in zip(members, outcomes):
            if o[attempt]["error"]:
                cause = (f"nobody on node {node} downloaded it" if node == lacking and not now
                         else "it was read before the download had finished")
                raise harness.ExerciseFailure(
                    f"{scene}: rank {rank} (node {node}) found no complete dataset ({o[attempt]['error']}): "
                    f"{cause}. " + advice[0].upper() + advice[1:])
            if o[attempt]["problem"]:
                raise harness.ExerciseFailure(f"{scene}: rank {rank} returned {o[attempt]['problem']}: "
                                              f"return load(root)")
        if node == lacking and len(now) > 1:
            raise harness.ExerciseFailure(
                f"{scene}: node {node} downloaded it {len(now)} times (ranks "
                f"{', '.join(str(d[0]) for d in now)}): once per node is enough. " + advice[0].upper() + advice[1:])


def _downloaded_into(found):
    """'rank 0 downloaded into node0/data/rank0 and rank 1 into node0/data/rank1'."""
    parts = [f"rank {d[0]} into {d[3]}" for d in sorted(found)]
    return parts[0].replace(" into ", " downloaded into ", 1) + "".join(f" and {p}" for p in parts[1:])


def test_one_download_per_node_and_nobody_reads_too_early():
    harness.judge_here(sys.modules[__name__], PARTS, harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# The reference's half is the dataset its load() returns, for each rank of the layout: the
# check judges the learner's downloads by their moments, as no run of the reference's
# get_dataset could show (and one would double the check's time).

PARTS = tuple(layout[0] for layout in harness.MULTI_FIRST)


def collect(part, whos, seed):
    """``{who: {"ranks": [what each rank did], "datasets": [the distinct tensors returned]}}``
    in the layout ``part`` names, on fresh folders (one per node)."""
    layout = harness.MULTI_FIRST[PARTS.index(part)]
    found = {}
    if harness.LEARNER in whos:
        base = fresh_folder(part)
        try:
            found[harness.LEARNER] = distinct_datasets(harness.run_layouts(on_rank, base, layouts=[layout])[part])
        finally:
            shutil.rmtree(base, ignore_errors=True)
    if harness.REFERENCE in whos:
        import torch

        payload = torch.frombuffer(bytearray(harness.load_reference("04").PAYLOAD), dtype=torch.uint8)
        world, per_node = layout[1] * layout[2], layout[2]
        found[harness.REFERENCE] = {"ranks": [{"node": rank // per_node} for rank in range(world)],
                                    "datasets": [payload]}
    return found


def fresh_folder(part):
    """A new folder for one layout's disks, named by digits only: the learner's messages quote
    its paths, and a class's report groups the same mistake by its text less the digits."""
    base = os.path.join(tempfile.gettempdir(), f"distkit-check-04-{os.getpid()}-{PARTS.index(part)}")
    try:
        os.makedirs(base)
    except FileExistsError:  # left by an earlier process of the same id
        base = tempfile.mkdtemp(prefix="distkit-check-04-")
    return base


def distinct_datasets(ranks):
    """``ranks`` with each returned tensor replaced by its index in a list of the distinct
    ones: every process returns the same 16 KiB, sent once."""
    import torch

    datasets = []
    for r in ranks:
        for o in r["outcome"]:
            data = o.get("returned")
            if isinstance(data, torch.Tensor):
                same = [i for i, d in enumerate(datasets) if d.dtype == data.dtype and d.shape == data.shape
                        and torch.equal(d, data)]
                o["returned"] = same[0] if same else len(datasets)
                if not same:
                    datasets.append(data)
    return {"ranks": ranks, "datasets": datasets}


def merged(part, got, expected):
    """What :func:`judge_layout` judges, for each rank: the learner's calls, each with what
    its return is not (``problem``) and which node's disk had lost the dataset before it;
    where the rank ran (the layout says that, not the learner's data)."""
    nnodes = harness.MULTI_FIRST[PARTS.index(part)][1]
    lacking = [None, None] + ([1, 0] if nnodes > 1 else [])
    payload, datasets = expected["datasets"][0], got["datasets"]
    ranks = []
    for r, e in zip(harness.same_ranks(got["ranks"], expected["ranks"]), expected["ranks"]):
        outcome = [{**o, "lacking": wiped} for o, wiped in zip(r["outcome"], lacking)]
        for o in outcome:
            if o["error"] is None:
                data = o["returned"]
                o["problem"] = returned_problem(datasets[data] if type(data) is int else data, payload)
        ranks.append({"node": e["node"], "outcome": outcome, "downloads_at_end": r["downloads_at_end"]})
    return ranks


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    judge_layout(part, merged(part, got, expected))
