"""Properties the exercise checks enforce, with the wrong answers drawn by Hypothesis
rather than listed: each case builds an answer from drawn choices, grades it with the
exercise's own check in this process (the check's module imported here, as
the grader does), and asserts that the check accepts it exactly when the drawn
choices are right, and otherwise rejects it with a message that names the cause drawn.

- 04: nodes that disagree about what is on disk (one node's copy lost, the other's kept):
  who decides whether to download (this node, rank 0 for everyone, an all_reduce of
  every node's answer) and how the node's processes re-check.
- 05: a Timer's events against handlers on every event a step's time could straddle
  (EPOCH_STARTED, ITERATION_STARTED, the batch fetch, ITERATION_COMPLETED, EPOCH_COMPLETED).
- 07: how the checkpoint files are numbered (global_step_transform) and kept (n_saved).
- 10: a walk over a model with nested blocks (modules(), children(), iterating the model).
- 14: a cause named from several shapes, not one: an answer that gives a slip's count on one
  shape and something else on the others is not told it made that slip.

Every case prints its seed; ``DISTKIT_PROPERTY_SEED=N`` draws the same cases again.
"""
from __future__ import annotations

import math
import os
import random
import sys

import pytest
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

from support import kit_check, kit_harness
from test_exercises import SOLUTIONS

SEED = int(os.environ.get("DISTKIT_PROPERTY_SEED") or random.randrange(2 ** 32))
# A case runs processes or sleeps through a trainer: a failing one is reported as drawn,
# not shrunk through dozens more runs.
AS_DRAWN = dict(deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck))


def replay_line(test: str) -> str:
    return (f"seed {SEED}: DISTKIT_PROPERTY_SEED={SEED} python -m pytest "
            f"tests/exercises/test_check_properties.py -k {test} -p no:cacheprovider")


@pytest.fixture(scope="module")
def checks():
    """``checks(NN)``: exercise NN's check module, imported in this process."""
    return kit_check


def answer(tmp_path, monkeypatch, number: str, source: str):
    """Make ``source`` the file the checks grade for exercise ``number``."""
    folder = tmp_path / "graded"
    folder.mkdir(exist_ok=True)
    solution = next(SOLUTIONS.glob(f"{number}_*.py"))
    (folder / solution.name).write_text(source)
    monkeypatch.setenv("DISTKIT_EXERCISES", str(folder))
    sys.modules.pop(f"distkit_exercise_{number}", None)


def verdict(run) -> str:
    """'' when ``run()`` passes, else the message the learner reads."""
    harness = kit_harness()

    try:
        run()
    except harness.ExerciseFailure as failure:
        return str(failure)
    return ""


def with_function(number: str, name: str, body: str) -> str:
    """The solution of ``number`` with function ``name`` replaced by ``body`` (appended: the
    later definition wins)."""
    return next(SOLUTIONS.glob(f"{number}_*.py")).read_text() + "\n\n" + body


# --- 04: nodes that disagree about what is on disk ----------------------------------------------

DECIDERS = {  # whether a download is needed, as this process comes to know it
    "its own node's disk": "here",
    "rank 0's disk, broadcast to every node": "idist.broadcast(torch.tensor(here), src=0).item()",
    "any node's disk (an all_reduce MAX)": 'idist.all_reduce(here, op="MAX")',
    "every node's disk (an all_reduce MIN)": 'idist.all_reduce(here, op="MIN")',
}
GUARDS = {  # who, inside one_rank_first(local=True), then downloads
    "local rank 0": "idist.get_local_rank() == 0",
    "whoever finds no file on its node": "not is_downloaded(root)",
}


def download_answer(decider: str, guard: str) -> str:
    return with_function("04", "get_dataset", f'''
def get_dataset(root):
    here = float(not is_downloaded(root))
    missing = {DECIDERS[decider]}
    with idist.one_rank_first(local=True):
        if missing and {GUARDS[guard]}:
            download(root)
    return load(root)
''')


@pytest.mark.slow
@pytest.mark.timeout(900)
@seed(SEED)
@settings(max_examples=2, **AS_DRAWN)
@given(decider=st.sampled_from(sorted(DECIDERS)), guard=st.sampled_from(sorted(GUARDS)))
@example(decider="rank 0's disk, broadcast to every node", guard="local rank 0")
def test_04_a_download_is_decided_by_each_nodes_own_disk(decider, guard, checks, tmp_path_factory):
    harness = kit_harness()

    print(f"04: decided by {decider}, downloaded by {guard}; {replay_line('04')}", flush=True)
    check = checks("04")
    tmp = tmp_path_factory.mktemp("ex04")
    with pytest.MonkeyPatch.context() as monkeypatch:
        answer(tmp, monkeypatch, "04", download_answer(decider, guard))
        layout = harness.LAYOUTS[3]  # 2 nodes x 2 processes, a disk per node: where nodes can disagree
        message = verdict(lambda: harness.judge_here(check, [layout[0]], harness.check_seed()))
    # re-checking its own disk inside the block makes any decider right: a node that has the
    # file never downloads it again, and an all_reduce MAX never says "no" to a node that lacks it
    right = decider == "its own node's disk" or (guard == "whoever finds no file on its node"
                                                 and "MAX" in decider)
    if right:
        assert message == "", message
        return
    assert "the nodes disagree about what is on disk, so each node decides from its own disk" in message.lower(), \
        message
    cause = "downloaded it again on node 0" if "MAX" in decider else "nobody on node 1 downloaded it"
    assert cause in message, message


# --- 07: how the checkpoint files are numbered and kept ---------------------------------------

NUMBERINGS = {  # the global_step_transform, as the learner wrote it (None: Checkpoint's own)
    "Checkpoint's own": None,
    "the iteration": "lambda engine, _: engine.state.iteration",
    "the epoch": "lambda engine, _: engine.state.epoch",
    "the iteration, counted down": "lambda engine, _: -engine.state.iteration",
}


@pytest.mark.timeout(300)
@seed(SEED)
@settings(max_examples=25, **AS_DRAWN)
@given(numbering=st.sampled_from(sorted(NUMBERINGS)), offset=st.integers(-3, 3),
       n_saved=st.sampled_from([1, 2, 3, None]), per_epoch=st.integers(2, 6), stop=st.integers(1, 14))
def test_07_files_are_numbered_by_their_iteration_and_the_last_2_kept(
        numbering, offset, n_saved, per_epoch, stop, checks, tmp_path_factory):
    """A real ignite Checkpoint (in this process, on an Engine of ``per_epoch`` iterations
    an epoch) with the drawn numbering and ``n_saved``, stopped after ``stop`` iterations:
    the check's judgement of the files it left against what was drawn."""
    import torch
    from ignite.engine import Engine, Events
    from ignite.handlers import Checkpoint, DiskSaver

    print(f"07: numbered by {numbering} {offset:+d}, n_saved={n_saved}, {per_epoch} iterations an "
          f"epoch, stopped after {stop}; {replay_line('07')}", flush=True)
    check = checks("07")
    transform = NUMBERINGS[numbering]
    if transform is not None and offset:
        transform = f"{transform} + {offset}"
    elif transform is None and offset:
        transform = f"lambda engine, _: engine.state.iteration + {offset}"
    folder = str(tmp_path_factory.mktemp("ex07"))
    trainer = Engine(lambda engine, batch: None)
    model = torch.nn.Linear(1, 1)  # two objects: one dict per file, as the exercise saves
    checkpoint = Checkpoint({"trainer": trainer, "model": model}, DiskSaver(folder, require_empty=False),
                            n_saved=n_saved, global_step_transform=None if transform is None else eval(transform))
    trainer.add_event_handler(Events.ITERATION_COMPLETED, checkpoint)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=stop), lambda engine: engine.terminate())
    trainer.run(range(per_epoch), max_epochs=stop // per_epoch + 1)

    class Answer:  # what saved_files reads the files with: the stub's given read_checkpoint
        read_checkpoint = staticmethod(lambda path: torch.load(path, weights_only=True))

    files = check.saved_files(Answer, folder)
    message = check.numbering(files, per_epoch)
    by_iteration = transform is None or (numbering == "the iteration" and offset == 0)
    if by_iteration:
        kept = min(n_saved or stop, stop)
        assert message == "", message
        assert [i for _, i in files] == list(range(stop - kept + 1, stop + 1)), files  # the last ones
        return
    numbers = [check.file_number(name) for name, _ in files]
    if numbers == [i for _, i in files]:
        # a numbering that meets the iteration where the run stopped (the epoch at iteration 1)
        assert message == "", message
        return
    assert message, f"files {files} passed as numbered by their iteration"
    epochs = [-(-i // per_epoch) for _, i in files]
    if numbers == epochs and len(files) > 1:
        # an offset that lands every file kept on its epoch (iteration - 2 with 2 an epoch:
        # 4 -> 2, 5 -> 3): the files cannot tell the two apart, and epoch is the likelier slip
        assert "numbered by epoch" in message or "the checkpoint files are numbered" in message, message
    elif len(files) == 1:  # one number against one iteration: an offset is all it shows
        assert "the checkpoint files are numbered" in message, message
    elif numbering == "the epoch":
        # an epoch plus an offset may look like an iteration minus one on the files kept: any
        # numbering message then says what they show
        assert ("numbered by epoch" if offset == 0 else "the checkpoint files are numbered") in message, message
    elif numbering != "the iteration, counted down":
        assert f"numbered {abs(offset)} {'above' if offset > 0 else 'below'} the iteration" in message, message
    else:
        assert "numbered otherwise than by the iteration" in message, message


# --- 05: a Timer against handlers on every event a step could straddle --------------------------

TIMER_EVENTS = {  # (start, resume, pause, the extra pause's event or None)
    "start": ["EPOCH_STARTED", "STARTED"],
    "resume": ["ITERATION_STARTED", "GET_BATCH_COMPLETED"],
    "pause": ["ITERATION_COMPLETED", "GET_BATCH_STARTED"],
    "extra_pause": ["EPOCH_STARTED", "GET_BATCH_STARTED", None],
}


def timer_answer(start, resume, pause, extra_pause) -> str:
    extra = f"\n    trainer.add_event_handler(Events.{extra_pause}, timer.pause)" if extra_pause else ""
    return with_function("05", "attach_step_timer", f'''
def attach_step_timer(trainer):
    timer = Timer(average=True)
    timer.attach(trainer, start=Events.{start}, resume=Events.{resume}, pause=Events.{pause},
                 step=Events.ITERATION_COMPLETED){extra}
    return timer
''')


@pytest.mark.slow
@pytest.mark.timeout(600)
@seed(SEED)
@settings(max_examples=6, **AS_DRAWN)
@given(**{name: st.sampled_from(choices) for name, choices in TIMER_EVENTS.items()})
@example(start="EPOCH_STARTED", resume="ITERATION_STARTED", pause="ITERATION_COMPLETED",
         extra_pause="GET_BATCH_STARTED")  # every fetch kept out, but not EPOCH_STARTED's handlers
@example(start="EPOCH_STARTED", resume="GET_BATCH_COMPLETED", pause="ITERATION_COMPLETED",
         extra_pause="EPOCH_STARTED")  # resumed before ITERATION_STARTED's earlier handlers
def test_05_the_timer_keeps_out_every_handler_it_could_straddle(start, resume, pause, extra_pause, checks,
                                                               tmp_path_factory):
    print(f"05: start {start}, resume {resume}, pause {pause}, also paused at {extra_pause}; "
          f"{replay_line('05')}", flush=True)
    check = checks("05")
    with pytest.MonkeyPatch.context() as monkeypatch:
        answer(tmp_path_factory.mktemp("ex05"), monkeypatch, "05", timer_answer(start, resume, pause, extra_pause))
        message = verdict(check.test_timer_measures_only_the_step)
    # the step is bracketed by ITERATION_STARTED and ITERATION_COMPLETED, and the clock that
    # every start event sets running is paused before any other handler and fetch
    right = resume == "ITERATION_STARTED" and pause == "ITERATION_COMPLETED" and extra_pause == "EPOCH_STARTED"
    if right:
        assert message == "", message
        return
    assert message, "a timer that counts other handlers or fetches passed"
    assert "it also counts" in message, message  # a fetch or a handler, named
    if resume == "GET_BATCH_COMPLETED":
        assert "at GET_BATCH_COMPLETED" in message or "fetch" in message, message
    if (resume, pause, extra_pause) == ("ITERATION_STARTED", "ITERATION_COMPLETED", "GET_BATCH_STARTED"):
        assert "set_epoch handler (at EPOCH_STARTED)" in message and "pause it in a handler of that event" in message, \
            message
    if (resume, pause, extra_pause) == ("GET_BATCH_COMPLETED", "ITERATION_COMPLETED", "EPOCH_STARTED"):
        assert "scheduler handler (at ITERATION_STARTED)" in message \
            and "batch to device handler (at GET_BATCH_COMPLETED)" in message, message


# --- 10: a walk over a model with nested blocks ---------------------------------------------

WALKS = {  # how the answer finds the layers to shard; True: it reaches every depth
    "model.modules()": ("model.modules()", True),
    "model.named_modules()": ("(m for _, m in model.named_modules())", True),
    "children(), recursively": ("_every(model)", True),
    "model.children()": ("model.children()", False),
    "iterating the model": ("iter(model)", False),
    "model.named_children()": ("(m for _, m in model.named_children())", False),
}


def shard_answer(walk: str) -> str:
    return with_function("10", "shard", f'''
def _every(module):
    for child in module.children():
        yield child
        yield from _every(child)


def shard(model):
    for layer in {WALKS[walk][0]}:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model
''')


@pytest.mark.slow
@pytest.mark.timeout(600)
@seed(SEED)
@settings(max_examples=2, **AS_DRAWN)
@given(walk=st.sampled_from(sorted(WALKS)))
@example(walk="model.children()")
def test_10_a_walk_reaches_the_layers_of_nested_blocks(walk, checks, tmp_path_factory):
    harness = kit_harness()

    print(f"10: layers found by {walk}; {replay_line('10')}", flush=True)
    check = checks("10")
    with pytest.MonkeyPatch.context() as monkeypatch:
        answer(tmp_path_factory.mktemp("ex10"), monkeypatch, "10", shard_answer(walk))
        message = verdict(lambda: harness.judge_here(check, [check.TWO], harness.check_seed()))
    if WALKS[walk][1]:
        assert message == "", message
    else:
        assert "not the one(s) inside a nested block (2.0)" in message and "model.modules()" in message, message


# --- 14: a slip named only when every shape checked shows it -------------------------------------

def flops_answer(slip: int, target) -> str:
    """A step_flops that gives slip ``slip``'s count on shape ``target`` (all of them when
    None) and the right count elsewhere."""
    return with_function("14", "step_flops", f'''
def step_flops(model, batch_per_rank, world_size):
    import sys
    check = sys.modules["distkit_check_14"]
    key = (model.n_layer, model.n_head, model.d_model, model.block_size, batch_per_rank, world_size)
    target = {target!r}
    if target is None or key == target:
        return check.mistakes(model, batch_per_rank, world_size)[{slip}][1]
    return check.harness.load_reference("14").step_flops(model, batch_per_rank, world_size)
''')


@pytest.mark.timeout(300)
@seed(SEED)
@settings(max_examples=6, **AS_DRAWN)
@given(slip=st.integers(0, 7), everywhere=st.booleans(), shape=st.integers(0, 4), check_seed=st.integers(1, 10**6))
@example(slip=5, everywhere=False, shape=0, check_seed=7)  # sequences for tokens on the first shape only
@example(slip=4, everywhere=True, shape=0, check_seed=7)  # one process's step, everywhere
def test_14_a_slip_is_named_only_when_every_shape_shows_it(slip, everywhere, shape, check_seed, checks,
                                                           tmp_path_factory):
    print(f"14: slip {slip} {'on every shape' if everywhere else f'on shape {shape} only'}, check seed "
          f"{check_seed}; {replay_line('14')}", flush=True)
    check = checks("14")
    shapes = check.SHAPES + check.random_shapes(check_seed)
    target = None if everywhere else shapes[shape]
    models = [(check.gpt(*s[:4]), s[4], s[5]) for s in shapes]
    reference = check.harness.load_reference("14")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("DISTKIT_CHECK_SEED", str(check_seed))
        answer(tmp_path_factory.mktemp("ex14"), monkeypatch, "14", flops_answer(slip, target))
        message = verdict(check.test_step_flops_equal_the_reference_count_exactly)
    shown = [k for k, (model, per_rank, world) in enumerate(models)
             if not math.isclose(check.mistakes(model, per_rank, world)[slip][1],
                                 reference.step_flops(model, per_rank, world), rel_tol=1e-12)]
    if not (everywhere and shown) and not (not everywhere and shape in shown):
        assert message == "", message  # the slip gives the right count wherever it was made
        return
    first = shown[0] if everywhere else shape
    words = check.mistakes(*models[first])[slip][0]
    # the slip is named when every shape checked agrees with it: made everywhere, or made on one
    # shape where on every other it gives the right count anyway
    consistent = everywhere or shown == [shape]
    assert message, "a wrong count passed"
    if consistent:
        assert words in message, message
    else:
        assert words not in message, message
