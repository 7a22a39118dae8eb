"""Stop anywhere, resume exactly: drawn stop moments, stop kinds and settings.

Each case draws a run's settings (1, 2 or 3 processes on one node, or 2 nodes of 2 on
127.0.0.1; loader workers, persistent or not
(``--persistent-workers``), checkpoint interval dividing
the epoch or not, a per-iteration or per-epoch schedule, early stopping, the kit's step or
the task's own, ddp or fsdp) and a moment of its life (inside a step, before a checkpoint,
during validation, between validation and the schedule step, at an epoch's end, while the
last epoch reports) at which a real signal stops it (SIGTERM or SIGHUP to one rank, SIGKILL of one
rank or of every rank, or ``--max-iters``). The stopped run is resumed (from the checkpoint
its line names, else ``--resume-from latest``) and must end ``torch.equal`` to the same
settings run uninterrupted: weights, optimizer state, history, early stopping, best model;
or the kit refuses the resume in one line before training (a run stopped while reporting
has nothing left to train: its newest checkpoint must then equal the uninterrupted one's).

The signal is sent by the course task's own handler (tests/preemption_course.py,
``--set stop_at=...``), an ignite handler as a course would attach: no test hook in the kit.

Every case prints its seed and the one line that replays it. The quick suite draws
``QUICK_CASES`` cases, the full suite (``-m slow``) ``FULL_CASES``; uninterrupted runs are
cached per settings for the session. The data position at any ``num_workers``, persistent
workers and prefetch depth is drawn in process (no launcher), many cases per run.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from support import REPO_ROOT, subprocess_env, two_nodes

TESTS = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("STOP_ANYWHERE_SEED") or random.randrange(2 ** 32))
QUICK_CASES, FULL_CASES = 2, 12
# A case costs minutes of processes: a failing one is reported as drawn (its replay line),
# not shrunk through dozens more runs.
WITHOUT_SHRINKING = [Phase.explicit, Phase.generate]
EPOCHS, BATCH = 3, 12  # 96 samples: 8 iterations an epoch at any of 1, 2, 3 processes


def reproduce(case: dict | None = None) -> str:
    if case:
        return (f"seed {SEED}; replay this case with: STOP_ANYWHERE_CASE='{json.dumps(case)}' "
                "python -m pytest tests/train/test_stop_anywhere.py -k replay -p no:cacheprovider")
    return (f"seed {SEED}; draw these cases again with: STOP_ANYWHERE_SEED={SEED} python -m "
            "pytest tests/train/test_stop_anywhere.py -p no:cacheprovider")


def env() -> dict:
    path = os.pathsep.join([str(TESTS), str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return subprocess_env(PYTHONPATH=path)


# (processes per node, nodes): 2 x 2 is two ``distkit train --nnodes 2`` launchers on
# 127.0.0.1 sharing one output folder, as nodes share a cluster's file system. Its case
# costs some seconds more than a one-node case (two launchers, four ranks; measured in
# docs/testing.md), little enough to draw it as often as each one-node layout.
LAYOUTS = st.sampled_from([(1, 1), (2, 1), (3, 1), (2, 2)])
RUNS = st.fixed_dictionaries({
    "layout": LAYOUTS,
    "num_workers": st.sampled_from([0, 2]),
    "persistent_workers": st.booleans(),  # --persistent-workers, with workers only
    "checkpoint_every": st.sampled_from([4, 3]),  # dividing the epoch of 8, and not
    "schedule": st.sampled_from(["iteration", "epoch"]),
    "patience": st.sampled_from([0, 1]),
    "own_step": st.booleans(),
    "strategy": st.sampled_from(["ddp", "ddp", "fsdp"]),
}).map(lambda run: {**{k: v for k, v in run.items() if k != "layout"},
                     "nproc": run["layout"][0], "nnodes": run["layout"][1],
                     "persistent_workers": run["persistent_workers"] and run["num_workers"] > 0})
MOMENTS = st.one_of(
    st.builds(lambda n: f"step:{n}", st.integers(2, EPOCHS * 8)),
    st.builds(lambda n: f"checkpoint:{n}", st.integers(1, EPOCHS * 8)),
    st.builds(lambda e: f"validation:{e}", st.integers(1, EPOCHS)),
    st.builds(lambda e: f"judged:{e}", st.integers(1, EPOCHS)),
    st.builds(lambda e: f"epoch_end:{e}", st.integers(1, EPOCHS)),
    st.just("reporting:0"),
)
STOPS = st.fixed_dictionaries({
    "at": MOMENTS,
    "kind": st.sampled_from(["TERM", "HUP", "KILL-one", "KILL-every", "max-iters"]),
    "rank": st.integers(0, 3),
    "max_iters": st.integers(1, EPOCHS * 8 - 1),
})


def arguments(run: dict, out: str) -> list[str]:
    """``distkit train``'s flags for ``run`` (per node: ``nproc`` processes on each)."""
    task = "preemption_course:task_own_step" if run["own_step"] else "preemption_course:task"
    return ["--task", task,
            "--nproc-per-node", str(run["nproc"]), "--epochs", str(EPOCHS),
            "--batch-size", str(BATCH), "--checkpoint-every", str(run["checkpoint_every"]),
            "--num-workers", str(run["num_workers"]), "--strategy", run["strategy"],
            "--early-stopping-patience", str(run["patience"]),
            "--set", f"schedule={run['schedule']}", "--no-progress", "--timeout", "60",
            "--output-dir", out] + (["--persistent-workers"] if run.get("persistent_workers") else [])


def train(cwd: Path, run: dict, out: Path, extra=(), stop: dict | None = None,
          timeout=300) -> list[subprocess.CompletedProcess]:
    """``run`` trained into ``out``: each node's launcher, finished. Two nodes are two
    ``--nnodes 2`` launchers on 127.0.0.1 (tests/support.py's ``two_nodes``)."""
    args, environment = arguments(run, str(out)) + list(extra), {**env(), **(stop or {})}
    if run.get("nnodes", 1) == 1:
        return [subprocess.run([sys.executable, "-m", "distkit", "train", *args], cwd=cwd,
                               env=environment, text=True, capture_output=True, timeout=timeout,
                               start_new_session=True)]
    return [subprocess.CompletedProcess(args, code, stdout, stderr) for code, stdout, stderr
            in two_nodes(cwd, args, args, timeout=2 * timeout, env=environment)]


def final_state(run_dir: Path) -> dict:
    """What the invariant compares, from a run folder: the newest checkpoint (weights,
    optimizer, trainer, early stopping, history, the task's own) and the best model."""
    from distkit.checkpoint.saver import latest_checkpoint_in

    newest = latest_checkpoint_in(run_dir)
    ckpt = torch.load(newest, map_location="cpu", weights_only=True)
    keep = {k: v for k, v in ckpt.items() if k not in ("trainer", "history", "best_model")}
    history = [{k: v for k, v in h.items() if k == "epoch" or k.startswith("val_") or k == "lr"}
               for h in ckpt["history"]["epochs"]]
    trainer = {k: ckpt["trainer"][k] for k in ("iteration", "epoch_length", "max_epochs")}
    best = sorted((run_dir / "best").glob("*.pt"))
    best_model = (best[-1].name, torch.load(best[-1], map_location="cpu", weights_only=True)) \
        if best else None
    return {"saved": keep, "history": history, "trainer": trainer, "best": best_model}


def assert_equal(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_dirs(out: Path) -> list[Path]:
    return sorted((p for p in out.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)


class Uninterrupted(dict):
    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def __missing__(self, key):
        run = dict(key)
        out = self.folder / f"whole-{len(self)}"
        for node, done in enumerate(train(self.folder, run, out)):
            assert done.returncode == 0, f"node {node}: {done.stderr[-3000:]}"
        self[key] = state = final_state(run_dirs(out)[-1])
        return state


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return Uninterrupted(tmp_path_factory.mktemp("whole"))


def stop_env(stop: dict, run: dict) -> dict:
    """The course task's stop moment (tests/preemption_course.py's ``stop_here``)."""
    if stop["kind"] == "max-iters":
        return {}
    world = run["nproc"] * run.get("nnodes", 1)
    rank = -1 if stop["kind"] == "KILL-every" else stop["rank"] % world
    return {"STOP_AT": stop["at"], "STOP_SIGNAL": stop["kind"][:4], "STOP_RANK": str(rank)}


def check_case(run: dict, stop: dict, folder: Path, uninterrupted) -> None:
    case = {"run": run, "stop": stop}
    print(f"case {json.dumps(case)}; {reproduce(case)}", flush=True)
    try:
        stop_and_resume(run, stop, folder, uninterrupted)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{reproduce(case)}\n{reproduce()}") from None


def stop_and_resume(run: dict, stop: dict, folder: Path, uninterrupted) -> None:
    whole = uninterrupted[tuple(sorted(run.items()))]
    out = folder / "runs"
    cut = ["--max-iters", str(stop["max_iters"])] if stop["kind"] == "max-iters" else []
    first = train(folder, run, out, cut, stop=stop_env(stop, run))
    said = [ln for node in first for ln in node.stderr.splitlines() if ln.startswith("distkit:")]
    assert not any(" raised " in ln for ln in said), f"the run failed, not stopped: {said}"
    if all(node.returncode == 0 for node in first) and stop["kind"] != "max-iters":
        assert_equal(final_state(run_dirs(out)[-1]), whole, "run")  # the moment never came
        return
    named = re.search(r"--resume-from (\S+\.pt)", "".join(node.stderr for node in first))
    resume = named.group(1) if named and stop["kind"] in ("TERM", "HUP") else "latest"
    print(f"stopped, exit {[node.returncode for node in first]}; resuming from {resume}", flush=True)
    second = train(folder, run, out, ["--resume-from", resume])
    if any(node.returncode != 0 for node in second):  # refused: one line a node, before training
        for node in second:
            lines = [ln for ln in node.stderr.splitlines() if ln.startswith("distkit:")]
            assert node.returncode != 0 and len(lines) == 1 and "nothing to resume" in lines[0], \
                f"{said}\n{node.stderr[-3000:]}"
            print(f"refused: {lines[0]}", flush=True)
        assert_equal(final_state(run_dirs(out)[0]), whole, "stopped run")
        return
    assert_equal(final_state(run_dirs(out)[-1]), whole, "resumed run")


@pytest.mark.timeout(3600)
@seed(SEED)
@settings(max_examples=QUICK_CASES, deadline=None, database=None, phases=WITHOUT_SHRINKING,
          suppress_health_check=list(HealthCheck))
@given(run=RUNS, stop=STOPS)
def test_stopped_anywhere_and_resumed_ends_as_the_uninterrupted_run(run, stop, tmp_path_factory,
                                                                    uninterrupted):
    check_case(run, stop, tmp_path_factory.mktemp("case"), uninterrupted)


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("STOP_ANYWHERE_CASE"),
                    reason="replays the case STOP_ANYWHERE_CASE names (a failure prints it)")
def test_replay_one_case(tmp_path_factory, uninterrupted):
    case = json.loads(os.environ["STOP_ANYWHERE_CASE"])
    check_case(case["run"], case["stop"], tmp_path_factory.mktemp("case"), uninterrupted)


@pytest.mark.slow
@pytest.mark.timeout(7200)
@seed(SEED)
@settings(max_examples=FULL_CASES, deadline=None, database=None, phases=WITHOUT_SHRINKING,
          suppress_health_check=list(HealthCheck))
@given(run=RUNS, stop=STOPS)
def test_stopped_anywhere_many_cases(run, stop, tmp_path_factory, uninterrupted):
    check_case(run, stop, tmp_path_factory.mktemp("case"), uninterrupted)


def batches_seen(loader_settings: dict, stop_at: int | None = None, resume=None) -> tuple:
    """The batches (and one draw of torch's generator per step, as dropout makes) a kit
    ``Trainer`` sees over 3 epochs of 10 batches, stopped after ``stop_at`` iterations
    (its state returned) or resumed from ``resume``."""
    from ignite.engine import Events
    from torch.utils.data import DataLoader, TensorDataset

    from distkit.train.training import Trainer

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.arange(40).float()), batch_size=4, shuffle=True,
                        **loader_settings)
    seen, saved = [], {}

    def step(engine, batch):
        seen.append((batch[0].tolist(), float(torch.rand(1))))

    trainer = Trainer(step)
    if stop_at:
        @trainer.on(Events.ITERATION_COMPLETED(once=stop_at))
        def cut(engine):
            saved.update(trainer.state_dict())
            engine.terminate()
    if resume:
        trainer.load_state_dict(resume)
    trainer.run(loader, max_epochs=3)
    return seen, saved


LOADERS = st.one_of(
    st.just({"num_workers": 0}),
    st.builds(lambda persistent, prefetch: {"num_workers": 2, "persistent_workers": persistent,
                                            "prefetch_factor": prefetch},
              st.booleans(), st.integers(1, 4)))


@pytest.mark.timeout(900)
@seed(SEED)
@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(loader=LOADERS, stop_at=st.integers(1, 29))
def test_a_resumed_loader_goes_on_at_its_batch_with_any_workers(loader, stop_at):
    """The data position: mid-epoch or at an epoch's start, 0 or 2 workers, persistent or
    not, any prefetch depth: the stopped run's batches then the resumed run's are the
    uninterrupted run's, and so are the generator's draws in the step."""
    print(f"seed {SEED}: loader {loader}, stopped after iteration {stop_at}", flush=True)
    whole, _ = batches_seen(loader)
    first, state = batches_seen(loader, stop_at=stop_at)
    rest, _ = batches_seen(loader, resume=state)
    assert first + rest == whole, f"{reproduce()}; loader {loader}, stopped after {stop_at}"


@given(every=st.integers(1, 12), epoch_length=st.integers(1, 12))
@settings(max_examples=50, deadline=None, database=None)
def test_no_resumable_checkpoint_of_an_epochs_last_iteration_before_its_end(every, epoch_length):
    """``--checkpoint-every`` never saves an epoch's last iteration at ITERATION_COMPLETED:
    that file comes at the epoch's end, after validation and the schedule step."""
    from types import SimpleNamespace

    from distkit.train.training import inside_epochs_every

    engine = SimpleNamespace(state=SimpleNamespace(epoch_length=epoch_length))
    chosen = [i for i in range(1, 5 * epoch_length + 1) if inside_epochs_every(every)(engine, i)]
    assert all(i % every == 0 and i % epoch_length for i in chosen)
    assert len(chosen) == sum(1 for i in range(1, 5 * epoch_length + 1)
                              if i % every == 0 and i % epoch_length)
