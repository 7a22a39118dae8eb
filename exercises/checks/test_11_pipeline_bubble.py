"""Checks for exercise 11: the learner's GPipe step on 2 gloo ranks gives the whole
model's gradients, sends one activation per micro-batch, and sits idle for the share of
the step the learner predicted (measured with stages that take a known time)."""
import math
import statistics
import sys
import time

import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex11

STAGES = 2
BATCH, WIDTH = 16, 8
MICRO = 4
MEASURED_M = (2, 4)
TIMED_BATCH = 32  # micro-batches of 8+ samples: 40+ ms each, so sending costs little beside
# A measured bubble may exceed the model (sends and the schedule's own work cost time,
# more so on a busy machine) but not undercut it by more than noise: a sleep that overruns
# makes one stage slower than the other, and the slower one then waits a little less.
BELOW = 0.1


def whole_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, WIDTH)),
                         nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, WIDTH)))


def data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def _step(ex, module, rank, m, repeat=1):
    x, y = data()
    x, y = x.repeat(repeat, 1), y.repeat(repeat, 1)
    return ex.pipeline_step(module, rank, STAGES, x if rank == 0 else None,
                            y if rank == STAGES - 1 else None, m)


def on_rank(whos):
    """For the reference: the whole model's loss and this stage's gradients on the whole
    batch (the check's own model, in one process). For the learner: its predictions, its
    step's gradients, sends and loss, and the bubble measured with stages of a known time."""
    found = {}
    if harness.LEARNER in whos:
        ex = harness.load("11")
        found[harness.LEARNER] = {"predicted": {m: ex.bubble_fraction(STAGES, m) for m in MEASURED_M},
                                  "predicted_4_stages": ex.bubble_fraction(4, 8), "probes": probed(ex)}
    if harness.REFERENCE in whos:
        found[harness.REFERENCE] = whole_batch()
    if harness.LEARNER in whos:
        found[harness.LEARNER] = harness.plain({**found[harness.LEARNER], **learner_steps(ex)})
    return found


def whole_batch() -> dict:
    import torch.distributed as dist

    reference = whole_model()
    x, y = data()
    loss = nn.functional.mse_loss(reference(x), y)
    loss.backward()
    return {"loss": loss.item(), "wanted": [p.grad.clone() for p in reference[dist.get_rank()].parameters()]}


def probed(ex) -> list:
    """The learner's ``bubble_fraction`` at :data:`PROBES` (None where it raised)."""
    values = []
    for p, m in PROBES:
        try:
            values.append(harness.plain(ex.bubble_fraction(p, m)))
        except Exception:  # noqa: BLE001 - an answer that fails a probe follows no slip
            values.append(None)
    return values


def learner_steps(ex) -> dict:
    import torch.distributed as dist

    from distkit.lessons.pipeline import Timed, busy_fraction
    from distkit.lessons.sharded import CommCounter

    rank, report = dist.get_rank(), {}
    stage = whole_model()[rank]
    with CommCounter() as comm:
        returned = _step(ex, stage, rank, MICRO)
    report["grads"] = [None if p.grad is None else p.grad.clone() for p in stage.parameters()]
    # Activations only: a fresh PipelineStage first sends its shapes (pickled, uint8)
    report["sends"] = [shape for kind, shape, dtype in comm.log if kind == "send" and dtype == "torch.float32"]
    report["returned"] = returned if isinstance(returned, (int, float, type(None))) else harness.describe(returned)

    report["measured"], report["timed_sends"] = {}, {}
    for m in MEASURED_M:
        bubbles = []
        for _ in range(2):
            timed = nn.Sequential(whole_model()[rank], Timed(0.005, 0.010))  # 5 ms / 10 ms per sample
            dist.barrier()
            start = time.perf_counter()
            with CommCounter() as comm:  # how many micro-batches the timed step really used
                _step(ex, timed, rank, m, repeat=TIMED_BATCH // BATCH)
            dist.barrier()  # the step ends when the last stage is done
            report["timed_sends"][m] = [shape for kind, shape, dtype in comm.log
                                        if kind == "send" and dtype == "torch.float32"]
            bubbles.append(1 - busy_fraction(start, time.perf_counter()))
        report["measured"][m] = statistics.median(bubbles)
    return report


def flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def test_pipeline_step_and_its_bubble():
    harness.judge_here(sys.modules[__name__], [BUBBLE], harness.check_seed())


def merged(got, expected):
    """The learner's data of each rank, with the whole model's loss and gradients from the
    reference's run (never from the learner's data)."""
    return [{**(g if isinstance(g, dict) else {}), "loss": e["loss"], "wanted": e["wanted"]}
            for g, e in zip(harness.same_ranks(got, expected), expected)]


def judge_bubble(ranks):
    for rank, r in enumerate(ranks):
        if any(g is None for g in r["grads"]):
            raise harness.ExerciseFailure(
                f"after pipeline_step, stage {rank}'s parameters have no gradient: give the "
                f"schedule the loss (loss_fn=F.mse_loss), so that the last stage computes it and "
                f"the schedule runs the backward of every micro-batch")
    sends = ranks[0]["sends"]
    if len(sends) != MICRO or any(shape != (BATCH // MICRO, WIDTH) for shape in sends):
        raise harness.ExerciseFailure(
            f"with n_microbatches={MICRO} and a batch of {BATCH}, rank 0 sent {len(sends)} activation "
            f"tensor(s) of shape {harness.short_list(sorted(set(sends)))}, not {MICRO} of {(BATCH // MICRO, WIDTH)}: "
            f"the schedule must cut the batch into n_microbatches micro-batches "
            f"(ScheduleGPipe(stage, n_microbatches=n_microbatches, ...)), one send each")
    for rank, r in enumerate(ranks):
        got, want = flat(r["grads"]), flat(r["wanted"])
        if torch.allclose(got * MICRO, want, rtol=1e-4, atol=1e-6):
            raise harness.ExerciseFailure(
                f"stage {rank}'s gradients are 1/{MICRO} of the whole model's on the whole batch: "
                f"ScheduleGPipe already scales each micro-batch's backward by 1/n_microbatches "
                f"(its scale_grads=True), so the gradients are those of the batch's mean loss. "
                f"Give it the plain loss, loss_fn=F.mse_loss, not the loss divided by the number "
                f"of micro-batches")
        if torch.allclose(got, want * MICRO, rtol=1e-4, atol=1e-6):
            raise harness.ExerciseFailure(
                f"stage {rank}'s gradients are {MICRO}x those of the whole model on the whole "
                f"batch: the micro-batches' gradients were summed, not averaged; leave "
                f"ScheduleGPipe's scale_grads at its default (True) and use loss_fn=F.mse_loss")
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            raise harness.ExerciseFailure(
                f"stage {rank} has other gradients than the whole model on the whole batch "
                f"(largest difference {(got - want).abs().max().item():.3g}): run exactly one "
                f"schedule.step per call, on a fresh PipelineStage of stage_module")
    if ranks[0]["returned"] is not None:
        raise harness.ExerciseFailure(
            f"rank 0 returned {ranks[0]['returned']!r}: return None there (the loss is computed "
            f"on the last stage)")
    got, want = ranks[1]["returned"], ranks[1]["loss"]
    if not isinstance(got, (int, float)):
        raise harness.ExerciseFailure(
            f"the last stage returned {got if isinstance(got, str) else harness.describe(got)}: return the "
            f"mean of the micro-batch losses as a Python float (collect them with "
            f"schedule.step(target=..., losses=losses))")
    if math.isclose(got, MICRO * want, rel_tol=1e-4):
        raise harness.ExerciseFailure(
            f"the last stage returned {got:.6f}, {MICRO}x the batch's loss {want:.6f}: that is the "
            f"SUM of the {MICRO} micro-batch losses; return their mean")
    if math.isclose(got * MICRO, want, rel_tol=1e-4):
        raise harness.ExerciseFailure(
            f"the last stage returned {got:.6f}, 1/{MICRO} of the batch's loss {want:.6f}: each "
            f"loss the schedule collected is already one micro-batch's MEAN, so their mean is "
            f"the batch's; do not divide it by n_microbatches again")
    if not math.isclose(got, want, rel_tol=1e-4):
        raise harness.ExerciseFailure(
            f"the last stage returned {got:.6f}, but the batch's mean loss is {want:.6f}: return "
            f"the mean of the losses the schedule collected")
    for m in MEASURED_M:
        sends = ranks[0]["timed_sends"][m]
        if len(sends) != m:
            raise harness.ExerciseFailure(
                f"in the timed step with n_microbatches={m}, rank 0 sent {len(sends)} activation "
                f"tensor(s) of shape {harness.short_list(sorted(set(sends)))}, not {m}: the "
                f"schedule must cut the batch into the n_microbatches it is given "
                f"(ScheduleGPipe(stage, n_microbatches=n_microbatches, ...)), not a fixed number")
    for stages, m, predicted in [(STAGES, m, ranks[0]["predicted"][m]) for m in MEASURED_M] + \
            [(4, 8, ranks[0]["predicted_4_stages"])]:
        if not isinstance(predicted, (int, float)) or isinstance(predicted, bool):
            raise harness.ExerciseFailure(
                f"bubble_fraction({stages}, {m}) returned {harness.describe(predicted)}, not a number: return "
                f"a Python float (the idle share of the step, between 0 and 1)")
    for m in MEASURED_M:
        predicted = ranks[0]["predicted"][m]
        measured = [r["measured"][m] for r in ranks]
        shown = ", ".join(f"rank {k} {b:.3f}" for k, b in enumerate(measured))
        # The prediction is graded against the model itself, not against the measurement:
        # a busy machine stretches a measured bubble without bound, so a window around it
        # would pass wrong formulas there (and fail right ones). The measurement is shown,
        # and must not undercut the model.
        model = (STAGES - 1) / (m + STAGES - 1)
        if not isinstance(predicted, (int, float)) or isinstance(predicted, bool) or \
                not math.isclose(predicted, model, rel_tol=1e-6):
            why = _slip(ranks[0]["probes"])
            raise harness.ExerciseFailure(
                f"you predicted a bubble of {predicted!r} for {STAGES} stages and {m} micro-batches; "
                f"measured: {shown} idle (a measurement exceeds the model by the cost of sending "
                f"and of the schedule's own work, more on a busy machine, but never undercuts "
                f"it): {why}")
        if any(b < predicted - BELOW for b in measured):
            raise harness.ExerciseFailure(
                f"with {m} micro-batches the stages sat idle for {shown} of the step, less than "
                f"the model's {predicted:.3f} (by more than {BELOW}): a GPipe step of "
                f"{m} micro-batches cannot overlap that well; run schedule.step once, on a "
                f"ScheduleGPipe with n_microbatches={m}")
    four = ranks[0]["predicted_4_stages"]
    if not isinstance(four, (int, float)) or not math.isclose(four, 3 / 11):
        raise harness.ExerciseFailure(
            f"bubble_fraction(4, 8) returned {four!r}: your formula fits 2 stages but not 4; write "
            f"it with `stages`, not a fixed number")


# Slips named only when the answer follows them at every point probed (several stage and
# micro-batch counts, each term of the formula moved on its own); otherwise the hint is general.
SLIPS = (
    (lambda p, m: (p - 1) / m, "(p-1)/m leaves out the slots the pipeline needs to fill and drain: a "
                               "step lasts m + p - 1 slots, not m"),
    (lambda p, m: 1 - 1 / p, "that is the idle share without micro-batches (one stage at a time); with "
                             "m micro-batches the stages overlap"),
)
PROBES = ((2, 2), (2, 4), (3, 4), (4, 8), (5, 3))


def _slip(probed) -> str:
    """Which slip the learner's values at the probes (:func:`probed`) follow, if one."""
    for formula, why in SLIPS:
        try:
            if all(math.isclose(got, formula(p, m)) for got, (p, m) in zip(probed, PROBES, strict=True)):
                return why
        except Exception:  # noqa: BLE001 - an answer that fails a probe follows no slip
            pass
    return "count the slots of a step: each stage works in m of them"


# --- 3 and 4 stages, several micro-batch counts, against the reference -------------------

DEEP_BATCH = 12  # divides by every micro-batch count below
DEEP_M = (3, 4)  # more than one count, neither equal to the number of stages of 4


def deep_stages(seed, n):
    """``n`` seeded random stages (the same on every rank: each takes its own)."""
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, WIDTH)) for _ in range(n)]


def deep_data(seed):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(DEEP_BATCH, WIDTH, generator=g) * 3, torch.randn(DEEP_BATCH, WIDTH, generator=g)


def role(index, n):
    return "the first stage" if index == 0 else "the last stage" if index == n - 1 else "a middle stage"


def on_rank_deep(seed, whos):
    """Rank r runs stage r of as many stages as there are ranks: the reference's step for
    every micro-batch count first, then the learner's, each on a fresh copy of the stage."""
    import ignite.distributed as idist

    rank, n = idist.get_rank(), idist.get_world_size()
    x, y = deep_data(seed)
    args = (x if rank == 0 else None, y if rank == n - 1 else None)
    found = {}
    if harness.REFERENCE in whos:
        reference = harness.load_reference("11")
        found[harness.REFERENCE] = {"world_size": n, "expected": {}}
        for m in DEEP_M:
            stage = deep_stages(seed, n)[rank]
            loss = reference.pipeline_step(stage, rank, n, *args, m)
            found[harness.REFERENCE]["expected"][m] = {"returned": harness.plain(loss),
                                                       "grads": [p.grad.clone() for p in stage.parameters()]}
    if harness.LEARNER in whos:
        found[harness.LEARNER] = {"got": learner_deep(seed, rank, n, args)}
    return found


def learner_deep(seed, rank, n, args) -> dict:
    from distkit.lessons.sharded import CommCounter

    ex, got = harness.load("11"), {}
    for m in DEEP_M:
        stage = deep_stages(seed, n)[rank]
        try:
            with harness.Recorder() as record, CommCounter() as comm:
                returned = ex.pipeline_step(stage, rank, n, *args, m)
        except (harness.ExerciseFailure, NotImplementedError):
            raise  # the check's own sentence, or the TODO still there
        except Exception as error:  # noqa: BLE001 - the stage's role names the likely cause
            raise harness.ExerciseFailure(
                f"with {n} stages and n_microbatches={m}, stage {rank} ({role(rank, n)}, rank "
                f"{rank}) raised {type(error).__name__}: {str(error).strip()[:300]}"
                + ("; a middle stage gets neither inputs nor targets: it only receives and "
                   "sends, schedule.step() with no arguments, and returns None"
                   if 0 < rank < n - 1 else "")) from None
        if not isinstance(returned, (int, float, type(None))):
            returned = repr(returned)[:200]
        got[m] = {"returned": returned,
                  "grads": [None if p.grad is None else p.grad.clone() for p in stage.parameters()],
                  "sends": [s for kind, s, dtype in comm.log if kind == "send" and dtype == "torch.float32"],
                  # the transfers of micro-batches, in the order they were posted
                  "order": [(c["op"], c["peer"]) for c in record.log if c["op"] in
                            ("send", "isend", "recv", "irecv") and c["shapes"] == [(DEEP_BATCH // m, WIDTH)]]}
    return harness.plain(got)


def judge_deep(layout, got, expected, seed):
    ranks = [{"world_size": e["world_size"], "expected": e["expected"], "got": g["got"]}
             for g, e in zip(harness.same_ranks(got, expected), expected)]
    n = len(ranks)
    for m in DEEP_M:
        where = f"on {layout} ({n} stages, one per rank), n_microbatches={m}"
        for rank, r in enumerate(ranks):
            got, want = r["got"][m], r["expected"][m]
            what = f"stage {rank} ({role(rank, n)}, rank {rank})"
            # forward: every stage but the last sends each micro-batch's activation on;
            # backward: every stage but the first sends each micro-batch's gradient back
            wanted = m * ((rank < n - 1) + (rank > 0))
            if len(got["sends"]) != wanted or any(s != (DEEP_BATCH // m, WIDTH) for s in got["sends"]):
                raise harness.ExerciseFailure(
                    f"{where}: {what} sent {len(got['sends'])} tensor(s) of shape "
                    f"{harness.short_list(sorted(set(got['sends'])))}, not {wanted} of "
                    f"{(DEEP_BATCH // m, WIDTH)}: each stage passes every micro-batch's activation "
                    f"on (all but the last) and its gradient back (all but the first), a middle "
                    f"stage both (a PipelineStage and schedule.step() on every rank, with "
                    f"n_microbatches micro-batches)")
            if rank < n - 1:
                # GPipe: every micro-batch's activation is on its way before the first gradient
                # is asked for (a schedule step per micro-batch, or 1F1B, asks earlier)
                order = got["order"]
                asked = [i for i, (op, peer) in enumerate(order) if op in ("recv", "irecv") and peer == rank + 1]
                sent = sum(1 for op, peer in order[:asked[0] if asked else len(order)]
                           if op in ("send", "isend") and peer == rank + 1)
                if asked and sent < m:
                    raise harness.ExerciseFailure(
                        f"{where}: {what} posted the receive of micro-batch 1's gradient after sending {sent} of "
                        f"{m} micro-batches on: the numbers may be right, but that is not the GPipe schedule, "
                        f"whose bubble you predicted (every forward first, then every backward). Run one "
                        f"schedule.step of a ScheduleGPipe with n_microbatches micro-batches")
            if any(g is None for g in got["grads"]):
                raise harness.ExerciseFailure(
                    f"{where}: after pipeline_step {what}'s parameters have no gradient: every "
                    f"stage, a middle one too, runs schedule.step once")
            differs = harness.difference(want["grads"], got["grads"], rtol=1e-5, atol=1e-7,
                                         what=f"{what}'s gradients")
            if differs:
                raise harness.ExerciseFailure(
                    f"{where}: {differs}; expected are the reference solution's (those of the whole "
                    f"model on the whole batch) {harness.replay(seed)}")
            if rank < n - 1 and got["returned"] is not None:
                raise harness.ExerciseFailure(
                    f"{where}: {what} returned {got['returned']!r}: return None there (the loss is "
                    f"computed on the last stage)")
        last = ranks[-1]["got"][m]["returned"]
        expected = ranks[-1]["expected"][m]["returned"]
        differs = harness.difference(expected, last, rtol=1e-5, atol=0, what="the last stage's loss")
        if differs:
            raise harness.ExerciseFailure(
                f"{where}: {differs} (the reference solution's: the mean of the micro-batch losses) "
                f"{harness.replay(seed)}")


def test_three_and_four_stages_match_the_reference():
    """3 processes (3 stages: one in the middle) and 2 nodes x 2 processes (4 stages, two in
    the middle, global ranks that are not local ranks). One process has no pipeline: a
    PipelineStage needs a process group (bubble_fraction(1, m) is checked below)."""
    harness.judge_here(sys.modules[__name__], DEEP, harness.check_seed())


FRACTION_AT = [(stages, m) for stages in (1, 2, 3, 5, 8) for m in (1, 3, 4, 16)]


def test_bubble_fraction_matches_the_reference():
    """A pure function: compared with the reference, stages 1 to 8."""
    harness.judge_here(sys.modules[__name__], [FRACTION], harness.check_seed())


def judge_fraction(got, expected):
    if not isinstance(got, list) or len(got) != len(expected):
        raise harness.ExerciseFailure(f"the check's data should hold {len(expected)} values, got "
                                      f"{harness.describe(got)}")
    for (stages, m), want, value in zip(FRACTION_AT, expected, got):
        differs = harness.difference(float(want), value, rtol=1e-9, atol=1e-12,
                                     what=f"bubble_fraction({stages}, {m})")
        if differs and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise harness.ExerciseFailure(f"{differs}: return a Python float, the idle share of the step")
        if differs:
            raise harness.ExerciseFailure(
                f"{differs}: a GPipe step of {m} micro-batches on {stages} stage(s) lasts "
                f"{m + stages - 1} slots, of which each stage works {m}"
                + (" (one stage alone never waits: 0)" if stages == 1 else ""))


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

BUBBLE = "2 stages: gradients, sends and the bubble"
DEEP = (harness.LAYOUTS[2][0], harness.LAYOUTS[3][0])
FRACTION = "bubble_fraction against the reference"
PARTS = (BUBBLE, *DEEP, FRACTION)


def collect(part, whos, seed):
    """``{who: [what each rank gave]}`` for the pipelines, ``{who: [values]}`` for the last part."""
    if part == FRACTION:
        return {who: [harness.plain(harness.answer("11", who).bubble_fraction(stages, m))
                      for stages, m in FRACTION_AT] for who in whos}
    harness.preload_for("11", whos)
    if part == BUBBLE:
        return harness.by_who(harness.run_ranks(on_rank, whos), whos)
    layout = harness.LAYOUTS[2 + DEEP.index(part)]
    return harness.by_who(harness.run_layouts(on_rank_deep, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    if part == BUBBLE:
        judge_bubble(merged(got, expected))
    elif part == FRACTION:
        judge_fraction(got, expected)
    else:
        judge_deep(part, got, expected, seed)
