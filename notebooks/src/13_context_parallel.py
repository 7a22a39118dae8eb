# %% [markdown]
# # 13 · Context parallel: ring attention (CPU, gloo)
#
# Tensor and sequence parallel (notebook 12) still run the attention of every head
# over **all T tokens** on every rank, and its activations grow with T. For long
# sequences, **context parallel** splits the sequence itself over N ranks for every
# layer: a rank keeps the queries, keys and values of its own T/N tokens. Everything but
# the attention works token by token and needs nothing from the other ranks. The
# attention needs every earlier token's key and value, and gets them through a **ring**
# (Liu et al. 2023, *Ring Attention*):
#
# - in N steps, each rank attends its queries to one block of keys and values, while it
#   sends that block to the next rank and receives the next block from the previous
#   one (point-to-point `isend` / `irecv`, started before the compute so they overlap);
# - the partial results are merged with an **online softmax** (the trick of
#   FlashAttention): a running maximum and a running sum per query, so the whole row
#   of scores never exists on any rank.
#
# This notebook writes both in its cells, runs them on 4 gloo ranks, checks the result
# against full causal attention on one process, measures the **causal load imbalance**
# of splitting the sequence in N contiguous pieces, and removes it with the
# **zig-zag** split.
#
# Hardware: any CPU. Backend: `gloo`. Work is measured by torch's `FlopCounterMode`
# (exact counts); each rank's CPU time is printed beside them.

# %%
import math
import os
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from distkit.lessons.sharded import CommCounter, format_table
from distkit.lessons.transformer import causal_work
from distkit.runner import run_per_rank

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"torch {torch.__version__}, {cores} CPU cores")

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 512, 32
N = 4  # ranks the sequence is split over


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, generator=g) for _ in range(3)]


q, k, v = qkv()
reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # one process, the whole sequence

# %% [markdown]
# ## 1. The online softmax, on one process
#
# Attention of one query row is `softmax(s) @ V` with scores `s = q · kᵀ / √d`. Cut the
# keys into blocks; after each block keep, per row, the largest score so far `m`, the
# sum of `exp(s − m)` so far `l`, and the weighted sum of values so far `acc`. A new
# block with a larger maximum **rescales** what was kept by `exp(m_old − m_new)`; at the
# end `acc / l` is the softmax-weighted sum. `attend` is one such step; a causal mask is
# applied where a key comes after a query, and a block whose keys all come after every
# query is skipped: that is where causal attention saves work.

# %%
def attend(state, q, k, v, q_pos, k_pos):
    """Merge the block (k, v) at positions k_pos into state = [m, l, acc] of the queries
    q at positions q_pos. Returns the multiply-adds' work done (0 if skipped)."""
    if k_pos[0] > q_pos[-1]:
        return 0  # every key after every query: all masked, nothing to do
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if k_pos[-1] > q_pos[0]:  # some keys after some queries: the causal mask
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    m, l, acc = state
    m_new = torch.maximum(m, s.amax(dim=-1))
    p = torch.exp(s - m_new[..., None])
    rescale = torch.exp(m - m_new)  # what was summed so far was relative to the old maximum
    state[:] = [m_new, l * rescale + p.sum(dim=-1), acc * rescale[..., None] + p @ v]
    return s.shape[-2] * s.shape[-1]


def new_state(q):
    rows = q.shape[:-1]
    # on q's device: the same code then runs where q lives (a GPU's tensors included)
    return [torch.full(rows, float("-inf"), device=q.device), torch.zeros(rows, device=q.device),
            torch.zeros_like(q)]


positions = torch.arange(SEQ)
state = new_state(q)
for block in positions.split(SEQ // 8):  # the keys in 8 blocks, one after another
    attend(state, q, k[..., block, :], v[..., block, :], positions, block)
m, l, acc = state
blockwise = acc / l[..., None]
print(f"max |blockwise − full causal attention| = {(blockwise - reference).abs().max():.1e}")
assert torch.allclose(blockwise, reference, atol=1e-5, rtol=0)

# %% [markdown]
# Equal to `F.scaled_dot_product_attention(..., is_causal=True)` to within 1e-5
# (asserted): only float32 rounding differs.
#
# ## 2. Ring attention on N ranks
#
# Each rank holds the queries, keys and values of some positions, given as a list of
# **chunks** (ranges of positions): one chunk per rank for the plain split. At step
# `s`, rank `r` holds the key/value block that started on rank `r − s` (mod N); before
# computing on it, it posts the exchange with `dist.batch_isend_irecv`: send this block
# to `r + 1`, receive the next one from `r − 1`. Then it computes, then waits for the
# exchange. After N steps every query has met every key block once.
#
# `dist.P2POp(dist.isend, tensor, peer)` describes one send, `dist.P2POp(dist.irecv,
# buffer, peer)` one receive; `batch_isend_irecv` starts them all and returns requests
# to `wait()` on. On gloo these are plain point-to-point transfers; on GPUs NCCL runs
# them beside the compute.
#
# `ring_attention` also returns the score entries it computed and the CPU time it spent
# computing (`time.thread_time()`: this thread's CPU time, so the waits for the
# exchange do not count).

# %%
def plain_chunks(rank, n, seq):
    size = seq // n
    return [torch.arange(rank * size, (rank + 1) * size)]


def ring_attention(q, k, v, chunks_of):
    """This rank's causal attention output. q, k, v: this rank's positions (its chunks,
    concatenated); chunks_of(rank) gives any rank's chunks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = chunks_of(rank)
    queries = q.split([len(c) for c in mine], dim=-2)
    states = [new_state(qc) for qc in queries]
    work = busy = 0
    for step in range(n):
        if step < n - 1:  # start passing this block on while we compute with it
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % n), dist.P2POp(dist.isend, v, (rank + 1) % n),
                dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)])
        theirs = chunks_of((rank - step) % n)  # whose block this is: where its positions are
        sizes = [len(c) for c in theirs]
        start = time.thread_time()
        for qc, q_pos, state in zip(queries, mine, states):
            for kc, vc, k_pos in zip(k.split(sizes, dim=-2), v.split(sizes, dim=-2), theirs):
                work += attend(state, qc, kc, vc, q_pos, k_pos)
        busy += time.thread_time() - start
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    return torch.cat([acc / l[..., None] for m, l, acc in states], dim=-2), work, busy


# %% [markdown]
# Every rank runs the ring on its own positions: with the plain split, and (section 4)
# with the zig-zag one. `FlopCounterMode` counts the floating-point operations of the
# matrix products each rank ran, `CommCounter` the tensors it sent and received; then
# three more runs without them give the CPU seconds. `run_per_rank` starts the 4 processes with
# `idist.Parallel(backend="gloo", nproc_per_node=4)`.

# %%
def zigzag_chunks(rank, n, seq):
    size = seq // (2 * n)  # 2N chunks: rank r keeps chunk r and chunk 2N − 1 − r
    return [torch.arange(rank * size, (rank + 1) * size),
            torch.arange((2 * n - 1 - rank) * size, (2 * n - rank) * size)]


SPLITS = {"plain": plain_chunks, "zig-zag": zigzag_chunks}
REPEATS = 3


def context_parallel(local_rank):
    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = qkv()
    out = {}
    for name, split in SPLITS.items():
        chunks_of = lambda r: split(r, n, SEQ)  # noqa: E731
        mine = torch.cat(chunks_of(rank))  # the positions this rank holds
        with FlopCounterMode(display=False) as flops, CommCounter() as moved:
            y, work, _ = ring_attention(q[..., mine, :], k[..., mine, :], v[..., mine, :], chunks_of)
        seconds = []  # timed without the counters, which add Python work to every operation
        for repeat in range(REPEATS):
            seconds.append(ring_attention(q[..., mine, :], k[..., mine, :], v[..., mine, :], chunks_of)[2])
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., mine, :]
        out[name] = {"max_diff": (y - full).abs().max().item(), "work": work, "flops": flops.get_total_flops(),
                     "cpu_s": statistics.median(seconds), "calls": moved.calls, "payload": moved.payload,
                     "positions": mine.tolist()}
    return out


ranks = run_per_rank(context_parallel, N, "gloo")
for name in SPLITS:
    for rank, r in enumerate(ranks):
        print(f"{name:8} rank {rank}: max |ring − full| = {r[name]['max_diff']:.1e}, "
              f"sent {r[name]['calls']} tensors, {r[name]['payload']['send'] // 1024} KiB")
        assert r[name]["max_diff"] <= 1e-5

# %% [markdown]
# Both splits give every rank the rows of full causal attention for its positions, to
# within 1e-5 (asserted on all 4 ranks; printed: the measured difference). Each rank
# sent N − 1 = 3 key blocks and 3 value blocks, and received as many.
#
# **Communication against compute.** One block of keys and values is
# 2 × B·H·(T/N)·d × 4 bytes; a rank sends (N − 1) of them per layer and pass. Its
# compute on one block is ∝ B·H·(T/N)²·d: per byte sent, the compute grows with T/N,
# so for long sequences the transfer hides behind the compute.

# %%
block_bytes = 2 * BATCH * HEADS * (SEQ // N) * HEAD_DIM * 4
for r in ranks:
    for name in SPLITS:
        assert r[name]["calls"] == {"send": 2 * (N - 1), "recv": 2 * (N - 1)}
        assert r[name]["payload"] == {"send": (N - 1) * block_bytes, "recv": (N - 1) * block_bytes}
print(f"one key/value block: {block_bytes // 1024} KiB; each rank sends {(N - 1) * block_bytes // 1024} KiB "
      f"per layer and pass, and holds {2 * block_bytes // 1024} KiB of keys and values at a time "
      f"(its own block and the one arriving), against {N * block_bytes // 1024} KiB for the whole sequence")

# %% [markdown]
# ## 3. The causal load imbalance of the plain split
#
# Under a causal mask, query position i attends keys 0 … i. With contiguous pieces,
# rank 0's queries come first and see only their own block (half of it, under the
# mask); rank N − 1's see every block. Rank r computes r + 1 blocks: rank 0 is idle most
# of the ring while the last rank works, and since every step ends with an exchange,
# the whole ring waits for the busiest rank.

# %%
def work_table(name):
    rows = []
    for rank, r in enumerate(ranks):
        rows.append({"split": name, "rank": rank, "positions": f"{len(r[name]['positions'])} tokens",
                     "score entries computed": r[name]["work"] * BATCH * HEADS,
                     "GFLOP (FlopCounterMode)": f"{r[name]['flops'] / 1e9:.3f}",
                     "CPU ms": f"{1000 * r[name]['cpu_s']:.1f}"})
    return rows


print(format_table(work_table("plain"), list(work_table("plain")[0])))
block_flops = 2 * 2 * BATCH * HEADS * (SEQ // N) ** 2 * HEAD_DIM  # q·kᵀ and p·v of one block
plain_flops = [r["plain"]["flops"] for r in ranks]
assert plain_flops == [(rank + 1) * block_flops for rank in range(N)]
print(f"busiest / average rank: {max(plain_flops) / statistics.mean(plain_flops):.2f} "
      f"(model: N / ((N + 1) / 2) = {2 * N / (N + 1):.2f})")
assert math.isclose(max(plain_flops) / statistics.mean(plain_flops), 2 * N / (N + 1))

# %% [markdown]
# Measured by `FlopCounterMode` and asserted exactly: rank r runs (r + 1) blocks'
# matrix products, 1 : 2 : 3 : 4 on 4 ranks. The ring lasts as long as its busiest rank,
# so on N ranks it takes N blocks' time where (N + 1)/2 would do if the work were even:
# 1.6× here, nearly 2× for large N. (The diagonal block is computed whole and half of
# it masked; a real kernel skips the masked half, which changes the ratio only a little.)
#
# ## 4. The zig-zag split
#
# Cut the sequence in **2N** chunks and give rank r chunk r and chunk 2N − 1 − r: an
# early and a late piece. Every rank then holds as many early as late positions, and
# every rank's share of the causal triangle is the same. The ring is unchanged: only
# `chunks_of` differs, and `attend` skips the chunk pairs that are fully masked.

# %%
print(format_table(work_table("zig-zag"), list(work_table("zig-zag")[0])))
zig_flops = [r["zig-zag"]["flops"] for r in ranks]
chunk_pairs = 2 * N + 1  # per rank: (r + 1) pairs for chunk r, (2N − r) for chunk 2N − 1 − r
assert zig_flops == [chunk_pairs * 2 * 2 * BATCH * HEADS * (SEQ // (2 * N)) ** 2 * HEAD_DIM] * N
# the useful work (key ≤ query) is the same for every rank too:
useful = [causal_work(r["zig-zag"]["positions"], range(SEQ)) for r in ranks]
assert len(set(useful)) == 1 and sum(useful) == SEQ * (SEQ + 1) // 2
print(f"zig-zag: busiest / average rank = {max(zig_flops) / statistics.mean(zig_flops):.2f}; "
      f"busiest rank: {max(zig_flops) / max(plain_flops):.3f} of the plain split's busiest")

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for ax, name in zip(axes, SPLITS):
    ax.bar(range(N), [r[name]["flops"] / 1e9 for r in ranks], color="tab:blue" if name == "plain" else "tab:green")
    ax.set(title=f"{name} split", xlabel="rank", xticks=range(N), ylabel="GFLOP per rank (FlopCounterMode)")
plt.tight_layout()
plt.show()

cpu = {name: [r[name]["cpu_s"] for r in ranks] for name in SPLITS}
print(f"CPU time of the attention per rank (thread time, median of {REPEATS}): "
      + "; ".join(f"{name}: " + ", ".join(f"{s * 1000:.1f} ms" for s in cpu[name]) for name in SPLITS))
print(f"busiest rank, zig-zag / plain: {max(cpu['zig-zag']) / max(cpu['plain']):.2f} in CPU time, "
      f"{max(zig_flops) / max(plain_flops):.2f} in FLOPs")

# %% [markdown]
# Measured and asserted: with the zig-zag split every rank runs the same FLOPs,
# (2N + 1) chunk pairs of (T/2N)² scores, and holds the same share of the useful
# (key ≤ query) work, so the busiest rank does 9/16 = 0.5625 of the plain split's
# busiest (printed) and no rank waits on another for its compute. The CPU times are
# printed, not asserted: they are thread times, which do not count the time other
# programs run on the cores, but at this toy size each product is small and its fixed cost per call
# weighs against the arithmetic (the zig-zag runs 9 chunk products per rank where the
# plain split runs at most 4, of blocks twice as long), so they follow the FLOPs only
# roughly. The assertions are on the FLOPs, which depend on neither; the balance pays
# off where the blocks are large: long sequences, on GPUs.
#
# What the notebook did not do: the **backward** of ring attention passes the key/value
# blocks around the ring again, with their gradients travelling with them (each rank
# adds its queries' contribution to the block's dK, dV before passing it on). PyTorch
# ships context parallelism for `scaled_dot_product_attention` as
# `torch.distributed.tensor.experimental.context_parallel`; in torch 2.15 its default
# for causal attention is this split (`_HeadTailLoadBalancer`, "head and tail", in
# `torch/distributed/tensor/experimental/_context_parallel/_load_balancer.py`), and it
# rotates the key/value blocks with an all-gather by default (or all-to-all,
# `set_rotate_method`), where this notebook passes them point to point.
