"""Checks for exercise 07: in every layout (1 process with no process group, 2 and 3
processes, 2 nodes x 2 processes sharing one checkpoint folder, as nodes share a cluster's
file system), a run stopped after STOP iterations and resumed from its checkpoint must end
with exactly the weights of a run that never stopped, and its folder must hold the files
the task asks for: the last 2, each numbered by the iteration it holds."""
import os
import re
import sys

import pytest
import torch
import torch.nn as nn
from distkit.builtin.data import synthetic_dataset
from distkit.train.training import Trainer
from ignite.engine import Events, supervised_training_step

import harness

pytestmark = pytest.mark.ex07

EPOCHS = 3
# 32 samples, global batch 8: 4 steps per epoch on 1, 2 and 4 processes, 6 on 3 (a batch
# of 2 per rank, 11 samples each with the sampler's padding)
STOP = 7  # in the middle of epoch 2, and odd: a checkpoint every 2 iterations misses it


def setup(seed):
    """A fresh process's training objects; ``seed`` sets the initial weights."""
    import ignite.distributed as idist

    dataset = synthetic_dataset(32, num_classes=4, shape=(1, 4, 4), noise=0.5, seed=0)
    if idist.get_world_size() > 1:
        loader = idist.auto_dataloader(dataset, batch_size=8, shuffle=True)
    else:
        # One process: auto_dataloader's RandomSampler resumed mid-epoch in another order
        # (measured: the solution's resumed weights differed by 0.064), which is the data
        # order's business, not this exercise's; a sampler of one replica orders by epoch.
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(
            dataset, num_replicas=1, rank=0, shuffle=True))
    torch.manual_seed(seed)
    model = idist.auto_model(nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(),
                                           nn.Linear(16, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # A DeterministicEngine (distkit's Trainer): a run resumed mid-epoch skips the batches
    # it already trained on.
    trainer = Trainer(supervised_training_step(model, optimizer, nn.CrossEntropyLoss()))
    trainer.add_event_handler(
            Events.EPOCH_STARTED, lambda engine: loader.sampler.set_epoch(engine.state.epoch - 1))
    return trainer, model, optimizer, loader


def momentum(optimizer):
    buffers = [s.get("momentum_buffer") for s in optimizer.state.values()]
    buffers = [b.reshape(-1) for b in buffers if b is not None]
    return torch.cat(buffers) if buffers else torch.zeros(0)


def same(a, b):
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
        and a.dtype == b.dtype and torch.allclose(a, b, rtol=0, atol=1e-6)


def on_rank(dirname, whos):
    """``{who: report}``: the reference's is the check's own run that never stopped (no
    answer's code in it), the learner's the run stopped and resumed with its functions."""
    found = {}
    if harness.REFERENCE in whos:
        found[harness.REFERENCE] = uninterrupted()
    if harness.LEARNER in whos:
        found[harness.LEARNER] = stopped_and_resumed(dirname)
    return found


def uninterrupted():
    """The weights after iterations STOP - 1, STOP and the last, and the momentum after
    STOP, of a run that never stopped; and how many iterations it ran."""
    trainer, model, optimizer, loader = setup(seed=0)
    seen = {}

    def note(engine):
        if engine.state.iteration in (STOP - 1, STOP):
            seen[engine.state.iteration] = (harness.flat_weights(model), momentum(optimizer))

    trainer.add_event_handler(Events.ITERATION_COMPLETED, note)
    trainer.run(loader, max_epochs=EPOCHS)
    return {"uninterrupted": harness.flat_weights(model), "total": EPOCHS * len(loader),
            "before_stop": seen[STOP - 1][0], "at_stop": seen[STOP][0], "momentum_at_stop": seen[STOP][1]}


def stopped_and_resumed(dirname):
    """The learner's run stopped after STOP iterations and resumed from its checkpoint in
    a fresh process's objects: what it left and did, as plain data."""
    import ignite.distributed as idist
    from ignite.handlers import Checkpoint

    ex = harness.load("07")
    report = {"dirname": dirname}
    trainer, model, optimizer, loader = setup(seed=0)
    try:
        checkpoint = ex.attach_checkpointing(trainer, model, optimizer, dirname)
        report["returned"] = type(checkpoint).__name__
        # Every rank holds a Checkpoint before any trains, or none trains: ignite's
        # Checkpoint runs a collective when it saves, which a rank without one never
        # joins (the ranks then waited on each other, and the timeout hid this message).
        if idist.all_reduce(float(not isinstance(checkpoint, Checkpoint))) > 0:
            return report

        def stop(engine):
            # What a crash right after iteration STOP would leave: the files now. (A
            # terminate still fires COMPLETED, where a crash fires nothing.) Added after
            # the learner's handlers, so their save for this iteration is done.
            if idist.get_rank() == 0:
                report["files_at_stop"] = saved_files(ex, dirname)
            engine.terminate()

        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=STOP), stop)
        trainer.run(loader, max_epochs=EPOCHS)
    except (FileNotFoundError, FileExistsError) as error:
        raise harness.ExerciseFailure(
            f"rank {idist.get_rank()} raised {type(error).__name__} while the Checkpoint saved or "
            f"removed a file ({error}): more than one rank writes the same checkpoint files "
            f"(and folder), and one created or deleted what another just had. Create the "
            f"Checkpoint on every rank but let ONE rank write: DiskSaver writes on rank 0 by "
            f"default, so do not pass it save_on_rank=idist.get_rank()") from None
    stopped_weights, stopped_momentum = harness.flat_weights(model), momentum(optimizer)
    report["returned"] = type(checkpoint).__name__
    last = checkpoint.last_checkpoint if isinstance(checkpoint, Checkpoint) else None
    report["last"] = None if last is None else str(last)
    if idist.get_rank() == 0:  # DiskSaver writes on rank 0: what is in the folder now
        report["files"] = saved_files(ex, dirname)
    idist.barrier()  # the file of the last iteration is written (by one rank) before anyone looks
    report["last_exists"] = last is not None and os.path.exists(str(last))
    # every rank stops here, or none does
    if idist.all_reduce(float(last is None or not report["last_exists"])) > 0:
        return report

    trainer, model, optimizer, loader = setup(seed=1)  # a new process: other random weights
    # A resumed run saves again, into the folder that holds the checkpoints it resumes from.
    try:
        ex.attach_checkpointing(trainer, model, optimizer, dirname)
    except Exception as error:  # noqa: BLE001 - the learner's error becomes the message
        report["attach_again"] = f"{type(error).__name__}: {str(error).strip()[:300]}"
    if idist.all_reduce(float("attach_again" in report)) > 0:
        return report
    ex.resume(trainer, model, optimizer, str(last))
    report["resumed_iteration"] = trainer.state.iteration
    report["restored"], report["restored_momentum"] = harness.flat_weights(model), momentum(optimizer)
    # whether to train on: decided here, judged by the grader against the reference's run
    ok = (report["resumed_iteration"] == STOP and same(report["restored"], stopped_weights)
          and same(report["restored_momentum"], stopped_momentum))
    if idist.all_reduce(float(not ok)) > 0:
        return report
    ran = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: ran.append(1))
    trainer.run(loader, max_epochs=EPOCHS)
    report["ran_after_resume"] = len(ran)
    report["resumed_final"] = harness.flat_weights(model)
    return report


def saved_files(ex, dirname):
    """``[(file name, the trainer's iteration in it, or None)]``, oldest first."""
    if not os.path.isdir(dirname):
        return []
    found = []
    for name in sorted(f for f in os.listdir(dirname) if f.endswith(".pt")):
        try:
            content = ex.read_checkpoint(os.path.join(dirname, name))
        except Exception as error:  # noqa: BLE001 - reported by the parent
            found.append((name, f"error: {type(error).__name__}"))
            continue
        trainer = content.get("trainer") if isinstance(content, dict) else None
        iteration = trainer.get("iteration") if isinstance(trainer, dict) else None
        found.append((name, iteration if isinstance(iteration, int) else None))  # plain data only
    return sorted(found, key=lambda f: f[1] if isinstance(f[1], int) else -1)


def file_number(name):
    """The number in a checkpoint file's name (``checkpoint_7.pt``: 7), or None."""
    found = re.search(r"_(-?\d+)\.pt$", name)
    return int(found.group(1)) if found else None


def numbering(files, per_epoch):
    """'' when every file is numbered by the iteration it holds (what Checkpoint does by
    itself for a handler on ITERATION_COMPLETED), else what the numbers are instead. The
    numbers are Checkpoint's priorities: it keeps the files of the highest numbers and
    writes no file whose name it already wrote, so a number that is not the iteration
    keeps other files than the last ones."""
    held = [(name, file_number(name), iteration) for name, iteration in files if isinstance(iteration, int)]
    if not held or any(number is None for _, number, _ in held) or all(n == i for _, n, i in held):
        return ""
    shown = ", ".join(f"{name} holds iteration {iteration}" for name, _, iteration in held[-3:])
    fix = ("number each file by the iteration it holds: for a handler on Events.ITERATION_COMPLETED "
           "Checkpoint does so by itself, or give it a global_step_transform that returns the trainer's "
           "iteration")
    epochs = [(iteration - 1) // per_epoch + 1 for _, _, iteration in held]
    if [n for _, n, _ in held] == epochs:
        return (f"the checkpoint files are numbered by epoch ({shown}): Checkpoint writes no file under a "
                f"name it already wrote and keeps the files of the highest numbers, so within an epoch "
                f"only its first iteration is saved and a run that stops mid-epoch resumes from there; {fix}")
    offsets = {n - i for _, n, i in held}
    if len(offsets) == 1:
        offset = offsets.pop()
        return (f"the checkpoint files are numbered {abs(offset)} {'above' if offset > 0 else 'below'} the "
                f"iteration they hold ({shown}): whoever resumes from checkpoint_N.pt expects iteration N "
                f"in it; {fix}")
    return (f"the checkpoint files are numbered otherwise than by the iteration they hold ({shown}): "
            f"Checkpoint keeps the files of the highest numbers, so numbers that do not grow with the "
            f"iteration keep other files than the last 2; {fix}")


# what the learner's run reports; where the rank ran and what a run that never stopped
# ends with come from the reference's run, whether the weights were restored is decided here
REPORTED = ("dirname", "returned", "last", "files", "files_at_stop", "last_exists", "attach_again",
            "resumed_iteration", "ran_after_resume", "resumed_final")


def merged(got, expected):
    """Per rank, what :func:`judge_run` judges: the learner's report, with the reference's
    run's iterations and weights, and whether the learner's resumed state is the state of
    a run that never stopped, after STOP iterations."""
    ranks = []
    for g, e in zip(harness.same_ranks(got, expected), expected):
        r = {key: g[key] for key in REPORTED if key in g}
        r.update(total=e["total"], uninterrupted=e["uninterrupted"])
        if "restored" in g:
            r.update(weights_restored=same(g["restored"], e["at_stop"]),
                     restored_previous=same(g["restored"], e["before_stop"]),
                     momentum_restored=same(g.get("restored_momentum"), e["momentum_at_stop"]))
        ranks.append(r)
    return ranks


def judge_run(dirname, ranks, fail):
    for rank, r in enumerate(ranks):
        if r["returned"] != "Checkpoint" and all(other["returned"] == r["returned"] for other in ranks):
            shown = "None" if r["returned"] == "NoneType" else f"a {r['returned']}"
            raise fail(
                f"on every rank attach_checkpointing returned {shown}, not the Checkpoint: return the "
                f"ignite.handlers.Checkpoint you attached to the trainer (the run and the resume use it)")
        if r["returned"] != "Checkpoint":
            raise fail(
                f"on rank {rank} attach_checkpointing returned {r['returned']}: create the "
                f"ignite.handlers.Checkpoint on EVERY rank (its DiskSaver writes on rank 0 only) "
                f"and return it")
    if any(r["last"] is None for r in ranks):
        raise fail(f"the run stopped after {STOP} iterations without saving a checkpoint: "
                   f"attach the Checkpoint to the trainer at Events.ITERATION_COMPLETED")
    files = ranks[0].get("files", [])
    for rank, r in enumerate(ranks):
        if r.get("last_exists") is False and r.get("last"):
            shown = os.path.relpath(r["last"], dirname) if r["last"].startswith(dirname) else r["last"]
            raise fail(f"on rank {rank} the Checkpoint says it saved {shown} (in {dirname}), but there "
                       f"is no such file: no rank of this run wrote it there. The DiskSaver writes on ONE "
                       f"rank, save_on_rank (0 by default), which must exist whatever the world size "
                       f"(save_on_rank=1 has no rank with 1 process): leave save_on_rank at its default; "
                       f"and every rank names the same folder (one every node sees), since every rank "
                       f"resumes from that one file")
    if not files:
        raise fail(f"no checkpoint file in {dirname}: save into the dirname you are given")
    for name, iteration in files:
        if isinstance(iteration, str):
            raise fail(f"{name} does not load with weights_only=True ({iteration[7:]}): save "
                       f"state dicts, as ignite's Checkpoint does")
    if not ranks[0].get("files_at_stop", files):
        names = harness.short_list([name for name, _ in files], 3)
        raise fail(f"when iteration {STOP} ended there was no checkpoint yet: the file(s) in "
                   f"the folder ({names}) were written only when the run ended "
                   f"(Events.COMPLETED or TERMINATE), which a crash never reaches: save after "
                   f"EVERY iteration (Events.ITERATION_COMPLETED)")
    misnumbered = numbering(files, ranks[0]["total"] // EPOCHS)
    if misnumbered:
        raise fail(misnumbered)
    newest = files[-1][1]
    if isinstance(newest, int) and newest != STOP:
        raise fail(f"the run stopped after iteration {STOP}, but its newest checkpoint holds "
                   f"iteration {newest}, so it would be resumed from iteration {newest}: save "
                   f"after EVERY iteration (Events.ITERATION_COMPLETED), so a crash loses at "
                   f"most one step")
    if len(files) != 2:
        names = harness.short_list([name for name, _ in files], 3)
        raise fail(f"{len(files)} checkpoint file{'s' if len(files) > 1 else ''} in the folder "
                   f"after {STOP} iterations ({names}), but the task says to keep the last 2 "
                   f"(n_saved=2): one spare, in case the newest was being written when the run "
                   f"died")
    for rank, r in enumerate(ranks):
        if "attach_again" in r:
            raise fail(f"a resumed run calls attach_checkpointing again with the same folder, "
                       f"and on rank {rank} attach_checkpointing raised {r['attach_again']}: the "
                       f"folder may already hold checkpoints: DiskSaver(dirname, "
                       f"require_empty=False)")
    iterations = [r["resumed_iteration"] for r in ranks]
    if len(set(iterations)) > 1 or len({r["weights_restored"] for r in ranks}) > 1:
        states = ", ".join(
            f"rank {k} at iteration {r['resumed_iteration']} with "
            f"{'the checkpoint' if r['weights_restored'] else 'its own fresh'} weights"
            for k, r in enumerate(ranks))
        raise fail(f"after resume {states}: EVERY rank must load the checkpoint (each holds "
                   f"its own replica; DDP does not copy weights after it wrapped the model)")
    if all(i == 0 for i in iterations):
        raise fail(f"after resume the trainer starts again at iteration 0, but the run stopped "
                   f"after iteration {STOP}: save and load the trainer too (its state says "
                   f"where to continue)")
    if iterations[0] != STOP:
        raise fail(f"the run stopped after iteration {STOP} but resumed from iteration "
                   f"{iterations[0]}: save after EVERY iteration (Events.ITERATION_COMPLETED), "
                   f"so a crash loses at most one step")
    if not all(r["weights_restored"] for r in ranks) and all(r["restored_previous"] for r in ranks):
        raise fail(f"the checkpoint that says iteration {STOP} holds the weights from BEFORE "
                   f"iteration {STOP}'s step (those after iteration {STOP - 1}): it was saved when "
                   f"the iteration started, before its step, so a resumed run would skip that "
                   f"step. Save at Events.ITERATION_COMPLETED, after the step")
    if not all(r["weights_restored"] for r in ranks):
        raise fail("after resume the model does not hold the weights of the checkpoint: save "
                   "and load the model")
    if not all(r["momentum_restored"] for r in ranks):
        raise fail("after resume the optimizer has lost its momentum (SGD keeps a running "
                   "average of past gradients): save and load the optimizer too, or the next "
                   "steps differ from those of a run that never stopped")
    for rank, r in enumerate(ranks):
        if r.get("ran_after_resume") != r["total"] - STOP:
            raise fail(f"after resuming at iteration {STOP}, rank {rank} trained "
                       f"{r.get('ran_after_resume', 0)} more iterations instead of {r['total'] - STOP}")
        final, want = r["resumed_final"], r["uninterrupted"]
        if not isinstance(final, torch.Tensor) or final.shape != want.shape or final.dtype != want.dtype:
            raise fail(f"rank {rank}'s weights after the resumed run are {harness.describe(final)}, not the "
                       f"model's: no marks")
        diff = (final - want).abs().max().item()
        if not diff <= 1e-6:  # NaN is not equal
            raise fail(f"the resumed run ended with other weights than a run that never "
                       f"stopped (largest difference {diff:.3g} on rank {rank}): the checkpoint "
                       f"must hold everything the next steps depend on")


def test_resumed_run_ends_exactly_like_an_uninterrupted_one():
    harness.judge_here(sys.modules[__name__], [PARTS[0]], harness.check_seed())


def test_one_process_resumes_exactly():
    # no process group, no DistributedDataParallel: a plain `python train.py`
    harness.judge_here(sys.modules[__name__], [PARTS[1]], harness.check_seed())


def test_three_processes_resume_exactly():
    harness.judge_here(sys.modules[__name__], [PARTS[2]], harness.check_seed())


def test_two_nodes_resume_exactly():
    # world size 4, 2 per node: the global rank 0 writes, every rank of both nodes loads
    harness.judge_here(sys.modules[__name__], [PARTS[3]], harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# The reference's half is the check's own run that never stopped: the reference solution
# has nothing to add to it (the files and the resume are judged against the task).

LAYOUTS = [harness.LAYOUTS[i] for i in (1, 0, 2, 3)]
PARTS = tuple(layout[0] for layout in LAYOUTS)


def collect(part, whos, seed):
    """``{who: [what each rank's run gave]}`` in the layout ``part`` names, in a fresh
    checkpoint folder (one for every rank, as nodes share a cluster's file system)."""
    import shutil
    import tempfile

    harness.preload_for("07", whos)
    layout = LAYOUTS[PARTS.index(part)]
    base = tempfile.mkdtemp(prefix="distkit-check-07-")
    try:
        ranks = harness.run_layouts(on_rank, os.path.join(base, "checkpoints"), whos, layouts=[layout])[part]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return harness.by_who(ranks, whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    ranks = merged(got, expected)

    def fail(message):
        return harness.ExerciseFailure(f"on {part}: {message}")

    judge_run(ranks[0].get("dirname"), ranks, fail)
