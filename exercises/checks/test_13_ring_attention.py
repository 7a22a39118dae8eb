"""Checks for exercise 13: the learner's ring attention and the reference solution's, run
side by side on the same seeded random blocks in every layout (1 process with no process
group, 2 and 3 processes, 2 nodes x 2 processes), compared row by row; the inputs have
attention scores of large magnitude and both signs (rows whose every score is near
-200). The structure is checked from a record of the answer's ``torch.distributed`` calls
and matrix products: blocks travel point to point round the ring, the next block is in
flight while the current one is computed on, and no rank holds more received blocks than
the one it computes with plus the one arriving. When the rows are wrong, the check replays
plausible mistakes in one process to say which one was made.

In two halves (harness.py, "a check in two halves"): the ranks collect each answer's rows,
its record and the tensors it made with no device, as plain data; the judge rebuilds the
inputs and replays the mistakes from the seed, and takes the right rows from the
reference's data."""
import math
import sys

import pytest
import torch
import torch.nn.functional as F

import harness

pytestmark = pytest.mark.ex13

# 4 layouts, up to 4 processes each: started with spawn (macOS, Windows) on a busy 2-core
# machine 3 processes took up to 124 s, past pytest.ini's 120 s
TIMEOUT_S = 300

BATCH, HEADS, BLOCK, HEAD_DIM = 2, 2, 5, 8
# The learner's rows against the reference's: the same sums in another order differ by
# about 1e-6 relative, and up to 2e-5 absolute where scores of magnitude 200 carry float32
# rounding into exp (values are about 1: one key of weight 1e-4 dropped is outside).
RTOL, ATOL = 1e-4, 1e-4
# How many received key and value blocks a rank may hold while it computes: the pair it
# computes with and the pair arriving.
HELD = 4


def qkv(seed, n):
    """Queries, keys and values of the whole sequence (n blocks of BLOCK tokens). Head 0:
    scores of magnitude about 100 of both signs; head 1: every score of a row near -200
    (a running maximum started at 0 underflows there); values not exact in bfloat16."""
    g = torch.Generator().manual_seed(seed)
    seq = n * BLOCK
    q, k, v = (torch.randn(BATCH, HEADS, seq, HEAD_DIM, generator=g) for _ in range(3))
    q[:, 0], k[:, 0] = q[:, 0] * 10, k[:, 0] * 10
    u = F.normalize(torch.randn(BATCH, 1, HEAD_DIM, generator=g), dim=-1)
    a = math.sqrt(200 * math.sqrt(HEAD_DIM))  # q . k / sqrt(d) = -200 along u
    q[:, 1] = a * u + 0.1 * q[:, 1]
    k[:, 1] = -a * u + 0.1 * k[:, 1]
    return q, k, v


def block(t, rank):
    return t[..., rank * BLOCK:(rank + 1) * BLOCK, :]


class RingRecorder(harness.Recorder):
    """The harness's record, which also stops a transfer to or from a rank that does not
    exist before gloo gets it. gloo connects to a peer the first time it is used, by
    waiting in the run's store for that rank's address: for a rank that does not exist,
    until the timeout, or until the store closes when rank 0 (which serves it) ends. That
    rank then ended in whichever C++ error came first (a lost connection, or an abort of
    the whole process under load), never in one that names the peer."""

    def __init__(self, rank, n):
        super().__init__(compute=True)
        self.rank, self.n = rank, n

    def _note(self, name, args, kwargs):
        super()._note(name, args, kwargs)
        peer = self.log[-1]["peer"]
        if name in ("send", "recv", "isend", "irecv") and isinstance(peer, int) and not 0 <= peer < self.n:
            towards = "to" if name in ("send", "isend") else "from"
            raise harness.ExerciseFailure(
                f"rank {self.rank} called dist.{name} {towards} rank {peer}, but the ranks are 0 to {self.n - 1}: "
                f"a neighbour on the ring is (rank + 1) % N or (rank - 1) % N, taken % N "
                f"(N = idist.get_world_size()) so that the last rank's next is rank 0 and rank 0's "
                f"previous is the last")


def on_rank(seed, whos):
    """What each answer in ``whos`` gives this rank on its seeded blocks: its rows, its
    ``torch.distributed`` calls and matrix products, and the tensors it made with no device."""
    import ignite.distributed as idist

    rank, n = idist.get_rank(), idist.get_world_size()
    q, k, v = qkv(seed, n)
    mine, found = [block(t, rank).clone() for t in (q, k, v)], {}
    # the reference first: an answer that leaves a transfer unmatched cannot spoil its run
    for who in sorted(whos, key=lambda w: w != harness.REFERENCE):
        ex = harness.answer("13", who)
        with torch.no_grad(), harness.DeviceStandIn() as placement, RingRecorder(rank, n) as record:
            out = ex.ring_attention(*[t.clone() for t in mine])
        found[who] = {"out": harness.plain(out), "log": record.data(copies=False),
                      "unplaced": placement.without_device()}
    return found


# --- the mistakes, replayed in one process ----------------------------------------------

def replay(q, k, v, n, scale=True, rescale=True, diagonal_mask=True, skip_later=True, mask_earlier=False,
           backwards=False, normalise=True, max_from_zero=False, mask_diagonal_too=False, stale=False,
           keep_m=False):
    """Every rank's rows of a ring attention with the given choices; the defaults are right."""
    outs = []
    for rank in range(n):
        qr = block(q, rank)
        m = torch.full(qr.shape[:-1], 0.0 if max_from_zero else float("-inf"))
        l, acc = torch.zeros(qr.shape[:-1]), torch.zeros_like(qr)
        for step in range(n):
            held = rank if stale else (rank + step) % n if backwards else (rank - step) % n  # whose block arrived
            source = (rank - step) % n  # whose block the code believes it is
            if source > rank and skip_later:
                continue
            s = qr @ block(k, held).transpose(-2, -1)
            if scale:
                s = s / math.sqrt(HEAD_DIM)
            if (source == rank and diagonal_mask) or (source < rank and mask_earlier):
                s = s.masked_fill(torch.ones(BLOCK, BLOCK, dtype=torch.bool).triu(0 if mask_diagonal_too else 1),
                                  float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            r = torch.exp(m - m_new) if rescale else torch.ones_like(m)
            l, acc, m = l * r + p.sum(-1), acc * r[..., None] + p @ block(v, held), m if keep_m else m_new
        outs.append(acc / l[..., None] if normalise else acc)
    return outs


MISTAKES = [
    (dict(backwards=True),
     "the blocks went round the ring the wrong way: you sent to rank r - 1 and received from rank r + 1, so "
     "at step s you held rank (r + s)'s keys while treating them as rank (r - s)'s. Send to (rank + 1) % N "
     "and receive from (rank - 1) % N"),
    (dict(scale=False),
     "the scores were not scaled: divide q @ k.T by sqrt(head_dim) (here sqrt({d}))"),
    (dict(rescale=False),
     "the online softmax forgot to rescale: when a new block raises a row's maximum from m to m_new, what "
     "l and acc summed so far was relative to the old m; multiply both by exp(m - m_new) before adding "
     "the new block's terms"),
    (dict(diagonal_mask=False),
     "the diagonal block (this rank's own keys) was not masked: there a query at position i may see keys "
     "0..i of the block only. Apply causal_mask(block size) to the scores when the block is this rank's own"),
    (dict(skip_later=False),
     "the blocks of later ranks were attended to: their keys all come after every query of this rank, so "
     "causal attention skips them (source rank > this rank)"),
    (dict(mask_earlier=True),
     "the causal mask was applied to blocks of earlier ranks too: their keys all come before every query "
     "of this rank, so those blocks are seen whole; only the diagonal block (this rank's own) is masked"),
    (dict(normalise=False),
     "the result was not normalised: return acc / l (l is the softmax's denominator, summed with the "
     "same rescaling as acc)"),
    (dict(max_from_zero=True),
     "the running maximum started at 0, not -inf: in rows whose every score is far below 0 (about -200 in "
     "head 1 here) exp(score - 0) underflows to 0, and acc / l is 0 / 0 or loses its digits. Start m at "
     "-inf: the first block's own maximum then becomes the reference"),
    (dict(stale=True),
     "every step computed with this rank's OWN keys and values: the blocks received were never used. After "
     "waiting for a step's transfers, the received blocks become the ones held for the next step"),
    (dict(keep_m=True),
     "the running maximum m was never updated after a block: each block's terms were then rescaled by "
     "exp(m - m_new) against the first m, which throws away what earlier blocks summed. After adding a "
     "block, m becomes m_new"),
    (dict(mask_diagonal_too=True),
     "the mask keeps out the diagonal itself: a query must see its own key (mask keys AFTER the query, "
     "causal_mask, not keys at or after it); the first query of the sequence then had every score masked "
     "and its row is NaN (exp(-inf - (-inf)))"),
]


def same(a, b):
    """Equal rows, NaN where the other has NaN (and the same dtype)."""
    return (isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))


def structure(layout, rank, n, log):
    """The learner's message if this rank's calls are not a ring that overlaps, else ''."""
    calls = [c for c in log if c["op"] not in ("wait", "matmul")]
    gathered = sorted({c["op"] for c in calls if c["op"] not in ("send", "recv", "isend", "irecv")})
    where = f"on {layout}, rank {rank}"
    if gathered:
        if any(op.startswith("all_gather") for op in gathered):
            return (f"{where} used {gathered}: that puts the keys and values of the whole sequence on every rank, "
                    f"what context parallelism avoids. Pass one block at a time round the ring, point to point "
                    f"(dist.batch_isend_irecv with P2POp(dist.isend, ...) and P2POp(dist.irecv, ...))")
        return (f"{where} used the collective(s) {gathered}, {len(calls)} call(s) of torch.distributed: a collective "
                f"makes every rank wait for all the others at each block, and sends each block to every rank, later "
                f"ones too. A ring passes one block at a time, point to point, to the next rank only "
                f"(dist.batch_isend_irecv with P2POp(dist.isend, ...) and P2POp(dist.irecv, ...)), while computing")
    wrong_device = harness.on_device(calls, "cpu")
    if wrong_device:
        return f"{where}: {wrong_device}"
    if n == 1:
        return "" if not calls else (f"{where} sent or received {len(calls)} block(s) with no other rank in the "
                                     f"ring: with one process, skip the transfers")
    sends = [c for c in calls if c["op"] in ("send", "isend")]
    recvs = [c for c in calls if c["op"] in ("recv", "irecv")]
    if not sends and not recvs:
        return (f"{where} sent or received nothing: its queries need the keys and values of the ranks before it. "
                f"At each step but the last, send the block held to (rank + 1) % N and receive the next from "
                f"(rank - 1) % N")
    if not sends or not recvs:
        did, didnt = ("received", "sent") if recvs else ("sent", "received")
        return (f"{where} {did} {len(recvs or sends)} block(s) but {didnt} none: in a ring EVERY rank, at each step "
                f"but the last, sends the block it holds to (rank + 1) % N and receives the next from (rank - 1) % N, "
                f"relaying blocks its own queries may not need (the first rank needs none but its own, the last "
                f"rank's is needed by none)")
    odd = [(c["op"], c["peer"]) for c in sends if c["peer"] != (rank + 1) % n] + \
          [(c["op"], c["peer"]) for c in recvs if c["peer"] != (rank - 1) % n]
    # a ring turned the other way round is left for the rows to name (a replayed mistake)
    backwards = all(c["peer"] == (rank - 1) % n for c in sends) and all(c["peer"] == (rank + 1) % n for c in recvs)
    if odd and not backwards:
        return (f"{where} exchanged blocks with other ranks than its ring neighbours ({odd[:4]}): in a ring, rank "
                f"r sends only to (r + 1) % N = {(rank + 1) % n} and receives only from (r - 1) % N = "
                f"{(rank - 1) % n}; each block reaches every rank in N - 1 steps, and no rank collects them")
    shapes = {tuple(c["shapes"][0]) for c in sends + recvs}
    want = 2 * (n - 1)
    if len(sends) != want or len(recvs) != want or shapes != {(BATCH, HEADS, BLOCK, HEAD_DIM)}:
        return (f"{where} sent {len(sends)} and received {len(recvs)} tensor(s) of shapes {sorted(shapes)}: a ring "
                f"of {n} passes each rank's keys and values on {n - 1} time(s), one block "
                f"{(BATCH, HEADS, BLOCK, HEAD_DIM)} each, {want} sends and {want} receives per rank")
    # in flight: from a receive's post to its wait; a block computed on meanwhile overlaps
    waits = {c["of"]: i for i, c in enumerate(log) if c["op"] == "wait" and "of" in c}
    if not any(c["op"] == "matmul" for c in log):
        return (f"{where} made no matrix product at all: the scores of its queries against a block's keys "
                f"(q @ k.T) and their weights times the block's values are what each step computes, on the "
                f"blocks of this rank and of the ranks before it")
    unwaited = [i for i, c in enumerate(log) if c["op"] == "irecv" and i not in waits]
    if unwaited:
        return (f"{where} never waited for {len(unwaited)} of its {len(recvs)} receive(s): a transfer that "
                f"dist.batch_isend_irecv posted has arrived only once its request's wait() returned; until "
                f"then the buffer may still be empty (on a GPU it usually is). Wait for every request "
                f"before using the blocks received")
    windows = [(i, waits.get(i, i)) for i, c in enumerate(log) if c["op"] == "irecv"]
    overlapped = {k for k, (start, end) in enumerate(windows)
                  if any(c["op"] == "matmul" for c in log[start:end])}
    # rank r computes on the blocks of ranks r, r-1, ..., 0 at steps 0..r; the receives of
    # steps 0..min(r, n-2) (two each: keys and values) can arrive meanwhile
    need = 2 * min(rank + 1, n - 1)
    if len(overlapped) < need:
        return (f"{where} computed on a block while the next one was in flight {len(overlapped) // 2} time(s) of "
                f"{need // 2}: it waited for a block (or received it with a blocking recv) before computing on "
                f"the one it held. Post the transfer of the next block (dist.batch_isend_irecv), compute on the "
                f"current block, then wait: the transfer hides behind the compute")
    held = max((c.get("received_alive", 0) for c in log if c["op"] == "matmul"), default=0)
    if held > HELD:
        return (f"{where} held {held // 2} received key/value blocks at once while computing: a ring keeps "
                f"only the block it computes with and the one arriving (and merges each block into the "
                f"running m, l and acc, then lets it go); collecting the blocks to do one softmax at the end "
                f"holds the whole sequence, what context parallelism avoids")
    return ""


def unplaced(where, ranks):
    """Judged once the rows are right: a tensor made with no device, which only a GPU shows."""
    for rank, r in enumerate(ranks):
        if r["unplaced"]:
            func, line = r["unplaced"][0]
            raise harness.ExerciseFailure(
                f"{where}, rank {rank}: the rows are right, but ring_attention made a tensor with {func} on "
                f"line {line} of your file with no device: that is the CPU on every machine, so it works "
                f"here, but on a GPU it stays on the CPU while q, k and v are on the GPU, and the first "
                f"operation that combines them fails. Make it on q.device")


def judge_layout(layout, ranks, seed):
    n = len(ranks)
    where = f"on {layout}"
    for rank, r in enumerate(ranks):
        message = structure(layout, rank, n, r["log"])
        if message:
            raise harness.ExerciseFailure(message)
        if not isinstance(r["out"], torch.Tensor) or tuple(r["out"].shape) != (BATCH, HEADS, BLOCK, HEAD_DIM):
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} returned {harness.describe(r['out'])}: return this rank's rows of the "
                f"attention, a tensor shaped like q, {(BATCH, HEADS, BLOCK, HEAD_DIM)}")
    for rank, r in enumerate(ranks):
        if r["out"].dtype != r["expected"].dtype:
            raise harness.ExerciseFailure(
                f"{where}, rank {rank} returned {harness.describe(r['out'])}: its rows should be "
                f"{harness.describe(r['expected'])}, the dtype of q, k and v")
    wrong = [rank for rank, r in enumerate(ranks) if not same(r["out"], r["expected"])]
    if not wrong:
        return unplaced(where, ranks)
    q, k, v = qkv(seed, n)
    for change, message in MISTAKES:
        replayed = replay(q, k, v, n, **change)
        if all(same(r["out"], replayed[rank]) for rank, r in enumerate(ranks)):
            raise harness.ExerciseFailure(
                f"{where}, ranks {wrong} returned other rows than the reference: " + message.format(d=HEAD_DIM))
    rank = wrong[0]
    differs = harness.difference(ranks[rank]["expected"], ranks[rank]["out"], RTOL, ATOL, what="its rows")
    raise harness.ExerciseFailure(
        f"{where}, rank {rank}: {differs} (the reference solution's rows, = full causal attention) "
        f"{harness.replay(seed)}. Check, step by step: the block held at step s is rank (r - s) % N's; later "
        f"ranks' blocks are skipped, the diagonal block masked with causal_mask, earlier ones seen whole; scores "
        f"divided by sqrt(head_dim); m started at -inf; l and acc rescaled by exp(m - m_new) before adding a "
        f"block; acc / l returned")


@pytest.mark.timeout(TIMEOUT_S)
def test_ring_attention_equals_the_reference_in_every_layout():
    harness.judge_here(sys.modules[__name__], PARTS, harness.check_seed())


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

PARTS = tuple(layout[0] for layout in harness.MULTI_FIRST)


def collect(part, whos, seed):
    """``{who: [what each rank's answer gave]}`` in the layout ``part`` names."""
    harness.preload_for("13", whos)
    layout = harness.MULTI_FIRST[PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, seed, whos, layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong: the
    learner's rows, calls and tensors made, against the reference's rows (nothing else of
    the reference's data, and no field of the learner's that says how to judge it)."""
    ranks = [{"out": g["out"], "log": g["log"], "unplaced": g["unplaced"], "expected": e["out"]}
             for g, e in zip(harness.same_ranks(got, expected), expected)]
    judge_layout(part, ranks, seed)
