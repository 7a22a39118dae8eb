"""Checks for exercise 09: the learner's pipeline, one stage per rank, in every layout (2
processes, 3 processes: a stage in the middle, 2 nodes x 2 processes: 4 stages whose global
ranks are not their local ranks, and 1 process with no process group: one stage, first
and last), with 4 and 3 micro-batches each. Every stage's gradients (and the loss the last
one returns) are compared with those of the whole model computed in one process on the
whole batch, on seeded random inputs whose logits are of large magnitude and both signs.

The structure is checked from a record of the answer's ``torch.distributed`` calls and
matrix products (:class:`harness.Recorder`): one tensor of ``activation_shape`` per
micro-batch each way, only to and from the neighbouring stages; every stage but the last
sends micro-batch 1 on before it computes the last forward and before it waits for micro-
batch 1's gradient; every stage but the first computes on micro-batch 1 before the last
one has arrived; every tensor on ``idist.device()``. A receive or send of another shape,
or to a rank that is no neighbour, is stopped before gloo gets it (gloo ends the process
on a size mismatch)."""
import sys
import traceback

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import harness

pytestmark = pytest.mark.ex09

IN, HIDDEN, CLASSES = 5, 8, 3
BATCH = 12
MICRO_COUNTS = (4, 3)  # two counts, one of them not the number of stages of 4
# The last layer's weights are scaled so the logits are of order 100, of both signs: a
# softmax written by hand overflows or underflows there, F.cross_entropy does not.
LOGIT_SCALE = 300.0
# The same sums in another order (micro-batch by micro-batch) move float32 results by
# about 1e-6 relative; a gradient rounded through float16 moves them by about 5e-4.
RTOL, ATOL = 1e-4, 1e-5  # atol relative to the largest gradient entry of the stage
P2P = ("send", "recv", "isend", "irecv")


def stages(seed, n):
    """The whole model, cut into ``n`` stages (the same on every rank: each takes its own).
    One stage: the whole model. Stage 0 maps the inputs to activations of ``HIDDEN``,
    every stage in the middle activations to activations, the last one to logits."""
    torch.manual_seed(seed)
    if n == 1:
        blocks = [nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))]
    else:
        blocks = ([nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh())]
                  + [nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh()) for _ in range(n - 2)]
                  + [nn.Sequential(nn.Linear(HIDDEN, CLASSES))])
    with torch.no_grad():
        blocks[-1][-1].weight.mul_(LOGIT_SCALE)
    return blocks


def data(seed):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(BATCH, IN, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def role(rank, n):
    if n == 1:
        return "the only stage: first and last"
    return "the first stage" if rank == 0 else "the last stage" if rank == n - 1 else "a middle stage"


class Checked(harness.Recorder):
    """The harness's record of calls and products, plus each tensor's dtype, which stops a
    transfer that cannot be right before gloo gets it: of another shape than
    ``activation_shape`` (gloo ends the process when sizes differ), with a rank that is
    not a neighbour (it would wait forever), or any with one process."""

    def __init__(self, rank, n, m, shape):
        super().__init__(compute=True)
        self.rank, self.n, self.m, self.shape = rank, n, m, tuple(shape)
        self.placement = None

    def _note(self, name, args, kwargs):
        super()._note(name, args, kwargs)
        entry = self.log[-1]
        copy = entry.pop("copy", None)
        entry["dtype"] = str(copy.dtype).replace("torch.", "") if copy is not None else None
        rank, n = self.rank, self.n
        what = f"stage {rank} ({role(rank, n)}, rank {rank}) with {self.m} micro-batches"
        if n == 1:
            raise harness.ExerciseFailure(
                f"{what} called dist.{name}: with one process (no process group) rank 0 is the first and "
                f"the last stage, there is nobody to send to or receive from (and torch.distributed's "
                f"calls raise). Send and receive only to and from stages that exist: first = rank == 0, "
                f"last = rank == world_size - 1 (idist.get_rank(), idist.get_world_size() work here)")
        if name not in P2P:
            return  # a collective: judged after the run (it cannot hang on a shape)
        if name in ("recv", "irecv") and self.placement is not None:
            # judged once the gradients are right: only a GPU would show it
            entry["misplaced"] = self.placement.misplaced((list(args) + [kwargs.get("tensor")])[0])
        peer, shape = entry["peer"], tuple(entry["shapes"][0]) if entry["shapes"] else None
        neighbours = [p for p in (rank - 1, rank + 1) if 0 <= p < n]
        if isinstance(peer, int) and peer not in neighbours:
            towards = "to" if name in ("send", "isend") else "from"
            raise harness.ExerciseFailure(
                f"{what} called dist.{name} {towards} rank {peer}: a stage exchanges only with its "
                f"neighbours ({' and '.join(f'rank {p}' for p in neighbours)}): activations come from "
                f"rank - 1 and go on to rank + 1, gradients come back from rank + 1 and go to rank - 1"
                + (f" (there is no rank {peer} in a world of {n})" if not 0 <= peer < n else ""))
        if shape is not None and shape != self.shape:
            verb = (f"sent a tensor of shape {shape} to rank {peer}" if name in ("send", "isend") else
                    f"posted a receive into a buffer of shape {shape} from rank {peer}")
            raise harness.ExerciseFailure(
                f"{what} {verb}, but each micro-batch's activations, and their gradients, have "
                f"activation_shape {self.shape}: send each micro-batch's output as a tensor of its own "
                f"and receive into a new buffer of activation_shape on idist.device() (in gloo a "
                f"receive of another size than what was sent ends the process)")


def explain(rank, n, m, error, log) -> str:
    """The learner's sentence for an error raised by the answer on this rank."""
    import ignite.distributed as idist

    text = str(error)
    what = f"stage {rank} ({role(rank, n)}, rank {rank}) with {m} micro-batches"
    transfers = [e for e in log if e["op"] in P2P]
    if "timed out" in text.lower() and transfers:
        last = transfers[-1]
        waited = f"{harness.COLLECTIVE_TIMEOUT_S:.0f} s"
        if last["op"] == "send":
            return (f"{what} waited {waited} in a blocking dist.send to rank {last['peer']}, which never "
                    f"received it: a blocking send returns only once the peer has posted the matching recv, "
                    f"and rank {last['peer']} was blocked elsewhere (two ranks blocked in a send to each other "
                    f"wait forever). Send with dist.isend and wait() on the handles at the end")
        if last["op"] == "recv":
            count = sum(1 for e in transfers if e["op"] in ("recv", "irecv") and e["peer"] == last["peer"])
            return (f"{what} waited {waited} in its receive number {count} from rank {last['peer']}, which never "
                    f"sent it: every recv needs the peer's send, in the same order on both sides of a link "
                    f"({m} activations forward, {m} gradients back); a stage that does not pass a tensor on "
                    f"leaves its neighbour waiting")
    lowered = text.lower()
    if any(s in lowered for s in ("timed out", "connection closed", "connection reset", "broken pipe")):
        raise error  # a consequence of another rank's failure, or a wait the harness words
    report = harness._describe(error)
    message = f"{what}: " + harness._explain_error(rank, report)
    hints = []
    if "process group" in lowered and not idist.get_world_size() > 1:
        hints.append("with one process there is no process group: rank 0 is the first and the last stage "
                     "and sends or receives nothing; idist.get_rank() and idist.get_world_size() work "
                     "there (0 and 1), torch.distributed's raise")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if harness._in_exercise_file(f.filename)]
    line = (frames[-1].line or "") if frames else ""
    if "nonetype" in lowered and ("inputs" in line or "targets" in line):
        hints.append(f"on this rank inputs is {'the list of micro-batches' if rank == 0 else 'None'} and "
                     f"targets is {'the list of labels' if rank == n - 1 else 'None'}"
                     + ("; a middle stage gets neither: it receives from rank - 1, sends on to rank + 1, "
                        "and returns None" if 0 < rank < n - 1 else ""))
    elif "nonetype" in lowered and ".grad" in line:
        hints.append("a .grad on that line is None: backward fills .grad only for tensors that require "
                     "grad (a received buffer needs x.requires_grad_() before the forward), and only once "
                     "the backward has run through them")
    if "cuda" in line and "NVIDIA" not in message:
        hints.append("the line that raised names a GPU (cuda)"
                     + (": this machine has none (torch.cuda.device_count() is 0)" if not torch.cuda.is_available()
                        else "") + "; use idist.device(), the CPU under gloo, this rank's GPU under nccl")
    if hints:
        head, _, tail = message.partition("\n")
        message = f"{head}\n({'; '.join(hints)})\n{tail}"
    return message


def portable(value):
    """What the answer returned, as something the parent can read and describe."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    return {"described": harness.describe(value), "tensor": isinstance(value, torch.Tensor)}


def on_rank(seed, whos):
    """For the reference: where this rank runs, and the whole model's loss and this stage's
    gradients on the whole batch (the check's own model, in one process). For the learner:
    what its pipeline_step left on this stage, returned, and called, per micro-batch count."""
    found = {}
    if harness.REFERENCE in whos:
        found[harness.REFERENCE] = whole_batch(seed)
    if harness.LEARNER in whos:
        found[harness.LEARNER] = harness.plain(learner_runs(seed))
    return found


def whole_batch(seed) -> dict:
    import ignite.distributed as idist

    rank, n = idist.get_rank(), idist.get_world_size()
    x, y = data(seed)
    report = {"device": str(idist.device()), "runs": {}}
    for m in MICRO_COUNTS:
        whole = stages(seed, n)
        loss = F.cross_entropy(nn.Sequential(*whole)(x), y)
        loss.backward()
        report["runs"][m] = {"wanted": [p.grad.clone() for p in whole[rank].parameters()], "loss": loss.item()}
    return report


def learner_runs(seed) -> dict:
    import ignite.distributed as idist

    rank, n = idist.get_rank(), idist.get_world_size()
    x, y = data(seed)
    ex = harness.load("09")
    report = {"runs": {}}
    for m in MICRO_COUNTS:
        stage = stages(seed, n)[rank]
        inputs = list(x.chunk(m)) if rank == 0 else None
        targets = list(y.chunk(m)) if rank == n - 1 else None
        shape = (BATCH // m, HIDDEN)
        record = Checked(rank, n, m, shape)
        try:
            with harness.DeviceStandIn() as record.placement, record:
                returned = ex.pipeline_step(stage, inputs, targets, shape, m)
        except (harness.ExerciseFailure, NotImplementedError):
            raise
        except Exception as error:  # noqa: BLE001 - described with the stage it happened on
            raise harness.ExerciseFailure(explain(rank, n, m, error, record.log)) from None
        if record.unwaited():
            # judged here, at once: the peer then waits in vain, and its timeout would
            # blame a send that never happened
            raise harness.ExerciseFailure(unwaited(rank, n, m, record.unwaited()))
        report["runs"][m] = {
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in stage.parameters()],
            "returned": portable(returned), "log": [judged(e) for e in record.log]}
    return report


# what the judge reads of a recorded call (the rest stays in the learner's process: the
# learner's data may be only a few times the size of the reference's)
JUDGED = ("op", "peer", "of", "devices", "dtype", "misplaced")


def judged(entry) -> dict:
    return {key: entry[key] for key in JUDGED if key in entry}


def unwaited(rank, n, m, calls) -> str:
    first = calls[0]
    towards = "to" if first["op"] == "isend" else "from"
    return (f"stage {rank} ({role(rank, n)}, rank {rank}) with {m} micro-batches returned without waiting "
            f"on {len(calls)} of its handles (the first: dist.{first['op']} {towards} rank {first['peer']}): "
            f"an isend's handle must be waited. isend only starts the transfer; until handle.wait() the "
            f"tensor may not have left, and its neighbour's recv waits for it in vain. Keep every handle "
            f"and wait() on each before returning")


def blocking(where, rank, n, log) -> str:
    misplaced = [e["misplaced"] for e in log if e.get("misplaced")]
    if misplaced:
        return (f"{where}: the gradients are right, but stage {rank} ({role(rank, n)}, rank {rank}) received "
                f"into a buffer {misplaced[0]}")
    sends = [e for e in log if e["op"] == "send"]
    if not sends:
        return ""
    return (f"{where}: stage {rank} ({role(rank, n)}, rank {rank}) sent {len(sends)} tensor(s) with a blocking "
            f"dist.send (the first to rank {sends[0]['peer']}): the gradients are right here, but a blocking "
            f"send returns only once the peer has posted its recv, so this stage stands still while its "
            f"neighbour is busy (and two stages that send to each other at once wait forever). Send with "
            f"dist.isend and wait() on the handles before returning")


# --- the mistakes that have a name, replayed in one process -----------------------------

def replay(seed, n, m, reverse=False):
    """Every stage's gradients when the last stage runs each micro-batch's backward in
    order and the others apply the gradients they receive in the order given."""
    blocks = stages(seed, n)
    x, y = data(seed)
    xs, ys = x.chunk(m), y.chunk(m)
    ins, outs = [[None] * m for _ in range(n)], [[None] * m for _ in range(n)]
    for k in range(m):
        a = xs[k]
        for s in range(n):
            ins[s][k] = a if s == 0 else a.detach().requires_grad_()
            a = outs[s][k] = blocks[s](ins[s][k])
    messages = []
    for k in range(m):
        (F.cross_entropy(outs[n - 1][k], ys[k]) / m).backward()
        messages.append(ins[n - 1][k].grad)
    for s in range(n - 2, -1, -1):
        order = list(range(m))[::-1] if reverse else list(range(m))
        new = []
        for j, k in enumerate(order):
            outs[s][k].backward(messages[j])
            new.append(ins[s][k].grad)
        messages = new
    return [[p.grad.clone() for p in b.parameters()] for b in blocks]


def close(a, b, scale):
    return all(g is not None and g.shape == w.shape and torch.allclose(g, w, rtol=RTOL, atol=ATOL * scale)
               for g, w in zip(a, b))


# --- judging -----------------------------------------------------------------------------

def done_at(log, i):
    """Where a receive had arrived: a blocking recv when it returned, an irecv at its wait."""
    if log[i]["op"] == "recv":
        return i
    waits = [j for j, e in enumerate(log) if e["op"] == "wait" and e.get("of") == i]
    return waits[0] if waits else len(log)


def structure(where, rank, n, m, log, device):
    """The learner's sentence if this stage's transfers are not a pipeline, else ''."""
    what = f"stage {rank} ({role(rank, n)}, rank {rank})"
    # a barrier is harmless; any other collective is not what a pipeline does
    others = sorted({e["op"] for e in log if e["op"] not in P2P + ("wait", "matmul", "barrier")})
    if others:
        return (f"{where}: {what} called {others}: a pipeline passes each micro-batch's activations and "
                f"gradients point to point between neighbouring stages (dist.recv, dist.isend), no collective")
    wrong_device = harness.on_device([e for e in log if e["op"] in P2P], device)
    if wrong_device:
        return f"{where}: {what}: {wrong_device}"
    index = [(i, e) for i, e in enumerate(log) if e["op"] in P2P]
    fwd_sends = [i for i, e in index if e["op"] in ("send", "isend") and e["peer"] == rank + 1]
    bwd_sends = [i for i, e in index if e["op"] in ("send", "isend") and e["peer"] == rank - 1]
    fwd_recvs = [i for i, e in index if e["op"] in ("recv", "irecv") and e["peer"] == rank - 1]
    bwd_recvs = [i for i, e in index if e["op"] in ("recv", "irecv") and e["peer"] == rank + 1]
    first, last = rank == 0, rank == n - 1
    counts = (len(fwd_recvs), len(fwd_sends), len(bwd_recvs), len(bwd_sends))
    wanted = (0 if first else m, 0 if last else m, 0 if last else m, 0 if first else m)
    if counts != wanted:
        return (f"{where}: {what} received {counts[0]} activation(s) from rank {rank - 1} and sent {counts[1]} "
                f"on to rank {rank + 1}, received {counts[2]} gradient(s) from rank {rank + 1} and sent "
                f"{counts[3]} back to rank {rank - 1}; for {m} micro-batches {role(rank, n)} "
                f"{'receives nothing forward' if first else f'receives {m} activations'}, "
                f"{'computes the loss' if last else f'sends {m} on'}, "
                f"{'gets no gradient' if last else f'receives {m} gradients'} and "
                f"{'sends none back' if first else f'sends {m} back'}: one tensor of activation_shape per "
                f"micro-batch each way")
    if m < 2:
        return ""
    matmuls = [i for i, e in enumerate(log) if e["op"] == "matmul"]
    if not last:
        if not any(fwd_sends[0] < i < fwd_sends[-1] for i in matmuls):
            return (f"{where}: {what} computed the forward of every micro-batch before it sent the first on "
                    f"to rank {rank + 1}: the gradients are right, but rank {rank + 1} idles until this stage "
                    f"is done (no overlap). Send each micro-batch's output (dist.isend) as soon as it is "
                    f"computed, then compute the next")
        first_gradient = done_at(log, bwd_recvs[0])
        if sum(1 for i in fwd_sends if i < first_gradient) < 2:
            return (f"{where}: {what} waited for the gradient of micro-batch 1 before it sent micro-batch 2 "
                    f"on: the stages then never work at the same time (one micro-batch at a time is no "
                    f"pipeline). Run the forward of every micro-batch first, sending each, then receive the "
                    f"gradients (the GPipe schedule)")
    if not first:
        arrived = [done_at(log, i) for i in fwd_recvs]
        if not any(arrived[0] < i < arrived[-1] for i in matmuls):
            return (f"{where}: {what} received all {m} micro-batches before computing on the first: the "
                    f"gradients are right, but the stages never work at the same time (this stage idles "
                    f"until rank {rank - 1} has sent everything). Receive one micro-batch and compute on it "
                    f"before receiving the next")
    return ""


def values(where, rank, n, m, run, seed, ranks):
    """The learner's sentence if this stage's gradients differ from the whole model's."""
    what = f"stage {rank} ({role(rank, n)}, rank {rank})"
    got, want = run["grads"], run["wanted"]
    if any(g is None for g in got):
        how = ("the last stage calls backward() on each micro-batch's loss" if rank == n - 1 else
               "every stage but the last calls output.backward(grad) with the gradient received from "
               f"rank {rank + 1}, for every micro-batch")
        return f"{where}: after pipeline_step {what}'s parameters have no gradient: {how}"
    scale = max(w.abs().max().item() for w in want)
    if close(got, want, scale):
        return ""
    differs = harness.difference(want, got, rtol=RTOL, atol=ATOL * scale, what=f"{what}'s gradients")
    if close(got, [w * m for w in want], scale * m):
        why = (f" They are {m}x too large: you did not divide each micro-batch's loss by the number of "
               f"micro-batches ({m}); the sum of the scaled losses is the batch's mean loss.")
    elif rank < n - 1 and close(got, [w / m for w in want], scale / m):
        why = (f" They are 1/{m} of them: the gradients were divided by the number of micro-batches twice. "
               f"Dividing each micro-batch's loss by {m} on the last stage already scales every gradient "
               f"behind it, the ones sent back included; do not scale them again.")
    elif n > 1 and close(got, replay(seed, n, m, reverse=True)[rank], scale):
        why = (" They are what you get when micro-batch k's output is backpropagated with another "
               "micro-batch's gradient: the gradients arrive in the order the next stage sent them; "
               "backpropagate them in that same order (keep the outputs in a list, go through it from "
               "the first).")
    else:
        narrow = sorted({(r, e["op"], e["dtype"]) for r, other in enumerate(ranks)
                         for e in other["runs"][m]["log"] if e["op"] in ("send", "isend")
                         and e.get("dtype") not in (None, "float32")})
        if narrow:
            r, op, dtype = narrow[0]
            why = (f" Stage {r} sent {dtype} tensors (dist.{op}): {dtype} keeps {8 if dtype == 'bfloat16' else 11} "
                   f"bits of mantissa, so every value that crosses the link is rounded and the gradients "
                   f"no longer equal the whole model's. Send the float32 tensors as they are.")
        else:
            why = (f" Check that each micro-batch's loss is F.cross_entropy (stable for logits of any size) "
                   f"divided by their number ({m}), that every output is backpropagated with the gradient "
                   f"of its own micro-batch, and that each stage sends back the gradient of the input it "
                   f"received (x.grad), not of its parameters.")
    return f"{where}: {differs}; expected: the whole model's, in one process, on the whole batch {harness.replay(seed)}.{why}"


def returned(where, rank, n, run, seed):
    what = f"stage {rank} ({role(rank, n)}, rank {rank})"
    got, want = run["returned"], run["loss"]
    if rank < n - 1:
        if got is not None:
            shown = got["described"] if isinstance(got, dict) else repr(got)
            return f"{where}: {what} returned {shown}: return None there (the loss lives on the last stage)"
        return ""
    if isinstance(got, dict) and got["tensor"]:
        return (f"{where}: {what} returned {got['described']}, not a Python float: return a Python float "
                f"(loss.item()), which also lets go of the autograd graph")
    if isinstance(got, dict):
        return (f"{where}: {what} returned {got['described']}: return the sum of the micro-batches' scaled "
                f"losses, one Python float (the whole batch's mean loss)")
    differs = harness.difference(want, got, rtol=1e-5, atol=0, what=f"{what}'s returned loss")
    if differs:
        return (f"{where}: {differs} (the mean cross-entropy of the whole model over the whole batch) "
                f"{harness.replay(seed)}: return the sum of the micro-batches' scaled losses, as a float")
    return ""


def merged(got, expected):
    """The learner's runs of each rank, with where the rank ran and the whole model's loss
    and gradients from the reference's run (never from the learner's data)."""
    ranks = []
    for g, e in zip(harness.same_ranks(got, expected), expected):
        runs = g["runs"]
        ranks.append({"device": e["device"], "runs": {m: {**runs[m], **e["runs"][m]} for m in MICRO_COUNTS}})
    return ranks


def judge_layout(layout, ranks, seed):
    n = len(ranks)
    for m in MICRO_COUNTS:
        where = f"on {layout} ({n} stage{'s' if n > 1 else ''}, one per rank), {m} micro-batches"
        for check in ("structure", "values", "returned", "blocking"):
            for rank, r in enumerate(ranks):
                run = r["runs"][m]
                if check == "structure":
                    message = structure(where, rank, n, m, run["log"], r["device"])
                elif check == "values":
                    message = values(where, rank, n, m, run, seed, ranks)
                elif check == "returned":
                    message = returned(where, rank, n, run, seed)
                else:  # last: its message says the gradients are right
                    message = blocking(where, rank, n, run["log"])
                if message:
                    raise harness.ExerciseFailure(message)


# 4 layouts, up to 4 processes each: with spawn (macOS, Windows) the check takes over a
# minute on a loaded 2-core machine, near pytest.ini's 120 s (docs/exercises.md)
@pytest.mark.timeout(300)
def test_every_stage_matches_the_whole_model_in_every_layout():
    harness.judge_here(sys.modules[__name__], PARTS, harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.MULTI_FIRST)


def collect(part, whos, seed):
    """``{who: [what each rank gave]}`` in the layout ``part`` names."""
    harness.preload_for("09", whos)
    layout = harness.MULTI_FIRST[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong."""
    judge_layout(part, merged(got, expected), seed)
